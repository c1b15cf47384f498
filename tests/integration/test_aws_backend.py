"""The AWS pool backend against moto running as a server process (EC2 and Auto Scaling over the
real wire protocol) and Nodes in the lab's real kube-apiserver whose spec.providerID names moto's
instances.

The test plays two parts the cloud plays on EKS: the bridge that turns an instance the Auto
Scaling group launched into a Node (`join`), and the kubelet that reports a new boot id after a
reboot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from autoheal import labels as lb
from lab import controlplane
from pools import kube
from pools.aws import CLUSTER_TAG, NODEGROUP_TAG, AwsBackend, node_group_name
from pools.base import BackendError
from tests.moto_server import AZ, MotoServer, ThrottlingProxy
from tests.support import port_base, wait_for

pytestmark = pytest.mark.kube

MOTO_PORT = port_base(28200)
PROXY_PORT = port_base(28201)
DENY_PORT = port_base(28202)
KUBE_BASE = port_base(28210)  # +0..+5
CLUSTER = "gpu-prod"
AUTOHEAL = str(Path(sys.executable).parent / "autoheal")


@pytest.fixture(scope="module", autouse=True)
def _tools() -> None:
    for tool in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"):
        try:
            controlplane.tool_path(tool)
        except controlplane.ToolMissingError as exc:
            pytest.skip(f"AWS BACKEND NOT TESTED: {exc}")


@pytest.fixture(scope="module")
def moto(tmp_path_factory) -> Iterator[MotoServer]:
    with MotoServer(MOTO_PORT, tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture(scope="module")
def cp(tmp_path_factory) -> Iterator[controlplane.KubeHandle]:
    run_dir = tmp_path_factory.mktemp("kube")
    try:
        yield controlplane.start_control_plane(run_dir, [], KUBE_BASE, timeout=180)
    finally:
        controlplane.stop_control_plane(run_dir)


@pytest.fixture
def aws_env(moto, monkeypatch) -> dict[str, str]:
    env = moto.env()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@dataclass
class Cloud:
    """One moto account: a subnet and a launch template for groups, Nodes for their instances."""

    env: dict[str, str]
    kubeconfig: Path
    subnet: str
    template: str

    def client(self, service: str) -> Any:
        return boto3.client(
            service,
            endpoint_url=self.env["AWS_ENDPOINT_URL"],
            region_name=self.env["AWS_REGION"],
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
        )

    def group(self, pool: str, size: int, cluster: str = CLUSTER, nodegroup: str = "") -> str:
        """An Auto Scaling group tagged as EKS tags a managed node group's; returns its name."""
        ng = nodegroup or node_group_name(pool)
        name = f"eks-{ng}-{uuid.uuid4().hex[:8]}"
        self.client("autoscaling").create_auto_scaling_group(
            AutoScalingGroupName=name,
            LaunchTemplate={"LaunchTemplateId": self.template, "Version": "$Latest"},
            MinSize=0,
            MaxSize=size + 2,
            DesiredCapacity=size,
            VPCZoneIdentifier=self.subnet,
            Tags=[
                {
                    "Key": k,
                    "Value": v,
                    "PropagateAtLaunch": True,
                    "ResourceId": name,
                    "ResourceType": "auto-scaling-group",
                }
                for k, v in ((CLUSTER_TAG, cluster), (NODEGROUP_TAG, ng))
            ],
        )
        return name

    def in_service(self, group: str) -> list[str]:
        g = self.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[group])
        return [
            i["InstanceId"]
            for i in g["AutoScalingGroups"][0]["Instances"]
            if i["LifecycleState"] == "InService"
        ]

    def desired(self, group: str) -> int:
        g = self.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[group])
        return int(g["AutoScalingGroups"][0]["DesiredCapacity"])

    def state(self, instance: str) -> str:
        r = self.client("ec2").describe_instances(InstanceIds=[instance])
        return str(r["Reservations"][0]["Instances"][0]["State"]["Name"])

    def join(self, name: str, instance: str, pool: str, boot_id: str = "boot-1", fenced: bool = True) -> None:
        """What EKS's bootstrap does: a Node for the instance, its providerID naming it (KWOK keeps
        it Ready, and keeps the boot id the test gives it); `fenced`: cordoned, as the runbook
        leaves a node before it retires it."""
        manifest = controlplane.node_manifest(controlplane.KubeNodeSpec(name, labels={lb.POOL_LABEL: pool}))
        manifest["spec"]["providerID"] = f"aws:///{AZ}/{instance}"
        manifest["spec"]["unschedulable"] = fenced
        manifest["status"]["nodeInfo"] = {"bootID": boot_id}
        with controlplane.http_client(self.kubeconfig) as http:
            r = http.post(
                "/api/v1/nodes", content=json.dumps(manifest), headers={"Content-Type": "application/json"}
            )
            assert r.status_code == 201, r.text
        controlplane.wait_nodes_ready(self.kubeconfig, [name], timeout=60)

    def join_group(self, group: str, pool: str, prefix: str) -> dict[str, str]:
        """A Node for each InService instance of the group: {node: instance}."""
        nodes = {f"{prefix}-{i}": iid for i, iid in enumerate(self.in_service(group))}
        for name, iid in nodes.items():
            self.join(name, iid, pool)
        return nodes

    def set_boot_id(self, name: str, boot_id: str) -> None:
        """The kubelet after a reboot: the Node's status carries the new boot's id."""
        patch = {"status": {"nodeInfo": {"bootID": boot_id}}}
        with controlplane.http_client(self.kubeconfig) as http:
            r = http.patch(
                f"/api/v1/nodes/{name}/status",
                content=json.dumps(patch),
                headers={"Content-Type": "application/strategic-merge-patch+json"},
            )
            assert r.status_code == 200, r.text


def new_cloud(env: dict[str, str], kubeconfig: Path) -> Cloud:
    ec2 = boto3.client(
        "ec2",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/20", AvailabilityZone=AZ)["Subnet"]["SubnetId"]
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    template = ec2.create_launch_template(
        LaunchTemplateName=f"gpu-{uuid.uuid4().hex[:8]}",
        LaunchTemplateData={"ImageId": ami, "InstanceType": "p5.48xlarge"},
    )["LaunchTemplate"]["LaunchTemplateId"]
    return Cloud(env, kubeconfig, subnet, template)


@pytest.fixture(scope="module")
def cloud(moto, cp) -> Cloud:
    return new_cloud(moto.env(), cp.kubeconfig)


def backend(cloud: Cloud, poll: float = 0.2) -> AwsBackend:
    return AwsBackend(CLUSTER, str(cloud.kubeconfig), poll=poll)


def cli(
    cloud: Cloud, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    argv = [
        AUTOHEAL,
        "pool",
        *args,
        "--backend",
        "aws",
        "--cluster",
        CLUSTER,
        "--kubeconfig",
        str(cloud.kubeconfig),
    ]
    return subprocess.run(
        argv,
        env={**os.environ, **(env or cloud.env)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- retire ------------------------------------------------------------------------------------


def test_retire_terminates_the_nodes_instance_keeps_the_size_and_a_second_retire_changes_nothing(
    cloud, aws_env
):
    group = cloud.group("ret", 2)
    nodes = cloud.join_group(group, "ret", "ret")
    victim, keep = "ret-0", "ret-1"

    [r] = backend(cloud).retire([victim])
    assert (r.ok, r.changed, r.instance) == (True, True, nodes[victim]), r
    assert r.extra == {"group": group, "pool": "ret"}
    assert cloud.state(nodes[victim]) in ("shutting-down", "terminated")
    assert cloud.state(nodes[keep]) == "running"  # never the wrong instance
    assert cloud.desired(group) == 2  # desired capacity kept: the group launches the replacement
    now = cloud.in_service(group)
    assert len(now) == 2 and nodes[victim] not in now and nodes[keep] in now

    # retried (after a crash, or by the play's second run): nothing terminated twice
    [again] = backend(cloud).retire([victim])
    assert (again.ok, again.changed) == (True, False) and "already retired" in again.detail, again
    assert cloud.in_service(group) == now


def test_a_retry_never_terminates_a_new_machine_that_took_the_nodes_name(cloud, aws_env):
    """A retire retried after the node's name came back on the replacement (EKS names nodes by
    private DNS name, which a new instance can reuse): the new Node is not fenced, so nothing is
    terminated, and its instance is not the one retired."""
    group = cloud.group("reuse", 1)
    [(name, first)] = cloud.join_group(group, "reuse", "reuse").items()
    [r] = backend(cloud).retire([name])
    assert r.ok and r.changed and r.instance == first
    controlplane.delete_node(cloud.kubeconfig, name)
    api = kube.core_api(str(cloud.kubeconfig))
    wait_for(lambda: kube.read_nodes(api, [name])[name] is None, 30, f"Node {name} deleted")
    [second] = wait_for(lambda: cloud.in_service(group), 30, "the replacement instance")
    cloud.join(name, second, "reuse", fenced=False)

    [again] = backend(cloud).retire([name])
    assert (again.ok, again.changed) == (False, False) and "not cordoned" in again.detail, again
    assert cloud.state(second) == "running"


def test_a_node_whose_instance_is_another_clusters_or_another_pools_is_refused(cloud, aws_env):
    foreign = cloud.group("fx", 1, cluster="someone-else")
    other_pool = cloud.group("fy", 1)  # this cluster, node group autoheal-fy
    [(f_node, f_iid)] = cloud.join_group(foreign, "fx", "fx").items()
    # a Node labelled pool fx whose instance is in the node group of pool fy
    [iid] = cloud.in_service(other_pool)
    cloud.join("fy-as-fx", iid, "fx")

    results = backend(cloud).retire([f_node, "fy-as-fx"])
    assert [(r.ok, r.changed) for r in results] == [(False, False), (False, False)]
    assert "eks:cluster-name=someone-else" in results[0].detail and "refused" in results[0].detail
    assert "eks:nodegroup-name=autoheal-fy" in results[1].detail
    assert cloud.state(f_iid) == cloud.state(iid) == "running"
    rb = backend(cloud).reboot([f_node], timeout=1)
    assert not rb[0].ok and "refused" in rb[0].detail


def test_a_node_without_an_aws_provider_id_is_a_result_naming_it(cloud, aws_env):
    manifest = controlplane.node_manifest(controlplane.KubeNodeSpec("no-pid", labels={lb.POOL_LABEL: "ret"}))
    with controlplane.http_client(cloud.kubeconfig) as http:
        assert http.post("/api/v1/nodes", content=json.dumps(manifest)).status_code == 201
    [r] = backend(cloud).retire(["no-pid"])
    assert not r.ok and "spec.providerID ''" in r.detail
    [gone] = backend(cloud).retire(["never-existed"])
    assert gone.ok and not gone.changed and "no such Node" in gone.detail


def test_cli_retire_waits_for_the_replacement_node_and_reports_it(cloud):
    group = cloud.group("rep", 2)
    nodes = cloud.join_group(group, "rep", "rep")
    before = set(nodes.values())
    stop = threading.Event()

    def bridge() -> None:  # the AWS-backed lab's bridge: a Node for each instance the group launches
        joined: set[str] = set()
        while not stop.is_set():
            for iid in set(cloud.in_service(group)) - before - joined:
                cloud.join(f"rep-new-{len(joined)}", iid, "rep")
                joined.add(iid)
            stop.wait(0.2)

    t = threading.Thread(target=bridge, daemon=True)
    t.start()
    try:
        run = cli(cloud, "retire", "--nodes", "rep-0", "--wait-replacement", "--timeout", "60", "--json")
    finally:
        stop.set()
        t.join(10)
    assert run.returncode == 0, run.stderr
    [r] = json.loads(run.stdout)
    assert r["ok"] and r["changed"] and r["extra"]["replacements"] == ["rep-new-0"], r

    status = cli(cloud, "status", "--pool", "rep", "--pool", "nope", "--json")
    assert status.returncode == 0, status.stderr
    rep, nope = json.loads(status.stdout)
    assert rep["ok"] and rep["counts"]["desired"] == rep["counts"]["ready_nodes"] == 2
    assert rep["members"] == ["rep-1", "rep-new-0"]
    assert not nope["ok"] and "autoheal-nope" in nope["detail"]


def test_a_replacement_that_never_arrives_is_not_ok_and_says_why(cloud):
    group = cloud.group("late", 1)
    cloud.join_group(group, "late", "late")
    run = cli(cloud, "retire", "--nodes", "late-0", "--wait-replacement", "--timeout", "2", "--json")
    assert run.returncode == 0, run.stderr
    [r] = json.loads(run.stdout)
    assert not r["ok"] and r["changed"], r
    assert "no replacement within 2s" in r["detail"] and "0 with a Ready Node" in r["detail"]


# --- reboot ------------------------------------------------------------------------------------


def test_reboot_is_ok_once_the_node_is_ready_with_a_new_boot_id(cloud, moto, aws_env, monkeypatch):
    group = cloud.group("rb", 2)
    cloud.join_group(group, "rb", "rb")
    # the proxy throttles nothing: it shows when RebootInstances reached the API
    with ThrottlingProxy(PROXY_PORT, moto.url, throttle=0) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        results: list[Any] = []
        t = threading.Thread(
            target=lambda: results.extend(backend(cloud).reboot(["rb-0", "rb-1"], timeout=60))
        )
        t.start()
        wait_for(lambda: "RebootInstances" in proxy.passed, 30, "RebootInstances")
        cloud.set_boot_id("rb-0", "boot-2")
        cloud.set_boot_id("rb-1", "boot-2")
        t.join(60)
    assert proxy.passed.count("RebootInstances") == 1  # one call for the batch
    assert [(r.node, r.ok, r.changed, r.extra["boot_id"]) for r in results] == [
        ("rb-0", True, True, "boot-2"),
        ("rb-1", True, True, "boot-2"),
    ]


def test_a_reboot_without_a_new_boot_id_fails_at_the_timeout(cloud):
    group = cloud.group("hang", 1)
    cloud.join_group(group, "hang", "hang")
    run = cli(cloud, "reboot", "--nodes", "hang-0", "--timeout", "2", "--json")
    assert run.returncode == 0, run.stderr
    [r] = json.loads(run.stdout)
    assert not r["ok"] and "within 2s" in r["detail"] and "same boot id" in r["detail"], r


# --- throttling and permissions ------------------------------------------------------------------


def test_throttling_is_retried_by_botocore_with_backoff(cloud, moto, aws_env, monkeypatch):
    group = cloud.group("thr", 1)
    cloud.join_group(group, "thr", "thr")
    with ThrottlingProxy(
        PROXY_PORT, moto.url, throttle=2, actions=("DescribeAutoScalingGroups", "DescribeInstances")
    ) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        [h] = backend(cloud).health(["thr"])
        # retire's reads: DescribeAutoScalingInstances then DescribeInstances (EC2's throttle body)
        proxy.left, proxy.actions = 2, ("DescribeInstances",)
        [r] = backend(cloud).retire(["thr-0"])
    assert h.ok, h
    assert r.ok and r.changed, r
    assert proxy.throttled == ["DescribeAutoScalingGroups"] * 2 + ["DescribeInstances"] * 2
    assert proxy.passed.count("TerminateInstanceInAutoScalingGroup") == 1

    # retries exhausted: the whole batch fails, one line, exit 2
    with ThrottlingProxy(PROXY_PORT, moto.url, throttle=10) as proxy:
        run = cli(
            cloud,
            "status",
            "--json",
            env={**cloud.env, "AWS_ENDPOINT_URL": proxy.url, "AWS_MAX_ATTEMPTS": "2"},
        )
    assert run.returncode == 2, run
    assert run.stderr.count("\n") == 1
    assert "autoscaling:DescribeAutoScalingGroups throttled (Throttling) after 2 attempts" in run.stderr
    assert len(proxy.throttled) == 2


@pytest.fixture(scope="module")
def iam_moto(tmp_path_factory) -> Iterator[MotoServer]:
    """moto enforcing IAM after its first 6 requests: those create an admin and a runner with
    their access keys and policies; every request after is authorized like AWS does."""
    server = MotoServer(
        DENY_PORT, tmp_path_factory.mktemp("moto-iam") / "moto.log", {"INITIAL_NO_AUTH_ACTION_COUNT": "6"}
    )
    with server:
        yield server


def test_access_denied_names_the_missing_iam_action(iam_moto, cp, tmp_path):
    env = iam_moto.env()
    iam = boto3.client(
        "iam",
        endpoint_url=iam_moto.url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    keys = {}
    policies = {
        "admin": ["*"],
        # the runner's read actions only: no ec2:RebootInstances, no TerminateInstanceInAutoScalingGroup
        "runner": [
            "ec2:DescribeInstances",
            "autoscaling:DescribeAutoScalingInstances",
            "autoscaling:DescribeAutoScalingGroups",
        ],
    }
    for user, actions in policies.items():
        iam.create_user(UserName=user)
        k = iam.create_access_key(UserName=user)["AccessKey"]
        doc = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}],
        }
        iam.put_user_policy(UserName=user, PolicyName="p", PolicyDocument=json.dumps(doc))
        keys[user] = {"AWS_ACCESS_KEY_ID": k["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": k["SecretAccessKey"]}
    admin = new_cloud({**env, **keys["admin"]}, cp.kubeconfig)
    group = admin.group("iam", 1)
    admin.join_group(group, "iam", "iam")
    runner = Cloud({**env, **keys["runner"]}, cp.kubeconfig, admin.subnet, admin.template)

    run = cli(runner, "reboot", "--nodes", "iam-0", "--timeout", "5", "--json")
    assert run.returncode == 2, run
    assert "access denied: the IAM role lacks ec2:RebootInstances" in run.stderr
    run = cli(runner, "retire", "--nodes", "iam-0", "--json")
    assert run.returncode == 2, run
    assert "access denied: the IAM role lacks autoscaling:TerminateInstanceInAutoScalingGroup" in run.stderr
    assert admin.state(admin.in_service(group)[0]) == "running"
    # reads are allowed: status works with the runner's keys
    status = cli(runner, "status", "--pool", "iam", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)[0]["ok"], status
    # through the role: the batch's one-line error is each node's reason, for the ladder to escalate
    changed, facts = run_role(runner, tmp_path, "reboot", ["iam-0"], check=False)
    assert changed == 0 and facts["rebooted"] == [], facts
    assert facts["reboot_failed"]["iam-0"].startswith(
        "error: access denied: the IAM role lacks ec2:RebootInstances"
    )


def test_the_kube_view_reads_what_backends_need(cloud):
    cloud.join_group(cloud.group("kv", 1), "kv", "kv")
    api = kube.core_api(str(cloud.kubeconfig))
    views = kube.read_nodes(api, ["kv-0", "absent"])
    assert views["absent"] is None
    v = views["kv-0"]
    assert (
        v
        and v.ready
        and v.unschedulable
        and v.pool == "kv"
        and v.boot_id == "boot-1"
        and v.provider_id.startswith(f"aws:///{AZ}/i-")
    )
    with pytest.raises(BackendError, match="no Kubernetes access"):
        kube.core_api(str(cloud.kubeconfig) + ".missing")


# --- the runbook's role ----------------------------------------------------------------------------


def run_role(
    cloud: Cloud, tmp: Path, tasks_from: str, nodes: list[str], check: bool, **extra: Any
) -> tuple[int, dict]:
    """roles/node_pool (tasks_from) with backend aws through ansible-playbook; the play's recap
    changed count and the facts the backend set."""
    from tests.runbook.conftest import RECAP_RE, REPO, VENV_BIN, ansible_env

    facts = tmp / f"facts-{tasks_from}-{check}-{uuid.uuid4().hex[:6]}.json"
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "tasks": [
                {
                    "ansible.builtin.include_role": {"name": "node_pool", "tasks_from": tasks_from},
                    "vars": {
                        "node_pool_backend": "aws",
                        "node_pool_nodes": nodes,
                        "node_pool_kubeconfig": str(cloud.kubeconfig),
                        "node_pool_aws_cluster": CLUSTER,
                        "node_pool_autoheal_cli": AUTOHEAL,
                        **extra,
                    },
                },
                {
                    "ansible.builtin.copy": {
                        "dest": str(facts),
                        "content": "{{ {'retired': node_pool_retired | default(None), 'skipped': node_pool_retire_skipped"
                        " | default(None), 'replacements': node_pool_replacements | default(None),"
                        " 'rebooted': node_pool_rebooted | default(None), 'reboot_failed': node_pool_reboot_failed"
                        " | default(None)} | to_json }}",
                    },
                    "check_mode": False,
                    "changed_when": False,
                },
            ],
        }
    ]
    path = tmp / f"play-{uuid.uuid4().hex[:6]}.yml"
    path.write_text(json.dumps(play))
    argv = [str(VENV_BIN / "ansible-playbook"), str(path)] + (["--check"] if check else [])
    res = subprocess.run(
        argv, cwd=REPO, env={**ansible_env(), **cloud.env}, capture_output=True, text=True, timeout=300
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    m = RECAP_RE.search(out)
    assert m, out[-2000:]
    return int(m.group(2)), json.loads(facts.read_text())


def test_the_node_pool_role_retires_through_aws_in_check_mode_then_once(cloud, tmp_path):
    group = cloud.group("play", 2)
    nodes = cloud.join_group(group, "play", "play")

    changed, facts = run_role(cloud, tmp_path, "retire", ["play-0"], check=True)
    assert changed == 0 and facts["retired"] == [] and facts["skipped"] == ["play-0"], facts
    assert cloud.state(nodes["play-0"]) == "running"  # check mode read only

    changed, facts = run_role(cloud, tmp_path, "retire", ["play-0"], check=False)
    assert changed == 1 and facts["retired"] == ["play-0"] and facts["skipped"] == [], facts
    assert cloud.state(nodes["play-0"]) in ("shutting-down", "terminated")
    assert cloud.desired(group) == 2

    changed, facts = run_role(cloud, tmp_path, "retire", ["play-0"], check=False)
    assert changed == 0 and facts["retired"] == [] and facts["skipped"] == ["play-0"], facts


def test_the_node_pool_role_reboot_through_aws_reports_the_failure_as_a_fact(cloud, tmp_path):
    group = cloud.group("playrb", 1)
    cloud.join_group(group, "playrb", "playrb")
    changed, facts = run_role(cloud, tmp_path, "reboot", ["playrb-0"], check=True)
    assert changed == 0 and facts["rebooted"] == [] and facts["reboot_failed"] == {}, facts
    # nobody reports a new boot id: the reboot was issued (changed) and the node is reported failed
    changed, facts = run_role(
        cloud, tmp_path, "reboot", ["playrb-0"], check=False, node_pool_reboot_timeout=2
    )
    assert changed == 1 and facts["rebooted"] == [], facts
    assert "within 2s" in facts["reboot_failed"]["playrb-0"], facts
