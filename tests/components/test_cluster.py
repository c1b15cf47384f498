"""KubernetesCluster: a provider from a kubeconfig, or an EKS control plane behind the same args;
EKS pools become managed node groups of size + spares with the pool's labels and taints."""

from __future__ import annotations

import pytest

from components.cluster import EksArgs, KubernetesCluster, KubernetesClusterArgs
from components.common import Taint
from components.nodepool import EksNodeGroupArgs, GpuNodePool, GpuNodePoolArgs
from tests.components.harness import run_program


def test_kubeconfig_backend_is_a_provider_with_a_stable_identity():
    rec = run_program(
        lambda: KubernetesCluster(
            "lab", KubernetesClusterArgs(kubeconfig="/tmp/lab/kubeconfig", context="lab")
        )
    )
    (provider,) = rec.of_type("pulumi:providers:kubernetes")
    assert provider.inputs["kubeconfig"] == "/tmp/lab/kubeconfig"
    assert provider.inputs["context"] == "lab"
    # A moved lab (new path, new certificates) must not replace every object in the cluster.
    assert provider.inputs["clusterIdentifier"] == "lab"
    ns = rec.one("kubernetes:core/v1:Namespace", "autoheal")
    assert ns.parent.endswith("autoheal:cluster:KubernetesCluster::lab")
    assert not [r for r in rec.resources if r.type.startswith("aws:")]


def test_kubeconfig_backend_needs_a_kubeconfig():
    with pytest.raises(ValueError, match="kubeconfig"):
        run_program(lambda: KubernetesCluster("x", KubernetesClusterArgs(kubeconfig=None)))


def _eks_program():
    cluster = KubernetesCluster(
        "prod",
        KubernetesClusterArgs(
            backend="eks", eks=EksArgs(region="us-east-1", subnet_ids=["subnet-a", "subnet-b"])
        ),
    )
    GpuNodePool(
        "pool-h100",
        GpuNodePoolArgs(
            name="h100",
            prefix="h100",
            size=16,
            spares=2,
            headroom=4,
            taints=(Taint(key="nvidia.com/gpu", value="present"),),
            labels={"team": "ml"},
            eks=EksNodeGroupArgs(instance_type="p5.48xlarge"),
            eks_cluster=cluster.eks,
        ),
        opts=__import__("pulumi").ResourceOptions(provider=cluster.provider),
    )


def test_eks_backend_builds_a_control_plane_with_its_roles():
    rec = run_program(_eks_program)
    (eks,) = rec.of_type("aws:eks/cluster:Cluster")
    assert eks.inputs["vpcConfig"]["subnetIds"] == ["subnet-a", "subnet-b"]
    roles = rec.of_type("aws:iam/role:Role")
    assert len(roles) == 2  # the control plane's and the nodes' (IRSA roles: EksPlatform)
    attached = {
        r.inputs["policyArn"] for r in rec.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    }
    assert "arn:aws:iam::aws:policy/AmazonEKSClusterPolicy" in attached
    assert "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy" in attached
    k8s_providers = rec.of_type("pulumi:providers:kubernetes")
    assert len(k8s_providers) == 1 and "clusterIdentifier" in k8s_providers[0].inputs


def test_eks_pool_is_a_node_group_of_size_plus_spares_with_labels_and_taints():
    rec = run_program(_eks_program)
    (group,) = [
        g
        for g in rec.of_type("aws:eks/nodeGroup:NodeGroup")
        if g.inputs["nodeGroupName"] != "autoheal-system"
    ]
    assert group.inputs["scalingConfig"] == {"desiredSize": 18, "minSize": 18, "maxSize": 22}
    assert group.inputs["labels"] == {
        "team": "ml",
        "autoheal.io/pool": "h100",
        "autoheal.io/gpu-model": "h100",
    }
    assert group.inputs["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]
    assert group.inputs["instanceTypes"] == ["p5.48xlarge"]
    assert group.parent.endswith("autoheal:nodepool:GpuNodePool::pool-h100")
    # The pool description is declared on EKS too: the runbook reads spares from it.
    cm = rec.one("kubernetes:core/v1:ConfigMap", "autoheal-pool-h100")
    assert '"cluster": "eks"' in cm.inputs["data"]["pool.json"]
