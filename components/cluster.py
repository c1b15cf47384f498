"""KubernetesCluster: where everything else is deployed, as one Kubernetes provider.

Two backends sit behind the same arguments, chosen by `backend`:

* ``kubeconfig``: an existing cluster (a managed service, or the local lab's control plane) reached
  through a kubeconfig. Nothing is created but the provider.
* ``eks``: an Amazon EKS control plane with its IAM roles, built from `pulumi_aws` resources. We use
  the plain AWS resources rather than `pulumi_eks` because the latter is a multi-language component
  whose Node.js plugin must be downloaded at run time, which offline machines (the lab, CI) cannot.

The component also creates autoheal's namespace with that provider. Either way the rest of the
stack only sees `provider` and `namespace`, so components never care which backend they
run on. The provider gets a fixed `cluster_identifier`: moving the lab (a new kubeconfig path or new
certificates) must not make Pulumi replace every object in the cluster.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pulumi
import pulumi_kubernetes as k8s

from components.common import base_labels, child
from components.eks import addons
from components.eks.iam import IamRole, Oidc, oidc_provider, service_role
from components.eks.nodegroups import SystemNodeGroupArgs, system_node_group

Backend = Literal["kubeconfig", "eks"]

_EKS_CLUSTER_POLICIES = ("arn:aws:iam::aws:policy/AmazonEKSClusterPolicy",)
_EKS_NODE_POLICIES = (
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
)


@dataclass(frozen=True)
class EksArgs:
    """An EKS control plane: the subnets (in at least two zones) its nodes and ENIs live in."""

    region: str
    subnet_ids: Sequence[str]
    version: str = "1.31"
    endpoint_public_access: bool = True
    public_access_cidrs: Sequence[str] = ()
    tags: dict[str, str] = field(default_factory=dict)
    system_node_group: SystemNodeGroupArgs = field(default_factory=SystemNodeGroupArgs)
    oidc_thumbprints: Sequence[str] = ()  # none: IAM checks the issuer's certificate itself


@dataclass(frozen=True)
class KubernetesClusterArgs:
    backend: Backend = "kubeconfig"
    # kubeconfig backend: a path to a kubeconfig file (or its YAML text) and an optional context.
    kubeconfig: str | None = None
    context: str | None = None
    eks: EksArgs | None = None
    # Providers delete and recreate immutable ConfigMaps on change by default; ours are edited in
    # place and pod templates carry a config hash instead, so names stay stable for the runbook.
    enable_config_map_mutable: bool = True
    # autoheal's own namespace (runner, pool descriptions, monitoring objects), made with the
    # provider so everything else can depend on it.
    namespace: str = "autoheal"


@dataclass(frozen=True)
class EksCluster:
    """What an EKS-backed GpuNodePool needs from its cluster."""

    cluster_name: pulumi.Output[str]
    node_role_arn: pulumi.Output[str]
    subnet_ids: Sequence[str]
    aws_provider: pulumi.ProviderResource
    region: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    oidc: Oidc | None = None  # the cluster's OIDC provider (IRSA)
    vpc_id: pulumi.Output[str] | None = None
    security_group_id: pulumi.Output[str] | None = None  # the cluster security group (every node's)
    # what a node group waits for: the networking add-ons its nodes need to become Ready
    node_dependencies: Sequence[pulumi.Resource] = ()
    # the system node group (CoreDNS and add-on controllers wait for it)
    system_node_group: pulumi.Resource | None = None


class KubernetesCluster(pulumi.ComponentResource):
    provider: k8s.Provider
    eks: EksCluster | None
    namespace: pulumi.Output[str]

    def __init__(
        self, name: str, args: KubernetesClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("autoheal:cluster:KubernetesCluster", name, None, opts)
        self.eks = None
        if args.backend == "kubeconfig":
            if not args.kubeconfig:
                raise ValueError(f"KubernetesCluster {name}: backend 'kubeconfig' needs kubeconfig")
            self.provider = k8s.Provider(
                f"{name}-k8s",
                kubeconfig=args.kubeconfig,
                context=args.context,
                cluster_identifier=name,
                enable_config_map_mutable=args.enable_config_map_mutable,
                opts=child(self),
            )
        elif args.backend == "eks":
            if args.eks is None:
                raise ValueError(f"KubernetesCluster {name}: backend 'eks' needs eks arguments")
            self.provider = self._eks(name, args.eks, args.enable_config_map_mutable)
        else:  # pragma: no cover - Literal guards this for typed callers
            raise ValueError(f"KubernetesCluster {name}: unknown backend {args.backend!r}")
        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=args.namespace, labels=base_labels("autoheal", "namespace")
            ),
            opts=child(self, provider=self.provider),
        )
        self.namespace = namespace.metadata.name
        self.register_outputs(
            {
                "namespace": self.namespace,
                "backend": args.backend,
                "eksClusterName": self.eks.cluster_name if self.eks else None,
            }
        )

    def _eks(self, name: str, eks_args: EksArgs, mutable_config_maps: bool) -> k8s.Provider:
        """An EKS control plane, its node role, OIDC provider, system node group and add-ons; the
        Kubernetes provider talks to it."""
        import pulumi_aws as aws  # big package: imported only when an EKS stack asks for it

        aws_provider = aws.Provider(f"{name}-aws", region=eks_args.region, opts=child(self))
        aws_opts = child(self, provider=aws_provider)
        tags = eks_args.tags
        cluster_role = service_role(
            f"{name}-cluster-role", "eks.amazonaws.com", _EKS_CLUSTER_POLICIES, tags, aws_opts
        )
        cluster = self._eks_cluster(aws, name, eks_args, cluster_role, aws_opts)
        node_role = service_role(f"{name}-node-role", "ec2.amazonaws.com", _EKS_NODE_POLICIES, tags, aws_opts)
        self.eks = self._eks_platform(name, eks_args, cluster, node_role, aws_provider)
        # The kubeconfig holds no credential (it execs `aws eks get-token`) but is kept secret
        # anyway; secrecy flows from one secret input of Output.all to the result.
        kubeconfig: pulumi.Output[str] = pulumi.Output.all(
            cluster.name,
            cluster.endpoint,
            cluster.certificate_authority,
            pulumi.Output.secret(eks_args.region),
        ).apply(lambda a: _eks_kubeconfig(a[0], a[1], a[2], a[3]))
        return k8s.Provider(
            f"{name}-k8s",
            kubeconfig=kubeconfig,
            cluster_identifier=name,
            enable_config_map_mutable=mutable_config_maps,
            opts=child(self),
        )

    def _eks_platform(
        self, name: str, eks_args: EksArgs, cluster: Any, node_role: IamRole, aws_provider: Any
    ) -> EksCluster:
        """What nodes and pods need beyond the control plane: the OIDC provider (IRSA), the
        networking add-ons, the system node group, and CoreDNS on it."""
        aws_opts = child(self, provider=aws_provider)
        tags = eks_args.tags
        issuer = cluster.identities[0].oidcs[0].issuer
        oidc = oidc_provider(f"{name}-oidc", issuer, eks_args.oidc_thumbprints, tags, aws_opts)
        network = [
            addons.addon(f"{name}-addon-{a}", cluster.name, a, tags, aws_opts) for a in addons.NETWORK_ADDONS
        ]
        system = system_node_group(
            f"{name}-system-nodegroup",
            cluster.name,
            node_role.role.arn,
            eks_args.subnet_ids,
            eks_args.system_node_group,
            tags,
            pulumi.ResourceOptions.merge(
                aws_opts, pulumi.ResourceOptions(depends_on=[*node_role.attachments, *network])
            ),
        )
        addons.addon(
            f"{name}-addon-{addons.DNS_ADDON}",
            cluster.name,
            addons.DNS_ADDON,
            tags,
            aws_opts,
            depends_on=[system],
        )
        return EksCluster(
            cluster_name=cluster.name,
            node_role_arn=node_role.role.arn,
            subnet_ids=eks_args.subnet_ids,
            aws_provider=aws_provider,
            region=eks_args.region,
            tags=dict(tags),
            oidc=oidc,
            vpc_id=cluster.vpc_config.vpc_id,
            security_group_id=cluster.vpc_config.cluster_security_group_id,
            node_dependencies=[*node_role.attachments, *network],
            system_node_group=system,
        )

    def _eks_cluster(
        self, aws: Any, name: str, eks_args: EksArgs, role: IamRole, aws_opts: pulumi.ResourceOptions
    ) -> Any:
        return aws.eks.Cluster(
            f"{name}-eks",
            role_arn=role.role.arn,
            version=eks_args.version,
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=list(eks_args.subnet_ids),
                endpoint_public_access=eks_args.endpoint_public_access,
                endpoint_private_access=True,
                public_access_cidrs=list(eks_args.public_access_cidrs) or None,
            ),
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode="API_AND_CONFIG_MAP",
                bootstrap_cluster_creator_admin_permissions=True,
            ),
            tags=eks_args.tags,
            opts=pulumi.ResourceOptions.merge(aws_opts, pulumi.ResourceOptions(depends_on=role.attachments)),
        )


def _eks_kubeconfig(cluster_name: str, endpoint: str, ca: Any, region: str) -> str:
    """A kubeconfig that authenticates with `aws eks get-token` (no long-lived credential)."""
    ca_data = ca.get("data") if isinstance(ca, dict) else getattr(ca, "data", None)
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": cluster_name,
                    "cluster": {"server": endpoint, "certificate-authority-data": ca_data},
                }
            ],
            "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": "aws"}}],
            "current-context": cluster_name,
            "users": [
                {
                    "name": "aws",
                    "user": {
                        "exec": {
                            "apiVersion": "client.authentication.k8s.io/v1beta1",
                            "command": "aws",
                            "args": [
                                "eks",
                                "get-token",
                                "--cluster-name",
                                cluster_name,
                                "--region",
                                region,
                            ],
                        }
                    },
                }
            ],
        }
    )
