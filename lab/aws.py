"""The lab's AWS: EC2 and Auto Scaling served by moto as a server process, and the bridge that
makes the instances it launches lab nodes.

A pool with `backend: aws` is an EKS managed node group as the AWS backend (pools/aws.py) sees
one: an Auto Scaling group tagged `eks:cluster-name=<lab name>` and
`eks:nodegroup-name=autoheal-<pool>` (the backend's own names), desired capacity = size +
spares, launched from a launch template into a subnet of a VPC. The backend talks to it through
the real AWS wire protocol (boto3 with AWS_ENDPOINT_URL), never to the lab.

What moto does not do, the lab does (lab.pool runs both, so one process owns the pool's state):

- the bridge: each InService instance of a group that no lab node stands for becomes one (the
  pool's next free name; a KWOK node whose `spec.providerID` is `aws:///<az>/<instance-id>` and a
  host slurmd registered drained "joining", as a real instance's bootstrap would register it); a
  node whose instance left the group (terminated) is removed as the lab removes a retired node;
- reboots: moto records nothing a client can see of RebootInstances, so the endpoint the lab's
  clients use is a loopback proxy in front of moto that forwards every request unchanged and,
  once moto accepted a RebootInstances, reboots the lab nodes of those instances (slurmd stops
  and registers again, the GPUs come back clean) and gives each Node a new boot id.

What differs from an AWS account: instances are InService the moment they launch (the pool's
`provision_delay` stands for the boot), there is no IAM evaluation (any credentials pass), and
no instance runs anything: the bridge is what a node's bootstrap script and kubelet would be.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from autoheal.errors import LabError
from lab import procs
from lab.config import LabConfig, PoolConfig
from lab.httpd import LabHTTPServer
from pools.aws import CLUSTER_TAG, NODEGROUP_TAG, node_group_name

SERVICE = "moto"  # the lab service (PID file, log) of moto's server
REGION = "us-east-1"
ZONE = "us-east-1a"
# moto takes any credentials; these only have to be there for botocore to sign
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "autoheal-lab", "AWS_SECRET_ACCESS_KEY": "autoheal-lab"}
INSTANCE_TYPE = "p5.48xlarge"
IMAGE_ID = "ami-12c6146b"  # one of moto's default images
START_TIMEOUT = 30.0
# the request headers the proxy does not pass on (hop-by-hop; it sets its own Host and length)
HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "host", "content-length"})


def enabled(cfg: LabConfig) -> bool:
    return bool(cfg.aws_pools)


def endpoint(cfg: LabConfig) -> str:
    """The AWS endpoint the lab's clients (the runner's plays, `autoheal pool`) use: the proxy."""
    return cfg.url("aws")


def client_env(cfg: LabConfig) -> dict[str, str]:
    """The environment that points boto3 (and the AWS CLI) at the lab's AWS."""
    return {
        "AWS_ENDPOINT_URL": endpoint(cfg),
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",  # never ask an instance metadata service for credentials
        **CREDENTIALS,
    }


def clients(url: str) -> tuple[Any, Any]:
    """(ec2, autoscaling) boto3 clients on `url`."""
    import boto3

    kw: dict[str, Any] = {
        "endpoint_url": url,
        "region_name": REGION,
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    }
    return boto3.client("ec2", **kw), boto3.client("autoscaling", **kw)


def group_name(cfg: LabConfig, pool: PoolConfig) -> str:
    """The pool's Auto Scaling group, named as EKS names a managed node group's."""
    return f"eks-{node_group_name(pool.name)}-{cfg.name}"


def provider_id(zone: str, instance: str) -> str:
    return f"aws:///{zone}/{instance}"


def instance_of(provider: str) -> str:
    return provider.rsplit("/", 1)[-1]


def instances_file(cfg: LabConfig) -> Path:
    """{node: providerID} of the nodes that exist at start (lab.pool reads it once)."""
    return cfg.run_dir / "aws" / "instances.json"


# -- moto and its seed ---------------------------------------------------------------------------


def start(cfg: LabConfig) -> dict[str, str]:
    """Start moto's server, create each aws pool's VPC, subnet, launch template and Auto Scaling
    group, and give the pool's first nodes (actives, then spares) the instances the group
    launched. Returns {node: providerID} (also written to instances_file)."""
    port = cfg.port("moto")
    procs.start_service(
        SERVICE,
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        cfg.run_dir,
        port=port,
        ready=procs.http_ok(cfg.url("moto", "/moto-api/")),
        timeout=START_TIMEOUT,
    )
    ec2, asg = clients(cfg.url("moto"))
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/18", AvailabilityZone=ZONE)["Subnet"]
    nodes: dict[str, str] = {}
    for pool in cfg.aws_pools:
        nodes.update(_seed_pool(cfg, pool, ec2, asg, subnet["SubnetId"]))
    path = instances_file(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nodes, indent=1))
    return nodes


def _seed_pool(cfg: LabConfig, pool: PoolConfig, ec2: Any, asg: Any, subnet: str) -> dict[str, str]:
    template = f"{node_group_name(pool.name)}-{cfg.name}"
    ec2.create_launch_template(
        LaunchTemplateName=template, LaunchTemplateData={"ImageId": IMAGE_ID, "InstanceType": INSTANCE_TYPE}
    )
    declared = pool.size + pool.spares
    tags = {CLUSTER_TAG: cfg.name, NODEGROUP_TAG: node_group_name(pool.name)}
    asg.create_auto_scaling_group(
        AutoScalingGroupName=group_name(cfg, pool),
        LaunchTemplate={"LaunchTemplateName": template, "Version": "$Latest"},
        MinSize=declared,
        MaxSize=declared + pool.headroom,
        DesiredCapacity=declared,
        VPCZoneIdentifier=subnet,
        Tags=[{"Key": k, "Value": v, "PropagateAtLaunch": True} for k, v in tags.items()],
    )
    live = group_state(asg, group_name(cfg, pool)).in_service
    sp = pool.slurm()
    first = sp.active_nodes() + sp.spare_nodes()
    if len(live) != len(first):
        raise LabError(f"aws: group {group_name(cfg, pool)} launched {len(live)} instances, not {len(first)}")
    return {
        node: provider_id(zone, iid) for node, (iid, zone) in zip(first, sorted(live.items()), strict=True)
    }


@dataclass(frozen=True)
class GroupState:
    """One Auto Scaling group as DescribeAutoScalingGroups shows it."""

    name: str
    desired: int
    in_service: dict[str, str]  # instance -> its availability zone
    other: dict[str, str]  # instance -> lifecycle state (Pending, Terminating...)


def group_state(asg: Any, name: str) -> GroupState:
    found = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    if not found:
        raise LabError(f"aws: Auto Scaling group {name} does not exist (was moto restarted?)")
    g = found[0]
    in_service = {
        i["InstanceId"]: i["AvailabilityZone"] for i in g["Instances"] if i["LifecycleState"] == "InService"
    }
    other = {
        i["InstanceId"]: i["LifecycleState"] for i in g["Instances"] if i["InstanceId"] not in in_service
    }
    return GroupState(name, int(g["DesiredCapacity"]), in_service, other)


def pool_rows(cfg: LabConfig) -> list[tuple[str, bool, str]]:
    """(row, healthy, detail) per pool for `autoheal lab status`: its backend, and for aws its
    group's desired and InService counts."""
    rows: list[tuple[str, bool, str]] = []
    asg = clients(cfg.url("moto"))[1] if enabled(cfg) else None
    for p in cfg.pools:
        if p.backend != "aws" or asg is None:
            rows.append((f"pool/{p.name}", True, f"backend {p.backend}: the lab's pool controller"))
            continue
        try:
            g = group_state(asg, group_name(cfg, p))
        except Exception as exc:  # moto down: the row says so, status goes on
            rows.append((f"pool/{p.name}", False, f"backend aws: {str(exc)[:150]}"))
            continue
        detail = f"backend aws: group {g.name} desired {g.desired}, {len(g.in_service)} InService"
        if g.other:
            detail += f", {len(g.other)} other ({', '.join(sorted(set(g.other.values())))})"
        rows.append((f"pool/{p.name}", len(g.in_service) == g.desired, detail))
    return rows


# -- the bridge ----------------------------------------------------------------------------------


class Bridge:
    """Reads each aws pool's group and says what changed since the last look: instances that no
    lab node stands for (`launched`) and lab nodes whose instance left the group (`terminated`).
    `known` gives {node: providerID} of the lab's nodes of a pool (pending ones included)."""

    def __init__(
        self,
        cfg: LabConfig,
        known: Callable[[str], dict[str, str]],
        launched: Callable[[str, str], None],
        terminated: Callable[[str], None],
    ) -> None:
        self.cfg = cfg
        self.known = known
        self.launched = launched
        self.terminated = terminated
        self.asg = clients(cfg.url("moto"))[1]

    def sync(self) -> None:
        for pool in self.cfg.aws_pools:
            group = group_state(self.asg, group_name(self.cfg, pool))
            known = self.known(pool.name)
            have = {instance_of(pid) for pid in known.values()}
            for iid, zone in sorted(group.in_service.items()):
                if iid not in have:
                    self.launched(pool.name, provider_id(zone, iid))
            for node, pid in sorted(known.items()):
                if instance_of(pid) not in group.in_service:
                    self.terminated(node)


# -- the endpoint: a proxy in front of moto ------------------------------------------------------


def reboot_targets(body: bytes, content_type: str) -> list[str]:
    """The instance ids of an EC2 RebootInstances call (the query protocol's form body), else []."""
    if "x-www-form-urlencoded" not in content_type:
        return []
    form = urllib.parse.parse_qs(body.decode(errors="replace"))
    if form.get("Action") != ["RebootInstances"]:
        return []
    return [v[0] for k, v in sorted(form.items()) if k.startswith("InstanceId.")]


def proxy_handler(moto_port: int, on_reboot: Callable[[list[str]], None]) -> type[BaseHTTPRequestHandler]:
    """Requests forwarded byte for byte to moto, its answers back unchanged; a RebootInstances that
    moto accepted (200) calls `on_reboot(instance ids)` after the answer went out, as AWS reboots
    after it answered."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _forward(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(size) if size else b""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
            headers["Host"] = self.headers.get("Host") or f"127.0.0.1:{moto_port}"
            conn = http.client.HTTPConnection("127.0.0.1", moto_port, timeout=60)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
            except OSError as exc:
                msg = f"lab aws proxy: moto unreachable: {exc}".encode()
                self.send_response(502)
                self.send_header("Content-Length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)
                return
            finally:
                conn.close()
            self.send_response(r.status, r.reason)
            for k, v in r.getheaders():
                if k.lower() not in HOP_HEADERS:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
            targets = reboot_targets(body, self.headers.get("Content-Type") or "")
            if r.status == 200 and targets:
                on_reboot(targets)

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

    return Handler


def serve_proxy(cfg: LabConfig, on_reboot: Callable[[list[str]], None]) -> LabHTTPServer:
    """Bind the endpoint (loopback, cfg.port("aws")) and serve it from a thread."""
    server = LabHTTPServer(("127.0.0.1", cfg.port("aws")), proxy_handler(cfg.port("moto"), on_reboot))
    threading.Thread(target=server.serve_forever, daemon=True, name="aws-proxy").start()
    return server


def new_boot_ids(nodes: Sequence[str]) -> dict[str, str]:
    import uuid

    return {n: str(uuid.uuid4()) for n in nodes}
