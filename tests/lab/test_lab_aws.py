"""The lab's AWS (lab.aws) without a whole lab: moto as a server process seeded with a pool's Auto
Scaling group, the bridge's view of launches and terminations, and the endpoint's proxy, which
passes every call through and reports an accepted RebootInstances. The whole flow on a lab is
tests/e2e/test_aws_replace.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoheal.errors import LabError
from lab import aws, procs
from lab.config import LabConfig, PoolConfig
from lab.pool import PoolController
from tests.support import port_base, wait_for

PORT_BASE = port_base(28400)


def _cfg(tmp_path: Path, **kw: object) -> LabConfig:
    pools = [PoolConfig(size=2, spares=1, headroom=2, backend="aws")]
    return LabConfig(name="awsunit", root=tmp_path / "labs", port_base=PORT_BASE, pools=pools, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"kube": False}, "set kube: true"),
        ({"real_nodes": 1}, "use slurm: host and real_nodes: 0, or backend: lab"),
    ],
)
def test_an_aws_pool_needs_kwok_nodes_on_kubernetes(tmp_path: Path, kw: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match="backend aws") as err:
        _cfg(tmp_path, **kw)
    assert says in str(err.value)


def test_reboot_targets_reads_only_an_ec2_reboot() -> None:
    form = "application/x-www-form-urlencoded; charset=utf-8"
    body = b"Action=RebootInstances&Version=2016-11-15&InstanceId.1=i-0abc&InstanceId.2=i-0def"
    assert aws.reboot_targets(body, form) == ["i-0abc", "i-0def"]
    assert aws.reboot_targets(b"Action=TerminateInstances&InstanceId.1=i-0abc", form) == []
    assert aws.reboot_targets(body, "application/x-amz-json-1.1") == []


def test_moto_seeded_bridge_and_endpoint(tmp_path: Path) -> None:
    """The group launched size + spares instances, each given to a first node; the bridge reports
    a replacement launch and the terminated node; the proxy answers as moto does and reports
    the reboot of the instances moto accepted."""
    cfg = _cfg(tmp_path)
    cfg.save()
    rebooted: list[list[str]] = []
    server = None
    try:
        seeded = aws.start(cfg)
        assert sorted(seeded) == ["gpu-1", "gpu-2", "gpu-3"]
        assert all(p.startswith(f"aws:///{aws.ZONE}/i-") for p in seeded.values())
        ec2, asg = aws.clients(cfg.url("moto"))
        group = aws.group_name(cfg, cfg.pools[0])
        tags = {
            t["Key"]: t["Value"] for t in asg.describe_auto_scaling_groups()["AutoScalingGroups"][0]["Tags"]
        }
        assert tags["eks:cluster-name"] == "awsunit" and tags["eks:nodegroup-name"] == "autoheal-h100"
        assert [r[1] for r in aws.pool_rows(cfg)] == [True]

        # the pool controller reads the seed, and leaves an aws node to the AWS API
        ctl = PoolController(cfg, 0)
        assert ctl.aws_nodes("h100") == seeded
        with pytest.raises(LabError, match="retire it through the AWS API"):
            ctl.retire("gpu-1")

        # the endpoint: moto's answers, and the reboot it accepted
        server = aws.serve_proxy(cfg, rebooted.append)
        ec2_proxy, asg_proxy = aws.clients(aws.endpoint(cfg))
        victim = aws.instance_of(seeded["gpu-1"])
        ec2_proxy.reboot_instances(InstanceIds=[victim])
        wait_for(lambda: rebooted, 5, "the reboot reported")
        assert rebooted == [[victim]]
        asg_proxy.terminate_instance_in_auto_scaling_group(
            InstanceId=victim, ShouldDecrementDesiredCapacity=False
        )
        state = ec2.describe_instances(InstanceIds=[victim])["Reservations"][0]["Instances"][0]["State"]
        assert state["Name"] == "terminated"

        # the bridge: the group's new instance is launched, gpu-1's instance terminated
        launched: list[tuple[str, str]] = []
        terminated: list[str] = []
        known = dict(seeded)
        bridge = aws.Bridge(
            cfg, lambda pool: known, lambda p, pid: launched.append((p, pid)), terminated.append
        )
        bridge.sync()
        after = aws.group_state(asg, group)
        assert after.desired == 3 and len(after.in_service) == 3
        (new,) = set(after.in_service) - {aws.instance_of(p) for p in seeded.values()}
        assert launched == [("h100", aws.provider_id(aws.ZONE, new))]
        assert terminated == ["gpu-1"]
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        procs.stop(cfg.run_dir, aws.SERVICE)


def test_the_proxy_says_when_moto_is_down(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    server = aws.serve_proxy(cfg, lambda ids: None)
    try:
        import httpx

        r = httpx.post(aws.endpoint(cfg), content=b"Action=DescribeInstances", timeout=10)
        assert r.status_code == 502 and "moto unreachable" in r.text
    finally:
        server.shutdown()
        server.server_close()
