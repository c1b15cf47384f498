"""The AWS pool backend: an EKS managed node group's instances, through EC2 and Auto Scaling.

- node -> instance through the Node's `spec.providerID` (`aws:///<az>/<instance-id>`), never
  alert text;
- scope: an instance is acted on only when EKS tagged it as this cluster's (`eks:cluster-name`)
  and as the node group of the node's own pool (`eks:nodegroup-name` = `autoheal-<pool>`), the
  scope of the IAM policy the stack writes (components/eks/platform.py);
- reboot: one RebootInstances call for the batch, then each Node must come back Ready with a new
  `status.nodeInfo.bootID` within the timeout;
- retire: the Auto Scaling state is read first (an instance already Terminating, terminated or
  gone is not terminated again: `changed=False`); the Node's providerID is read again just
  before TerminateInstanceInAutoScalingGroup(ShouldDecrementDesiredCapacity=False), one call
  per instance, issued concurrently; the group launches the replacement;
- throttling: botocore's own retry, "standard" mode (exponential backoff with jitter on
  Throttling/RequestLimitExceeded and 5xx), 8 attempts unless AWS_RETRY_MODE / AWS_MAX_ATTEMPTS
  say otherwise; no loop of ours;
- credentials, region and endpoint: boto3's own chain (AWS_REGION, AWS_ENDPOINT_URL, IRSA's
  AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE, instance profile).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

from pools import kube
from pools.base import BackendError, NodeResult, PoolHealth
from pools.registry import BackendOptions

# The tags EKS puts on a managed node group's instances and group, and the group of a pool:
# components/eks/platform.py and components/nodepool.py (a sibling layer; tests keep them equal).
CLUSTER_TAG: Final = "eks:cluster-name"
NODEGROUP_TAG: Final = "eks:nodegroup-name"
NODEGROUP_PREFIX: Final = "autoheal-"
DEFAULT_MAX_ATTEMPTS: Final = 8

PROVIDER_ID: Final = re.compile(r"^aws:///(?P<az>[a-z0-9-]+)/(?P<instance>i-[0-9a-f]{8,17})$")
ACCESS_DENIED: Final = frozenset(
    {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedAccess"}
)
THROTTLED: Final = frozenset(
    {"Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException"}
)
GONE_STATES: Final = frozenset({"shutting-down", "terminated"})


def node_group_name(pool: str) -> str:
    """The EKS managed node group of a pool (components/nodepool.py node_group_name)."""
    return f"{NODEGROUP_PREFIX}{pool}"


def instance_of(provider_id: str) -> str:
    """The instance id of an EC2 node's providerID, or ValueError naming what is wrong."""
    m = PROVIDER_ID.fullmatch(provider_id)
    if not m:
        raise ValueError(
            f"spec.providerID {provider_id!r} is not an EC2 instance's (aws:///<az>/i-<hex>):"
            " the node is not an AWS node, or its kubelet ran without the AWS cloud provider"
        )
    return m["instance"]


def describe_error(exc: Exception, action: str) -> str:
    """One line saying what failed and what to fix; an access denied names the IAM action."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, NoRegionError

    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code, msg = err.get("Code", "?"), err.get("Message", "")
        if code in ACCESS_DENIED:
            return (
                f"access denied: the IAM role lacks {action} ({code}: {msg});"
                " the stack's runner policy grants it on this cluster's node groups only"
            )
        if code in THROTTLED:
            tries = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) + 1
            return (
                f"{action} throttled ({code}) after {tries} attempts; retry later or raise AWS_MAX_ATTEMPTS"
            )
        return f"{action} failed: {code}: {msg}"
    if isinstance(exc, NoCredentialsError):
        return (
            f"{action}: no AWS credentials (IRSA: AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE;"
            " or AWS_PROFILE / an instance profile)"
        )
    if isinstance(exc, NoRegionError):
        return f"{action}: no AWS region: set AWS_REGION"
    if isinstance(exc, EndpointConnectionError):
        return f"{action}: AWS API unreachable ({exc})"
    return f"{action} failed: {exc}"


def _aws_failure() -> tuple[type[Exception], ...]:
    from botocore.exceptions import BotoCoreError, ClientError

    return (ClientError, BotoCoreError)


def _chunks(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield list(items[i : i + size])


@dataclass(frozen=True)
class Instance:
    """What EC2 and Auto Scaling say of one instance."""

    id: str
    state: str  # EC2: pending, running, shutting-down, terminated...
    tags: dict[str, str]
    group: str = ""  # its Auto Scaling group ("" when none)
    lifecycle: str = ""  # Auto Scaling: InService, Terminating...

    @property
    def gone(self) -> bool:
        return self.state in GONE_STATES or self.lifecycle.startswith("Terminat")


def retry_config() -> Any:
    """botocore's retry: standard mode unless AWS_RETRY_MODE says otherwise (adaptive adds
    client-side rate limiting), DEFAULT_MAX_ATTEMPTS unless AWS_MAX_ATTEMPTS."""
    from botocore.config import Config

    return Config(
        retries={
            "mode": os.environ.get("AWS_RETRY_MODE", "standard"),
            "total_max_attempts": int(os.environ.get("AWS_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS)),
        }
    )


class AwsBackend:
    """Reboot and retire the instances of one EKS cluster's autoheal node groups."""

    name = "aws"

    def __init__(
        self, cluster: str, kubeconfig: str | None = None, poll: float = 1.0, core_api: Any = None
    ) -> None:
        if not cluster:
            raise BackendError(
                "backend aws needs --cluster NAME: the EKS cluster whose instances (tag eks:cluster-name)"
                " it may act on"
            )
        import boto3

        self.cluster = cluster
        self.poll = poll
        self._kubeconfig = kubeconfig
        self._core = core_api
        try:
            session = boto3.session.Session()
            self.ec2 = session.client("ec2", config=retry_config())
            self.asg = session.client("autoscaling", config=retry_config())
        except _aws_failure() as exc:
            raise BackendError(describe_error(exc, "creating the AWS clients")) from exc

    # --- plumbing -----------------------------------------------------------------------------

    @property
    def core(self) -> Any:
        if self._core is None:
            self._core = kube.core_api(self._kubeconfig)
        return self._core

    def _call(self, client: Any, op: str, **kwargs: Any) -> Any:
        """One API call (botocore retries throttling); any failure stops the batch."""
        action = f"{client.meta.service_model.endpoint_prefix}:{op}"
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", op).lower()
        try:
            return getattr(client, snake)(**kwargs)
        except _aws_failure() as exc:
            raise BackendError(describe_error(exc, action)) from exc

    def instances(self, ids: Sequence[str]) -> dict[str, Instance]:
        """EC2 state, tags and Auto Scaling membership of the instances (missing ones left out)."""
        found: dict[str, Instance] = {}
        groups: dict[str, tuple[str, str]] = {}
        for chunk in _chunks(sorted(set(ids)), 50):
            resp = self._call(self.asg, "DescribeAutoScalingInstances", InstanceIds=chunk)
            for a in resp.get("AutoScalingInstances", []):
                groups[a["InstanceId"]] = (a["AutoScalingGroupName"], a["LifecycleState"])
            # a filter, not InstanceIds: an id AWS no longer knows is left out instead of failing
            pages = self.ec2.get_paginator("describe_instances").paginate(
                Filters=[{"Name": "instance-id", "Values": chunk}]
            )
            try:
                reservations = [r for page in pages for r in page.get("Reservations", [])]
            except _aws_failure() as exc:
                raise BackendError(describe_error(exc, "ec2:DescribeInstances")) from exc
            for r in reservations:
                for i in r.get("Instances", []):
                    group, lifecycle = groups.get(i["InstanceId"], ("", ""))
                    tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                    found[i["InstanceId"]] = Instance(
                        i["InstanceId"], i["State"]["Name"], tags, group, lifecycle
                    )
        return found

    def out_of_scope(self, inst: Instance, pool: str) -> str:
        """Why the instance is not this cluster's pool's (empty when it is)."""
        want = {CLUSTER_TAG: self.cluster, NODEGROUP_TAG: node_group_name(pool)}
        have = {k: inst.tags.get(k, "(none)") for k in want}
        if have == want:
            return ""
        return (
            f"refused: instance {inst.id} is tagged {CLUSTER_TAG}={have[CLUSTER_TAG]},"
            f" {NODEGROUP_TAG}={have[NODEGROUP_TAG]}, not {self.cluster}/{node_group_name(pool)}"
            " (this cluster's node group of the node's pool)"
        )

    def _targets(self, nodes: Sequence[str]) -> tuple[dict[str, NodeResult], dict[str, kube.NodeView]]:
        """The nodes' views; a node that cannot be mapped to an instance is already a result."""
        results: dict[str, NodeResult] = {}
        views: dict[str, kube.NodeView] = {}
        for name, v in kube.read_nodes(self.core, nodes).items():
            if v is None:
                continue
            if not v.pool:
                results[name] = NodeResult(
                    name, ok=False, detail="no autoheal.io/pool label: its pool is unknown"
                )
                continue
            try:
                instance_of(v.provider_id)
            except ValueError as exc:
                results[name] = NodeResult(name, ok=False, detail=str(exc))
                continue
            views[name] = v
        return results, views

    # --- reboot -------------------------------------------------------------------------------

    def reboot(self, nodes: Sequence[str], timeout: float) -> list[NodeResult]:
        results, views = self._targets(nodes)
        for name in nodes:
            if name not in results and name not in views:
                results[name] = NodeResult(name, ok=False, detail="no such Node")
        ids = {name: instance_of(v.provider_id) for name, v in views.items()}
        known = self.instances(list(ids.values()))
        batch: dict[str, str] = {}
        for name, iid in ids.items():
            inst = known.get(iid)
            why = (
                self.out_of_scope(inst, views[name].pool)
                if inst
                else f"instance {iid} not found in EC2 (terminated long ago?)"
            )
            if not why and inst and inst.state != "running":
                why = f"instance {iid} is {inst.state}, not running"
            if why:
                results[name] = NodeResult(name, ok=False, detail=why, instance=iid)
            else:
                batch[name] = iid
        if batch:
            self._call(self.ec2, "RebootInstances", InstanceIds=sorted(batch.values()))
            results.update(self._wait_rebooted(views, batch, timeout))
        return [results[n] for n in nodes]

    def _wait_rebooted(
        self, before: dict[str, kube.NodeView], batch: dict[str, str], timeout: float
    ) -> dict[str, NodeResult]:
        """Each Node Ready with a boot id other than before the reboot, within `timeout`."""
        start = time.monotonic()
        done: dict[str, NodeResult] = {}
        last: dict[str, kube.NodeView | None] = {}
        while True:
            pending = [n for n in batch if n not in done]
            last = kube.read_nodes(self.core, pending)
            for name, v in last.items():
                if v and v.ready and v.boot_id != before[name].boot_id:
                    secs = round(time.monotonic() - start, 1)
                    done[name] = NodeResult(
                        name,
                        ok=True,
                        changed=True,
                        detail=f"Ready after a new boot in {secs}s",
                        instance=batch[name],
                        extra={"boot_id": v.boot_id, "seconds": secs},
                    )
            if len(done) == len(batch) or time.monotonic() - start >= timeout:
                break
            time.sleep(self.poll)
        for name in batch:
            if name not in done:
                v = last.get(name)
                state = "gone" if v is None else ("Ready, same boot id" if v.ready else "not Ready")
                done[name] = NodeResult(
                    name,
                    ok=False,
                    changed=True,
                    instance=batch[name],
                    detail=f"rebooted, not back Ready with a new boot id within {timeout:g}s (Node {state})",
                )
        return done

    # --- retire -------------------------------------------------------------------------------

    def retire(self, nodes: Sequence[str], dry_run: bool = False) -> list[NodeResult]:
        """Terminate the nodes' instances in their groups (desired capacity kept); `dry_run`: read
        only, a node that would be retired is ok, unchanged, with `extra.would_retire`."""
        results, views = self._targets(nodes)
        for name in nodes:
            if name not in results and name not in views:
                results[name] = NodeResult(
                    name, ok=True, detail="no such Node: already retired (nothing maps it to an instance)"
                )
        for name, view in list(views.items()):
            if not view.unschedulable:
                # an unfenced node of that name is a new machine that reused it, never the failed one
                del views[name]
                results[name] = NodeResult(
                    name,
                    ok=False,
                    detail=f"refused: Node {name} is not cordoned: retire acts only on a fenced node",
                )
        ids = {name: instance_of(v.provider_id) for name, v in views.items()}
        known = self.instances(list(ids.values()))
        todo: dict[str, Instance] = {}
        for name, iid in ids.items():
            inst = known.get(iid)
            if inst is None or inst.gone:
                state = "gone" if inst is None else (inst.lifecycle or inst.state)
                results[name] = NodeResult(name, ok=True, instance=iid, detail=f"already retired ({state})")
            elif why := self.out_of_scope(inst, views[name].pool):
                results[name] = NodeResult(name, ok=False, instance=iid, detail=why)
            elif not inst.group:
                results[name] = NodeResult(
                    name,
                    ok=False,
                    instance=iid,
                    detail=f"refused: instance {iid} is in no Auto Scaling group: nothing would replace it",
                )
            else:
                todo[name] = inst
        # read the providerIDs again: a Node replaced (same name, new instance) since is not touched
        for name, v in kube.read_nodes(self.core, list(todo)).items():
            if v is None or v.provider_id != views[name].provider_id or not v.unschedulable:
                now = v.provider_id if v else "no Node"
                results[name] = NodeResult(
                    name,
                    ok=False,
                    instance=todo.pop(name).id,
                    detail=f"refused: the Node's providerID changed while retiring ({now}); retry",
                )
        if dry_run:
            for name, inst in todo.items():
                extra = {"group": inst.group, "pool": views[name].pool, "would_retire": True}
                detail = f"would terminate {inst.id} in {inst.group} (dry run)"
                results[name] = NodeResult(name, ok=True, instance=inst.id, detail=detail, extra=extra)
        else:
            results.update(self._terminate(todo, {n: views[n].pool for n in todo}))
        return [results[n] for n in nodes]

    def _terminate(self, todo: dict[str, Instance], pools: dict[str, str]) -> dict[str, NodeResult]:
        """TerminateInstanceInAutoScalingGroup per instance, concurrently, desired capacity kept."""

        def one(item: tuple[str, Instance]) -> NodeResult:
            name, inst = item
            try:
                self.asg.terminate_instance_in_auto_scaling_group(
                    InstanceId=inst.id, ShouldDecrementDesiredCapacity=False
                )
            except _aws_failure() as exc:
                detail = describe_error(exc, "autoscaling:TerminateInstanceInAutoScalingGroup")
                return NodeResult(name, ok=False, instance=inst.id, detail=detail)
            return NodeResult(
                name,
                ok=True,
                changed=True,
                instance=inst.id,
                detail=f"terminated in {inst.group} (desired capacity kept)",
                extra={"group": inst.group, "pool": pools[name]},
            )

        if not todo:
            return {}
        with ThreadPoolExecutor(max_workers=min(16, len(todo))) as pool:
            done = list(pool.map(one, todo.items()))
        if all(not r.ok and r.detail.startswith("access denied") for r in done):
            raise BackendError(done[0].detail)
        return {r.node: r for r in done}

    # --- health -------------------------------------------------------------------------------

    def _groups(self, names: Sequence[str] = ()) -> list[dict[str, Any]]:
        """This cluster's Auto Scaling groups (all, or those named)."""
        kwargs: dict[str, Any] = {"Filters": [{"Name": f"tag:{CLUSTER_TAG}", "Values": [self.cluster]}]}
        if names:
            kwargs["AutoScalingGroupNames"] = list(names)
        try:
            pages = self.asg.get_paginator("describe_auto_scaling_groups").paginate(**kwargs)
            return [g for page in pages for g in page.get("AutoScalingGroups", [])]
        except _aws_failure() as exc:
            raise BackendError(describe_error(exc, "autoscaling:DescribeAutoScalingGroups")) from exc

    def _group_states(self, names: Sequence[str]) -> list[Group]:
        """The named groups of this cluster, with the Ready Nodes of their InService instances."""
        if not names:
            return []
        nodes = {}
        for v in kube.list_nodes(self.core):
            m = PROVIDER_ID.fullmatch(v.provider_id)
            if m and v.ready:
                nodes[m["instance"]] = v.name
        out = []
        for g in self._groups(names):
            tags = {t["Key"]: t["Value"] for t in g.get("Tags", [])}
            states = [i["LifecycleState"] for i in g.get("Instances", [])]
            in_service = [
                i["InstanceId"] for i in g.get("Instances", []) if i["LifecycleState"] == "InService"
            ]
            out.append(
                Group(
                    name=g["AutoScalingGroupName"],
                    pool=tags.get(NODEGROUP_TAG, "").removeprefix(NODEGROUP_PREFIX),
                    desired=g["DesiredCapacity"],
                    min=g["MinSize"],
                    max=g["MaxSize"],
                    in_service=in_service,
                    pending=sum(s.startswith("Pending") for s in states),
                    terminating=sum(s.startswith("Terminat") for s in states),
                    nodes={i: nodes[i] for i in in_service if i in nodes},
                )
            )
        return out

    def health(self, pools: Sequence[str]) -> list[PoolHealth]:
        groups = [g for g in self._groups() if _tags(g).get(NODEGROUP_TAG, "").startswith(NODEGROUP_PREFIX)]
        by_pool = {
            _tags(g)[NODEGROUP_TAG].removeprefix(NODEGROUP_PREFIX): g["AutoScalingGroupName"] for g in groups
        }
        wanted = list(pools) or sorted(by_pool)
        found = {
            g.pool: g.health(self.name)
            for g in self._group_states([by_pool[p] for p in wanted if p in by_pool])
        }
        return [
            found.get(p)
            or PoolHealth(
                p,
                self.name,
                False,
                f"no Auto Scaling group tagged {CLUSTER_TAG}={self.cluster},"
                f" {NODEGROUP_TAG}={node_group_name(p)}",
            )
            for p in wanted
        ]


def _tags(group: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in group.get("Tags", [])}


@dataclass(frozen=True)
class Group:
    """One Auto Scaling group as the backend sees it: its counts and its nodes."""

    name: str
    pool: str
    desired: int
    min: int
    max: int
    in_service: list[str]
    pending: int
    terminating: int
    nodes: dict[str, str]  # InService instance -> its Ready Node

    @property
    def ok(self) -> bool:
        return len(self.in_service) == len(self.nodes) == self.desired

    def describe(self) -> str:
        return (
            f"group {self.name}: {len(self.in_service)}/{self.desired} InService,"
            f" {len(self.nodes)} with a Ready Node"
        )

    def health(self, backend: str) -> PoolHealth:
        counts = {
            "desired": self.desired,
            "min": self.min,
            "max": self.max,
            "in_service": len(self.in_service),
            "pending": self.pending,
            "terminating": self.terminating,
            "ready_nodes": len(self.nodes),
        }
        return PoolHealth(self.pool, backend, self.ok, self.describe(), counts, sorted(self.nodes.values()))


def from_options(opts: BackendOptions) -> AwsBackend:
    """The registry's factory (pools/registry.py): `--cluster` and `--kubeconfig`."""
    return AwsBackend(opts.cluster, opts.kubeconfig or None)
