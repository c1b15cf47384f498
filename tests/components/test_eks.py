"""The EKS stack as it must be to come up (issue 31): Pulumi.example-eks.yaml under Pulumi mocks.

A system node group for what is not a GPU workload, the managed add-ons, a GPU device plugin on
the pools' nodes, the CSI drivers with their IAM roles, the StorageClasses and EFS file system the
claims name, the cluster's OIDC provider and the runner's IAM role, Guaranteed slurmd pods, a login
reachable only from its source ranges, and the Prometheus Operator's selector labels."""

from __future__ import annotations

import copy
import json
from collections import Counter
from typing import Any

import pytest
import yaml

from autoheal import labels as lb
from components.config import parse_stack_config
from components.device_plugins import EFA_DEVICE_PLUGIN_IMAGE, NVIDIA_DEVICE_PLUGIN_IMAGE
from components.stack import build_stack
from policy.rules import RESOURCE_RULES, stack_has_remediation
from review.mockstack import FAKE_OIDC_ISSUER, FAKE_VPC
from tests.components.harness import ROOT, Recorded, Res, pod_spec, run_program

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
ADDON = "aws:eks/addon:Addon"
DAEMON_SET = "kubernetes:apps/v1:DaemonSet"
STORAGE_CLASS = "kubernetes:storage.k8s.io/v1:StorageClass"
SYSTEM = {lb.ROLE_LABEL: lb.SYSTEM_ROLE}


def example_raw() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "Pulumi.example-eks.yaml").read_text())
    return {k.split(":", 1)[1]: v for k, v in doc["config"].items()}


def build(raw: dict[str, Any]) -> Recorded:
    cfg = parse_stack_config(raw)
    return run_program(lambda: build_stack(cfg, ROOT, "rules: []\n", {}))


def edited(**changes: Any) -> dict[str, Any]:
    """The example's config with `changes` merged into its top-level objects."""
    raw = copy.deepcopy(example_raw())
    for key, value in changes.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) else value
    return raw


@pytest.fixture(scope="module")
def eks() -> Recorded:
    return build(example_raw())


def _by_name(rec: Recorded, typ: str, field: str) -> dict[str, Res]:
    return {r.inputs[field]: r for r in rec.of_type(typ)}


def _depends_on(rec: Recorded, res: Res, typ: str) -> list[Res]:
    return [r for r in rec.resources if r.urn in res.dependencies and r.type == typ]


def _trust(role: Res) -> dict[str, str]:
    (statement,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert statement["Principal"]["Federated"].startswith("arn:aws:iam::123456789012:oidc-provider/oidc.eks.")
    conditions: dict[str, str] = statement["Condition"]["StringEquals"]
    return conditions


# --- 1. the system node group and the core add-ons --------------------------------------------


def test_an_untainted_system_node_group_carries_the_system_role(eks):
    groups = _by_name(eks, NODE_GROUP, "nodeGroupName")
    system = groups["autoheal-system"]
    assert system.inputs["instanceTypes"] == ["m7i.xlarge"]
    assert system.inputs["scalingConfig"] == {"desiredSize": 2, "minSize": 2, "maxSize": 3}
    assert system.inputs["labels"] == SYSTEM
    assert system.inputs.get("taints", []) == []
    # the GPU pools stay tainted: the system pods must not need to tolerate them
    for pool in ("autoheal-h100", "autoheal-a100"):
        assert groups[pool].inputs["taints"] == [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}
        ]


def test_system_pods_select_the_system_nodes_and_tolerate_no_gpu_taint(eks):
    for typ, name in (
        ("kubernetes:apps/v1:StatefulSet", "slurmctld"),
        ("kubernetes:apps/v1:Deployment", "slurm-login"),
        ("kubernetes:apps/v1:Deployment", "autoheal-runner"),
    ):
        spec = pod_spec(eks.one(typ, name))
        assert spec["nodeSelector"] == SYSTEM, name
        assert not spec.get("tolerations"), name


def test_a_configured_node_selector_wins_over_the_system_default():
    raw = edited(slurm={"nodeSelector": {"pool": "ops"}}, runner={"nodeSelector": {"pool": "ops2"}})
    rec = build(raw)
    assert pod_spec(rec.one("kubernetes:apps/v1:StatefulSet", "slurmctld"))["nodeSelector"] == {"pool": "ops"}
    assert pod_spec(rec.one("kubernetes:apps/v1:Deployment", "autoheal-runner"))["nodeSelector"] == {
        "pool": "ops2"
    }


def test_the_system_node_group_is_configurable_and_refuses_an_unknown_instance_type():
    cluster = example_raw()["cluster"]
    cluster["eks"]["systemNodeGroup"] = {"instanceType": "m7i.2xlarge", "size": 3, "labels": {"tier": "ops"}}
    rec = build(edited(cluster=cluster))
    system = _by_name(rec, NODE_GROUP, "nodeGroupName")["autoheal-system"]
    assert system.inputs["instanceTypes"] == ["m7i.2xlarge"]
    assert system.inputs["scalingConfig"]["desiredSize"] == 3
    assert system.inputs["labels"] == {"tier": "ops", **SYSTEM}
    cluster["eks"]["systemNodeGroup"] = {"instanceType": "m9z.huge"}
    with pytest.raises(Exception, match=r"autoheal:cluster\.eks\.systemNodeGroup\.instanceType: .*m9z\.huge"):
        parse_stack_config(edited(cluster=cluster))


def test_networking_add_ons_come_before_nodes_and_coredns_after_the_system_nodes(eks):
    addons = _by_name(eks, ADDON, "addonName")
    assert set(addons) == {"vpc-cni", "kube-proxy", "coredns", "aws-ebs-csi-driver", "aws-efs-csi-driver"}
    for group in eks.of_type(NODE_GROUP):
        needs = {r.inputs["addonName"] for r in _depends_on(eks, group, ADDON)}
        assert needs == {"vpc-cni", "kube-proxy"}, group.inputs["nodeGroupName"]
    (after,) = _depends_on(eks, addons["coredns"], NODE_GROUP)
    assert after.inputs["nodeGroupName"] == "autoheal-system"
    for addon in addons.values():
        assert addon.inputs["resolveConflictsOnCreate"] == "OVERWRITE"


# --- 2. the GPU device plugin -----------------------------------------------------------------


def test_nvidia_device_plugin_runs_on_every_pool_node_and_advertises_gpus(eks):
    ds = eks.one(DAEMON_SET, "nvidia-device-plugin")
    assert ds.inputs["metadata"]["namespace"] == "kube-system"
    assert ds.inputs["metadata"]["annotations"] == {lb.ADVERTISES_ANNOTATION: lb.GPU_RESOURCE}
    spec = pod_spec(ds)
    assert spec["priorityClassName"] == "system-node-critical"
    assert [c["image"] for c in spec["containers"]] == [NVIDIA_DEVICE_PLUGIN_IMAGE]
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [{"key": lb.POOL_LABEL, "operator": "In", "values": ["a100", "h100"]}]
    tolerated = {(t["key"], t.get("value"), t["effect"]) for t in spec["tolerations"]}
    assert ("nvidia.com/gpu", "present", "NoSchedule") in tolerated
    assert (lb.SPARE_TAINT_KEY, "true", "NoSchedule") in tolerated  # a spare advertises before promotion
    assert (lb.QUARANTINE_TAINT_KEY, None, "NoSchedule") in tolerated


def test_device_plugin_none_declares_none_and_gpu_operator_is_a_pinned_helm_release():
    cluster = example_raw()["cluster"]
    cluster["eks"]["devicePlugin"] = "none"
    rec = build(edited(cluster=cluster))
    assert "nvidia-device-plugin" not in {r.k8s_name for r in rec.of_type(DAEMON_SET)}
    cluster["eks"]["devicePlugin"] = "gpu-operator"
    cluster["eks"]["gpuOperatorVersion"] = "v24.9.1"
    rec = build(edited(cluster=cluster))
    (release,) = rec.of_type("kubernetes:helm.sh/v3:Release")
    assert (release.inputs["chart"], release.inputs["version"]) == ("gpu-operator", "v24.9.1")
    assert release.inputs["values"]["driver"] == {"enabled": False}  # the EKS GPU AMI has it
    assert release.inputs["values"]["dcgmExporter"] == {"enabled": False}  # the stack runs its own
    assert "dcgm-exporter" in {r.k8s_name for r in rec.of_type(DAEMON_SET)}
    rec = build(edited(cluster=cluster, monitoring={"dcgmExporter": False}))
    (release,) = rec.of_type("kubernetes:helm.sh/v3:Release")
    assert release.inputs["values"]["dcgmExporter"] == {"enabled": True}
    assert "dcgm-exporter" not in {r.k8s_name for r in rec.of_type(DAEMON_SET)}
    cluster["eks"]["devicePlugin"] = "nvidia-ish"
    with pytest.raises(Exception, match=r"autoheal:cluster\.eks\.devicePlugin"):
        parse_stack_config(edited(cluster=cluster))


# --- 3. storage -------------------------------------------------------------------------------


def test_csi_drivers_are_add_ons_with_their_own_irsa_roles(eks):
    roles = {r.urn: r for r in eks.of_type("aws:iam/role:Role")}
    attachments = eks.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    for addon, sa, policy in (
        ("aws-ebs-csi-driver", "ebs-csi-controller-sa", "AmazonEBSCSIDriverPolicy"),
        ("aws-efs-csi-driver", "efs-csi-controller-sa", "AmazonEFSCSIDriverPolicy"),
    ):
        res = _by_name(eks, ADDON, "addonName")[addon]
        role_arn = res.inputs["serviceAccountRoleArn"]
        (role,) = [r for r in roles.values() if role_arn.endswith("/" + r.name)]
        trust = _trust(role)
        issuer = f"{FAKE_OIDC_ISSUER.removeprefix('https://')}/"
        (sub,) = [k for k in trust if k.endswith(":sub")]
        assert sub.startswith(issuer) and trust[sub] == f"system:serviceaccount:kube-system:{sa}"
        assert trust[sub.replace(":sub", ":aud")] == "sts.amazonaws.com"
        arns = {a.inputs["policyArn"] for a in attachments if a.name.startswith(role.name)}
        assert arns == {f"arn:aws:iam::aws:policy/service-role/{policy}"}
        # the controller runs on the system nodes: the add-on waits for them
        assert [g.inputs["nodeGroupName"] for g in _depends_on(eks, res, NODE_GROUP)] == ["autoheal-system"]


def test_the_storage_classes_the_claims_name_exist(eks):
    classes = {r.k8s_name: r.inputs for r in eks.of_type(STORAGE_CLASS)}
    assert set(classes) == {"gp3", "efs-sc"}
    gp3 = classes["gp3"]
    assert gp3["provisioner"] == "ebs.csi.aws.com"
    assert gp3["parameters"]["type"] == "gp3" and gp3["parameters"]["encrypted"] == "true"
    assert gp3["volumeBindingMode"] == "WaitForFirstConsumer"
    efs = classes["efs-sc"]
    assert efs["provisioner"] == "efs.csi.aws.com"
    (fs,) = eks.of_type("aws:efs/fileSystem:FileSystem")
    assert efs["parameters"] == {
        "provisioningMode": "efs-ap",
        "fileSystemId": f"{fs.name}-id",
        "directoryPerms": "700",
    }
    # every claim names a class the stack declares
    claims = [r.inputs["spec"] for r in eks.of_type("kubernetes:core/v1:PersistentVolumeClaim")]
    claims += [
        t["spec"]
        for r in eks.of_type("kubernetes:apps/v1:StatefulSet")
        for t in r.inputs["spec"].get("volumeClaimTemplates", [])
    ]
    assert {c["storageClassName"] for c in claims} == {"gp3", "efs-sc"}


def test_efs_is_reachable_from_every_subnet_over_nfs_from_the_cluster_security_group(eks):
    (fs,) = eks.of_type("aws:efs/fileSystem:FileSystem")
    assert fs.inputs["encrypted"] is True
    # the review asks for an approval before this is replaced or deleted (every file is on it)
    from review.stateful import stateful_what

    assert "EFS file system" in (stateful_what(fs.type, fs.inputs) or "")
    targets = eks.of_type("aws:efs/mountTarget:MountTarget")
    assert sorted(t.inputs["subnetId"] for t in targets) == sorted(
        example_raw()["cluster"]["eks"]["subnetIds"]
    )
    (sg,) = eks.of_type("aws:ec2/securityGroup:SecurityGroup")
    assert sg.inputs["vpcId"] == FAKE_VPC["vpcId"]
    (rule,) = sg.inputs["ingress"]
    assert (rule["protocol"], rule["fromPort"], rule["toPort"]) == ("tcp", 2049, 2049)
    assert rule["securityGroups"] == [FAKE_VPC["clusterSecurityGroupId"]]
    assert all(t.inputs["securityGroups"] == [f"{sg.name}-id"] for t in targets)


def test_storage_classes_the_stack_does_not_name_are_not_declared():
    raw = edited(slurm={**example_raw()["slurm"], "storage": {"stateStorageClass": "io2"}})
    raw["runner"] = {k: v for k, v in raw["runner"].items() if k != "journalStorageClass"}
    rec = build(raw)
    assert rec.of_type(STORAGE_CLASS) == []
    assert rec.of_type("aws:efs/fileSystem:FileSystem") == []
    # the EBS driver stays: a class of the operator's own may use it
    assert set(_by_name(rec, ADDON, "addonName")) == {
        "vpc-cni",
        "kube-proxy",
        "coredns",
        "aws-ebs-csi-driver",
    }


# --- 4. OIDC and the runner's IAM role ----------------------------------------------------------


def test_the_oidc_provider_is_the_clusters_issuer(eks):
    (provider,) = eks.of_type("aws:iam/openIdConnectProvider:OpenIdConnectProvider")
    (cluster,) = eks.of_type("aws:eks/cluster:Cluster")
    assert provider.inputs["url"] == f"{FAKE_OIDC_ISSUER}/{cluster.name}"
    assert provider.inputs["clientIdLists"] == ["sts.amazonaws.com"]
    assert "thumbprintLists" not in provider.inputs  # IAM checks the EKS issuer itself


def test_the_runner_assumes_a_role_that_acts_only_on_the_stacks_gpu_nodes(eks):
    sa = eks.one("kubernetes:core/v1:ServiceAccount", "autoheal-runner")
    arn = sa.inputs["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    (role,) = [r for r in eks.of_type("aws:iam/role:Role") if arn.endswith("/" + r.name)]
    trust = _trust(role)
    assert "system:serviceaccount:autoheal:autoheal-runner" in trust.values()
    (policy,) = eks.of_type("aws:iam/rolePolicy:RolePolicy")
    assert policy.inputs["role"] == f"{role.name}-id"
    statements = {s["Sid"]: s for s in json.loads(policy.inputs["policy"])["Statement"]}
    assert (
        "Condition" not in statements["Describe"]
        and "ec2:DescribeInstances" in statements["Describe"]["Action"]
    )
    acting = [a for s in statements.values() if "Condition" in s for a in s["Action"]]
    assert sorted(acting) == [
        "autoscaling:SetInstanceHealth",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
        "ec2:RebootInstances",
        "ec2:TerminateInstances",
    ]
    (cluster,) = eks.of_type("aws:eks/cluster:Cluster")
    for s in statements.values():
        if "Condition" in s:
            assert s["Condition"]["StringEquals"] == {
                "aws:ResourceTag/eks:cluster-name": cluster.name,
                "aws:ResourceTag/eks:nodegroup-name": ["autoheal-a100", "autoheal-h100"],  # not system
            }
    # the aws pool backend in the runner's pod acts on this cluster, in its region (pools/aws.py)
    env = {
        e["name"]: e.get("value")
        for e in pod_spec(eks.one("kubernetes:apps/v1:Deployment", "autoheal-runner"))["containers"][0]["env"]
    }
    assert env["AUTOHEAL_POOL_CLUSTER"] == cluster.name
    assert env["AWS_REGION"] == example_raw()["cluster"]["eks"]["region"]


# --- 5. slurmd Guaranteed -----------------------------------------------------------------------


def test_slurmd_is_guaranteed_with_the_pools_cpus_memory_and_gpus(eks):
    for name, cpus, memory in (("slurmd-h100", "190", "1900000Mi"), ("slurmd-a100", "94", "1100000Mi")):
        spec = pod_spec(eks.one(DAEMON_SET, name))
        (slurmd,) = spec["containers"]
        want = {"cpu": cpus, "memory": memory, "nvidia.com/gpu": "8"}
        assert slurmd["resources"] == {"requests": want, "limits": want}
        for c in spec["initContainers"]:  # Guaranteed needs every container sized
            assert c["resources"]["requests"] == c["resources"]["limits"], c["name"]
            assert set(c["resources"]["requests"]) == {"cpu", "memory"}
    # the munge containers of slurmctld, shared with slurmd, are not changed by slurmd's sizing
    ctld = pod_spec(eks.one("kubernetes:apps/v1:StatefulSet", "slurmctld"))
    assert all("resources" not in c for c in ctld["initContainers"])


def test_a_pool_whose_slurmd_does_not_fit_its_instance_is_refused_naming_the_most_that_fits():
    pools = example_raw()["pools"]
    pools[0]["cpus"] = 192
    with pytest.raises(
        Exception, match=r"pools\[0\] \(h100\): cpus 192 do not fit a p5\.48xlarge .* at most 190"
    ):
        parse_stack_config(edited(pools=pools))
    pools[0]["guaranteed"] = False  # Burstable slurmd: Slurm's view is the operator's call
    rec = build(edited(pools=pools))
    (slurmd,) = pod_spec(rec.one(DAEMON_SET, "slurmd-h100"))["containers"]
    assert slurmd["resources"]["requests"] == {"nvidia.com/gpu": "8"}


# --- 6. login source ranges ----------------------------------------------------------------------


def test_the_login_load_balancer_admits_only_its_source_ranges(eks):
    svc = eks.one("kubernetes:core/v1:Service", "slurm-login")
    assert svc.inputs["spec"]["type"] == "LoadBalancer"
    assert svc.inputs["spec"]["loadBalancerSourceRanges"] == ["203.0.113.0/24"]


def test_a_login_open_to_the_world_fails_the_policy_unless_waived():
    slurm = {**example_raw()["slurm"], "loginSourceRanges": []}
    rec = build(edited(slurm=slurm))
    svc = rec.one("kubernetes:core/v1:Service", "slurm-login")
    (msg,) = RESOURCE_RULES["login-source-ranges"](svc.type, svc.inputs)
    assert "open to the world" in msg and "autoheal:slurm.loginSourceRanges" in msg
    rec = build(edited(slurm={**slurm, "loginSourceRanges": ["0.0.0.0/0"]}))
    svc = rec.one("kubernetes:core/v1:Service", "slurm-login")
    assert (
        "['0.0.0.0/0'] admit SSH from anywhere"
        in RESOURCE_RULES["login-source-ranges"](svc.type, svc.inputs)[0]
    )
    rec = build(edited(slurm={**slurm, "loginPolicyWaiver": "bastion-only VPC, no internet gateway"}))
    svc = rec.one("kubernetes:core/v1:Service", "slurm-login")
    assert RESOURCE_RULES["login-source-ranges"](svc.type, svc.inputs) == []
    with pytest.raises(Exception, match=r"autoheal:slurm\.loginSourceRanges: .*'ten\.0/8' is not a CIDR"):
        parse_stack_config(edited(slurm={**slurm, "loginSourceRanges": ["ten.0/8"]}))


def test_the_login_rule_judges_only_load_balancers_serving_ssh():
    rule = RESOURCE_RULES["login-source-ranges"]
    svc = "kubernetes:core/v1:Service"

    def props(typ: str, port: int, component: str = "web", ranges: list[str] | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"type": typ, "ports": [{"port": port}]}
        if ranges is not None:
            spec["loadBalancerSourceRanges"] = ranges
        return {"metadata": {"name": "x", "labels": {lb.COMPONENT_LABEL: component}}, "spec": spec}

    assert rule(svc, props("ClusterIP", 22, "login")) == []
    assert rule(svc, props("LoadBalancer", 443)) == []
    assert len(rule(svc, props("LoadBalancer", 22))) == 1  # anyone's SSH, not only ours
    assert len(rule(svc, props("LoadBalancer", 2222, "login", ["::/0"]))) == 1
    assert rule(svc, props("LoadBalancer", 22, "login", ["10.0.0.0/8"])) == []


# --- 7. the Prometheus Operator's selector labels ------------------------------------------------


def test_operator_objects_carry_the_operators_selector_labels(eks):
    kinds = ("v1:PrometheusRule", "v1:ServiceMonitor", "v1alpha1:AlertmanagerConfig")
    for kind in kinds:
        (obj,) = eks.of_type(f"kubernetes:monitoring.coreos.com/{kind}")
        assert obj.inputs["metadata"]["labels"]["release"] == "kube-prometheus-stack", kind
        assert obj.inputs["metadata"]["labels"][lb.PART_OF_LABEL] == "autoheal"


# --- the stack as a whole ------------------------------------------------------------------------


def test_the_eks_example_passes_the_policy_pack_with_every_image_by_digest(eks):
    violations = [
        (name, r.k8s_name or r.name, msg)
        for r in eks.resources
        for name, rule in RESOURCE_RULES.items()
        for msg in rule(r.type, r.inputs)
    ]
    assert violations == []
    assert stack_has_remediation((r.type, r.inputs) for r in eks.resources) == []


def test_the_eks_example_declares_what_it_needs_to_come_up(eks):
    counts = Counter(r.type for r in eks.resources)
    assert counts[NODE_GROUP] == 3
    assert counts[ADDON] == 5
    assert counts["aws:iam/openIdConnectProvider:OpenIdConnectProvider"] == 1
    assert counts["aws:iam/role:Role"] == 5  # cluster, nodes, EBS CSI, EFS CSI, runner
    assert counts[STORAGE_CLASS] == 2
    assert counts["aws:efs/mountTarget:MountTarget"] == 2
    assert counts["autoheal:eks:EksPlatform"] == 1
    plugins = {
        r.k8s_name
        for r in eks.of_type(DAEMON_SET)
        if r.inputs["metadata"].get("annotations", {}).get(lb.ADVERTISES_ANNOTATION)
    }
    assert plugins == {"nvidia-device-plugin", "aws-efa-k8s-device-plugin"}
    assert EFA_DEVICE_PLUGIN_IMAGE.split("@")[1].startswith("sha256:")


# --- 8. EFA, placement groups and capacity reservations ------------------------------------------


def _launch_template(rec: Recorded, pool: str) -> dict[str, Any]:
    group = _by_name(rec, NODE_GROUP, "nodeGroupName")[f"autoheal-{pool}"]
    (template,) = [
        t for t in rec.of_type("aws:ec2/launchTemplate:LaunchTemplate") if t.name == f"pool-{pool}-launch"
    ]
    assert group.inputs["launchTemplate"] == {"id": f"{template.name}-id", "version": "1"}
    assert "diskSize" not in group.inputs  # the template's root volume instead
    inputs: dict[str, Any] = template.inputs
    return inputs


def test_efa_pools_get_every_efa_interface_in_a_cluster_placement_group_in_one_subnet(eks):
    for pool, cards in (("h100", 32), ("a100", 4)):
        template = _launch_template(eks, pool)
        interfaces = template["networkInterfaces"]
        assert [i["networkCardIndex"] for i in interfaces] == list(range(cards))
        assert [i["deviceIndex"] for i in interfaces] == [0] + [1] * (cards - 1)
        assert {i["interfaceType"] for i in interfaces} == {"efa"}
        assert all(i["securityGroups"] == [FAKE_VPC["clusterSecurityGroupId"]] for i in interfaces)
        (placement,) = [
            g
            for g in eks.of_type("aws:ec2/placementGroup:PlacementGroup")
            if g.name == f"pool-{pool}-placement"
        ]
        assert placement.inputs["strategy"] == "cluster"
        assert template["placement"] == {"groupName": placement.name}
        assert template["blockDeviceMappings"][0]["ebs"]["volumeSize"] == 200
        group = _by_name(eks, NODE_GROUP, "nodeGroupName")[f"autoheal-{pool}"]
        assert group.inputs["subnetIds"] == example_raw()["cluster"]["eks"]["subnetIds"][:1]
    efa = eks.one(DAEMON_SET, "aws-efa-k8s-device-plugin")
    assert efa.inputs["metadata"]["annotations"] == {lb.ADVERTISES_ANNOTATION: "vpc.amazonaws.com/efa"}
    assert [c["image"] for c in pod_spec(efa)["containers"]] == [EFA_DEVICE_PLUGIN_IMAGE]


def test_a_pool_without_efa_has_no_template_unless_it_launches_into_a_reservation():
    pools = example_raw()["pools"]
    pools[1]["eks"] = {"instanceType": "p4d.24xlarge", "efa": False}
    rec = build(edited(pools=pools))
    group = _by_name(rec, NODE_GROUP, "nodeGroupName")["autoheal-a100"]
    assert "launchTemplate" not in group.inputs and group.inputs["diskSize"] == 200
    assert len(group.inputs["subnetIds"]) == 2
    # the EFA plugin runs on the EFA pool only
    (term,) = pod_spec(rec.one(DAEMON_SET, "aws-efa-k8s-device-plugin"))["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == ["h100"]
    pools[1]["eks"] = {
        "instanceType": "p4d.24xlarge",
        "efa": False,
        "capacityType": "CAPACITY_BLOCK",
        "capacityReservationId": "cr-0123456789abcdef0",
    }
    rec = build(edited(pools=pools))
    template = _launch_template(rec, "a100")
    assert template["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": "cr-0123456789abcdef0"}
    }
    assert template["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert "networkInterfaces" not in template and "placement" not in template


def test_efa_and_capacity_settings_are_checked_naming_the_key():
    pools = example_raw()["pools"]
    pools[0]["eks"] = {"instanceType": "g5.12xlarge", "efa": True}
    with pytest.raises(Exception, match=r"autoheal:pools\[0\]\.eks: .*g5\.12xlarge has no EFA"):
        parse_stack_config(edited(pools=pools))
    pools[0]["eks"] = {"instanceType": "p5.48xlarge", "capacityType": "CAPACITY_BLOCK"}
    with pytest.raises(Exception, match=r"autoheal:pools\[0\]\.eks: .*needs capacityReservationId"):
        parse_stack_config(edited(pools=pools))
    pools[0]["eks"] = {"instanceType": "p5.48xlarge", "capacityReservationId": "reservation-1"}
    with pytest.raises(Exception, match=r"autoheal:pools\[0\]\.eks\.capacityReservationId"):
        parse_stack_config(edited(pools=pools))


# --- an existing cluster (the lab) is left as it was ----------------------------------------------


def test_a_kubeconfig_stack_declares_nothing_of_eks_and_keeps_slurmd_burstable():
    from tests.components.harness import lab_stack_raw

    rec = build(lab_stack_raw())
    assert not [r for r in rec.resources if r.type.startswith("aws:") or r.type == "autoheal:eks:EksPlatform"]
    assert rec.of_type(STORAGE_CLASS) == []
    assert all(
        not (r.inputs["metadata"].get("annotations") or {}).get(lb.ADVERTISES_ANNOTATION)
        for r in rec.of_type(DAEMON_SET)
    )
    spec = pod_spec(rec.one(DAEMON_SET, "slurmd-h100"))
    (slurmd,) = spec["containers"]
    assert slurmd["resources"] == {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}
    assert all("resources" not in c for c in spec["initContainers"])
    # no system node group there: the system pods go where the stack file says (the lab: nowhere set)
    assert "nodeSelector" not in pod_spec(rec.one("kubernetes:apps/v1:StatefulSet", "slurmctld"))


def test_checkpoints_on_fsx_for_lustre_get_its_driver_security_group_and_class():
    slurm = example_raw()["slurm"]
    slurm["storage"] = {**slurm["storage"], "checkpointStorageClass": "fsx-lustre"}
    rec = build(edited(slurm=slurm))
    claims = {r.k8s_name: r.inputs["spec"] for r in rec.of_type("kubernetes:core/v1:PersistentVolumeClaim")}
    assert claims["slurm-checkpoints"]["storageClassName"] == "fsx-lustre"
    assert claims["slurm-home"]["storageClassName"] == "efs-sc"
    classes = {r.k8s_name: r.inputs for r in rec.of_type(STORAGE_CLASS)}
    assert set(classes) == {"gp3", "efs-sc", "fsx-lustre"}
    fsx = classes["fsx-lustre"]
    (sg,) = [g for g in rec.of_type("aws:ec2/securityGroup:SecurityGroup") if g.name.endswith("fsx-sg")]
    assert fsx["provisioner"] == "fsx.csi.aws.com"
    assert fsx["parameters"] == {
        "subnetId": example_raw()["cluster"]["eks"]["subnetIds"][0],
        "securityGroupIds": f"{sg.name}-id",
        "deploymentType": "PERSISTENT_2",
        "perUnitStorageThroughput": "250",
        "dataCompressionType": "LZ4",
    }
    ports = {(r["fromPort"], r["toPort"]) for r in sg.inputs["ingress"]}
    assert ports == {(988, 988), (1018, 1023)}
    assert all(
        r["securityGroups"] == [FAKE_VPC["clusterSecurityGroupId"]] and r["self"]
        for r in sg.inputs["ingress"]
    )
    addon = _by_name(rec, ADDON, "addonName")["aws-fsx-csi-driver"]
    (role,) = [
        r
        for r in rec.of_type("aws:iam/role:Role")
        if addon.inputs["serviceAccountRoleArn"].endswith("/" + r.name)
    ]
    assert "system:serviceaccount:kube-system:fsx-csi-controller-sa" in _trust(role).values()


def test_each_pool_declares_its_backend_and_the_runner_is_told(eks):
    """A pool's backend (how its nodes are rebooted and retired) is in its description and in the
    runner's config; on EKS it defaults to the cloud's API, and the lab's pool controller is refused."""
    pools = {
        json.loads(cm.inputs["data"]["pool.json"])["name"]: json.loads(cm.inputs["data"]["pool.json"])
        for cm in eks.of_type("kubernetes:core/v1:ConfigMap")
        if "pool.json" in (cm.inputs.get("data") or {})
    }
    assert {name: (p["cluster"], p["backend"]) for name, p in pools.items()} == {
        name: ("eks", "aws") for name in pools
    }
    settings = yaml.safe_load(
        eks.one("kubernetes:core/v1:ConfigMap", "autoheal-runner-config").inputs["data"]["runner.yaml"]
    )
    assert settings["pool_backends"] == dict.fromkeys(pools, "aws")
    # a retire waits for the group's replacement; one that never comes fails the run once
    assert settings["play_vars"]["autoheal_wait_replacement"] is True
    assert settings["play_vars"]["autoheal_replacement_timeout"] == 900
    # nothing else makes a node group's new instance a spare, nor deletes a dead node's record
    assert settings["spare_keeper"]["enabled"] and settings["dead_nodes"]["enabled"]
    assert eks.one("kubernetes:rbac.authorization.k8s.io/v1:Role", "autoheal-runner-pools")
    raw = example_raw()
    raw["pools"] = [{**p, "backend": None} for p in raw["pools"]]
    assert parse_stack_config(raw).backend(parse_stack_config(raw).pools[0]) == "aws"
    raw["pools"][0]["backend"] = "lab"
    with pytest.raises(Exception, match=r"pools\[0\] \(h100\): backend 'lab' is the lab's pool controller"):
        parse_stack_config(raw)
