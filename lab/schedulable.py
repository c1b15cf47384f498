"""Prove that a stack can schedule: what it declares, applied to a real API server whose nodes are
shaped like the nodes the stack asks for, with the real kube-scheduler deciding.

A cloud stack cannot be deployed here (no AWS account), and a rollout that cannot schedule only
says so as a timeout, minutes into `pulumi up`. The proof takes the resources a stack's program
declares (review/mockstack.py records them under Pulumi mocks: the AWS side simulated, every
Kubernetes object the real rendering) and:

1. shapes one KWOK node per instance the stack asks for: each EKS node group's instance type
   (components.instances: capacity, the EKS AMI's allocatable), its labels and taints; a pool's
   spares also carry the spare label and taint, as the runbook's pool keeper sets them. A stack
   on an existing cluster (no node groups) gets its pools' nodes from their descriptions and one
   untainted node for system pods, which `autoheal preflight` checks the real cluster has;
2. applies every Kubernetes object (server-side, as the provider does) to a fresh control plane:
   the API server's validation and admission judge them as they would on the cluster;
3. plays the cluster's controllers that are not Kubernetes' own: a StorageClass's provisioner (a
   volume for each claim whose class the stack declares or the cluster is known to have) and a
   device plugin, which advertises its resource (nvidia.com/gpu, vpc.amazonaws.com/efa) only on
   the nodes where the scheduler put one of its pods (a DaemonSet annotated
   autoheal.io/advertises), in the amount the instance type has;
4. waits until every pod is bound or the scheduler has settled, and reports each pod that is not
   with the scheduler's own reason (an untolerated taint, an insufficient resource, an unbound
   claim), each workload without its pods, each claim without a class, each image not pinned by
   digest.

What it cannot prove is said in the report's notes: objects of a CRD the cluster lacks (the
Prometheus Operator's), Helm releases (their manifests are rendered by the provider), and the
cluster's own prerequisites assumed for a stack on an existing cluster.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from autoheal import labels as lb
from components.instances import instance_type
from lab import controlplane

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
K8S_PREFIX = "kubernetes:"
_EKS_EFFECTS = {
    "NO_SCHEDULE": "NoSchedule",
    "PREFER_NO_SCHEDULE": "PreferNoSchedule",
    "NO_EXECUTE": "NoExecute",
}
# Kinds applied before the rest, so what refers to them finds them.
_FIRST = ("Namespace", "CustomResourceDefinition", "PriorityClass", "StorageClass", "ServiceAccount")
_WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")
# The scheduler retries an unschedulable pod after at most its maximum back-off (10 s): a verdict
# is final once nothing changed for longer than that.
SETTLE_S = 12.0
_APPLY_WORKERS = 8
SYSTEM_NODE = "system"  # the node a stack on an existing cluster assumes for its system pods
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
ASSUMED_DEFAULT_CLASS = "existing-cluster-default"


@dataclass(frozen=True)
class NodeShape:
    """`count` nodes alike: where they come from, labels, taints and resources."""

    name: str
    count: int
    source: str
    labels: dict[str, str]
    taints: list[dict[str, str]]
    capacity: dict[str, str]
    allocatable: dict[str, str]
    devices: dict[str, int]  # what device plugins advertise here once they run


@dataclass(frozen=True)
class Finding:
    kind: str  # pod | workload | claim | image | apply
    object: str
    problem: str


@dataclass
class Report:
    nodes: list[NodeShape] = field(default_factory=list)
    pods_bound: int = 0
    pods_total: int = 0
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "nodes": [asdict(n) for n in self.nodes],
            "pods": {"bound": self.pods_bound, "total": self.pods_total},
            "findings": [asdict(f) for f in self.findings],
            "notes": self.notes,
            "seconds": round(self.seconds, 1),
        }

    def text(self) -> str:
        lines = [f"{n.count:>4} x {n.name:<28} {n.source}" for n in self.nodes]
        lines.append(f"pods bound: {self.pods_bound} of {self.pods_total} ({self.seconds:.0f} s)")
        lines += [f"FAIL {f.kind:<8} {f.object}: {f.problem}" for f in self.findings]
        lines += [f"note: {n}" for n in self.notes]
        lines.append("schedulable" if self.ok else f"NOT schedulable: {len(self.findings)} finding(s)")
        return "\n".join(lines)


# --- what the stack declares -----------------------------------------------------------------

Row = Mapping[str, Any]  # one recorded resource: review.mockstack's dump() format


def k8s_objects(rows: Iterable[Row]) -> tuple[list[dict[str, Any]], list[str]]:
    """The Kubernetes objects among the declared resources, as manifests; and what was left out."""
    objects: list[dict[str, Any]] = []
    skipped: list[str] = []
    for row in rows:
        typ = str(row["type"])
        if not typ.startswith(K8S_PREFIX) or not row.get("custom", True):
            continue
        group_version, kind = typ[len(K8S_PREFIX) :].rsplit(":", 1)
        if kind.endswith(("Patch", "List")) or group_version.startswith(("helm.sh/", "yaml/", "kustomize/")):
            skipped.append(f"{kind} {row['name']}: rendered by the provider, not proven here")
            continue
        if group_version == "providers" or typ.startswith("pulumi:"):
            continue
        api_version = group_version.removeprefix("core/")
        obj = {k: v for k, v in dict(row["inputs"]).items() if k not in ("apiVersion", "kind")}
        meta = dict(obj.get("metadata") or {})
        meta.setdefault("name", row["name"])  # Pulumi's auto-name, less its random suffix
        obj["metadata"] = meta
        objects.append({"apiVersion": api_version, "kind": kind, **obj})
    order = {k: i for i, k in enumerate(_FIRST)}
    objects.sort(key=lambda o: order.get(o["kind"], len(order)))
    return objects, skipped


def node_shapes(rows: Sequence[Row]) -> list[NodeShape]:
    """One shape per EKS node group (its pools' spares apart), else per pool plus a system node."""
    pools = _pool_descriptions(rows)
    groups = [r for r in rows if r["type"] == NODE_GROUP]
    if not groups:
        return [*(_pool_shapes(p) for p in pools.values()), _system_shape()]
    shapes: list[NodeShape] = []
    for g in groups:
        inputs = g["inputs"]
        itype = instance_type(str((inputs.get("instanceTypes") or ["?"])[0]))
        count = int(inputs["scalingConfig"]["desiredSize"])
        labels = dict(inputs.get("labels") or {})
        taints = [
            {
                k: v
                for k, v in (
                    ("key", t["key"]),
                    ("value", t.get("value")),
                    ("effect", _EKS_EFFECTS[t["effect"]]),
                )
                if v
            }
            for t in inputs.get("taints") or []
        ]
        name = str(inputs.get("nodeGroupName") or g["name"])
        group = NodeShape(
            name=name,
            count=count,
            source=f"node group {name} ({itype.name})",
            labels=labels,
            taints=taints,
            capacity=itype.capacity(),
            allocatable=itype.allocatable(),
            devices=itype.device_resources(),
        )
        pool = pools.get(labels.get(lb.POOL_LABEL, ""))
        spares = min(int(pool["spares"]), count) if pool else 0
        if count - spares:
            shapes.append(replace(group, count=count - spares))
        if spares:
            spare_labels = {**labels, lb.SPARE_LABEL: "true"}
            spare_taints = [*taints, lb.spare_taint()]
            shapes.append(
                replace(group, name=f"{name}-spare", count=spares, labels=spare_labels, taints=spare_taints)
            )
    return shapes


def _pool_descriptions(rows: Iterable[Row]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["type"] != "kubernetes:core/v1:ConfigMap":
            continue
        data = (r["inputs"].get("data") or {}).get("pool.json")
        if data:
            pool = json.loads(data)
            out[str(pool["name"])] = pool
    return out


def _pool_shapes(pool: Mapping[str, Any]) -> NodeShape:
    """A pool on an existing cluster: the nodes its description names (spares folded in: their
    extra taint is tolerated by the same pods), sized as the pool tells Slurm."""
    cpus = str(pool.get("cpus", 192))
    memory = f"{int(pool.get('realMemoryMb', 2_097_152))}Mi"
    capacity = {"cpu": cpus, "memory": memory, "pods": "110"}
    return NodeShape(
        name=f"pool-{pool['name']}",
        count=int(pool["desiredNodes"]),
        source=f"pool {pool['name']} on the existing cluster (its description)",
        labels=dict(pool.get("nodeLabels") or {}),
        taints=[dict(t) for t in pool.get("taints") or []],
        capacity=capacity,
        allocatable=dict(capacity),
        devices={lb.GPU_RESOURCE: int(pool["gpusPerNode"])},
    )


def _system_shape() -> NodeShape:
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    return NodeShape(
        name=SYSTEM_NODE,
        count=1,
        source="assumed: the existing cluster's node for system pods (autoheal preflight checks it)",
        labels={},
        taints=[],
        capacity=capacity,
        allocatable=dict(capacity),
        devices={},
    )


def static_findings(
    objects: Sequence[Mapping[str, Any]], cluster_classes: Iterable[str] = ()
) -> list[Finding]:
    """What needs no scheduler: images by digest, claims naming a class that exists."""
    classes = {str(o["metadata"]["name"]) for o in objects if o["kind"] == "StorageClass"}
    classes |= set(cluster_classes)
    has_default = any(_is_default_class(o) for o in objects)
    findings: list[Finding] = []
    for obj in objects:
        ref = _ref(obj)
        spec = _pod_spec(obj) or {}
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            if "@sha256:" not in str(c.get("image", "")):
                problem = f"container {c.get('name')}: {c.get('image')} is not pinned by digest"
                findings.append(Finding("image", ref, problem))
        for claim_name, claim_spec in _claims(obj):
            cls = claim_spec.get("storageClassName")
            where = f"{ref} {claim_name}".strip()
            if cls is None and not has_default:
                problem = "names no StorageClass and the stack declares no default one"
                findings.append(Finding("claim", where, problem))
            elif cls and cls not in classes:
                problem = f"StorageClass {cls!r} is declared neither by the stack nor by the cluster"
                findings.append(Finding("claim", where, problem))
    return findings


def _is_default_class(obj: Mapping[str, Any]) -> bool:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return obj["kind"] == "StorageClass" and annotations.get(DEFAULT_CLASS_ANNOTATION) == "true"


def assumed_objects(rows: Sequence[Row]) -> tuple[list[dict[str, Any]], list[str]]:
    """What a stack on an existing cluster takes from that cluster, stood in for in the proof: a
    default StorageClass (claims naming none get it). Preflight checks the real one exists."""
    if any(r["type"] == NODE_GROUP for r in rows):
        return [], []
    default_class = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": ASSUMED_DEFAULT_CLASS, "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
        "provisioner": "existing-cluster.invalid/default",
    }
    notes = [
        "assumed: the existing cluster has a default StorageClass for claims naming none "
        "(autoheal preflight checks it)",
        "the pools' nodes are sized as the pool description says, not as the cluster's nodes are "
        "(autoheal preflight checks a Guaranteed slurmd fits them)",
    ]
    return [default_class], notes


def _ref(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{obj['kind']} {ns + '/' if ns else ''}{meta.get('name')}"


def _pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    if obj["kind"] == "Pod":
        return obj.get("spec") or {}
    if obj["kind"] in (*_WORKLOADS, "Job", "ReplicaSet"):
        return ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    if obj["kind"] == "CronJob":
        spec: Mapping[str, Any] = obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        return spec
    return None


def _claims(obj: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    if obj["kind"] == "PersistentVolumeClaim":
        return [("", obj.get("spec") or {})]
    if obj["kind"] == "StatefulSet":
        return [
            (t["metadata"]["name"], t.get("spec") or {})
            for t in obj["spec"].get("volumeClaimTemplates") or []
        ]
    return []


# --- the cluster ---------------------------------------------------------------------------


def prove(
    rows: Sequence[Row],
    run_dir: Path,
    port_base: int,
    timeout: float = 120.0,
    cluster_classes: Iterable[str] = (),
) -> Report:
    """Start a control plane in `run_dir`, prove the stack on it, stop it; the Report."""
    started = time.monotonic()
    report = Report(nodes=node_shapes(rows))
    objects, report.notes = k8s_objects(rows)
    assumed, notes = assumed_objects(rows)
    objects, report.notes = [*assumed, *objects], [*notes, *report.notes]
    report.findings += static_findings(objects, cluster_classes)
    handle = controlplane.start_control_plane(run_dir, [], port_base, timeout=timeout)
    try:
        _add_nodes(handle.kubeconfig, report.nodes, timeout)
        crds = _served_kinds(handle.kubeconfig)
        applied = [o for o in objects if _builtin(o) or o["apiVersion"] in crds]
        report.notes += [
            f"{_ref(o)}: its CRD ({o['apiVersion']}) is not in the cluster, not applied"
            for o in objects
            if o not in applied
        ]
        report.findings += _apply(handle.kubeconfig, applied)
        with controlplane.http_client(handle.kubeconfig, pool=4) as http:
            _settle(http, report, objects, set(cluster_classes), time.monotonic() + timeout)
    finally:
        controlplane.stop_control_plane(run_dir)
    report.seconds = time.monotonic() - started
    return report


_BUILTIN_GROUPS = (
    "apps", "batch", "policy", "rbac.authorization.k8s.io", "storage.k8s.io", "networking.k8s.io",
    "scheduling.k8s.io", "coordination.k8s.io", "autoscaling", "admissionregistration.k8s.io",
    "apiextensions.k8s.io", "discovery.k8s.io", "node.k8s.io", "certificates.k8s.io",
)  # fmt: skip


def _builtin(obj: Mapping[str, Any]) -> bool:
    api_version = str(obj["apiVersion"])
    return "/" not in api_version or api_version.split("/")[0] in _BUILTIN_GROUPS


def _served_kinds(kubeconfig: Path) -> set[str]:
    """apiVersions of the custom resources this cluster serves (none, unless the stack adds CRDs)."""
    with controlplane.http_client(kubeconfig, pool=1) as http:
        r = http.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
        r.raise_for_status()
        return {
            f"{c['spec']['group']}/{v['name']}"
            for c in r.json().get("items", [])
            for v in c["spec"]["versions"]
        }


def _add_nodes(kubeconfig: Path, shapes: Sequence[NodeShape], timeout: float) -> None:
    specs = []
    for shape in shapes:
        for i in range(shape.count):
            cap, alloc = shape.capacity, shape.allocatable
            specs.append(
                controlplane.KubeNodeSpec(
                    name=f"{shape.name}-{i}",
                    labels=shape.labels,
                    taints=shape.taints,
                    gpus=0,  # a device plugin advertises them (_advertise)
                    cpu=cap["cpu"],
                    memory=cap["memory"],
                    pods=int(cap["pods"]),
                    allocatable=alloc,
                )
            )
    controlplane.add_nodes(kubeconfig, specs, timeout=timeout)


def _apply(kubeconfig: Path, objects: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """Server-side apply (as the provider does), one request per object so each refusal names its
    object: the API server's validation and admission are the judges. What others refer to
    (namespaces, classes, accounts) goes first, in order; the rest at once."""
    first = [o for o in objects if o["kind"] in _FIRST]
    rest = [o for o in objects if o["kind"] not in _FIRST]
    with controlplane.http_client(kubeconfig, pool=_APPLY_WORKERS) as http:
        versions = {str(o["apiVersion"]) for o in objects}
        served = {v: _discover(http, v) for v in versions}

        def apply(obj: Mapping[str, Any]) -> Finding | None:
            api_version, kind = str(obj["apiVersion"]), str(obj["kind"])
            if kind not in served[api_version]:
                return Finding("apply", _ref(obj), f"the API server serves no {kind} in {api_version}")
            plural, namespaced = served[api_version][kind]
            meta = obj["metadata"]
            prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            where = f"/namespaces/{meta.get('namespace') or 'default'}" if namespaced else ""
            r = http.patch(
                f"{prefix}{where}/{plural}/{meta['name']}",
                params={"fieldManager": "autoheal-proof", "force": "true"},
                content=json.dumps(obj),
                headers={"Content-Type": "application/apply-patch+yaml"},
            )
            if r.status_code < 300:
                return None
            message = r.json().get("message", r.text) if r.text.startswith("{") else r.text
            return Finding("apply", _ref(obj), f"the API server refused it: {message[:500]}")

        results = [apply(o) for o in first]
        with ThreadPoolExecutor(max_workers=_APPLY_WORKERS) as pool:
            results += list(pool.map(apply, rest))
    return [f for f in results if f is not None]


def _discover(http: httpx.Client, api_version: str) -> dict[str, tuple[str, bool]]:
    """kind -> (resource name, namespaced) for one API group version."""
    r = http.get("/api/v1" if api_version == "v1" else f"/apis/{api_version}")
    if r.status_code == 404:
        return {}
    r.raise_for_status()
    return {
        str(res["kind"]): (str(res["name"]), bool(res["namespaced"]))
        for res in r.json().get("resources", [])
        if "/" not in res["name"]  # subresources
    }


@dataclass
class _State:
    pods: list[dict[str, Any]]
    signature: str


def _settle(
    http: httpx.Client,
    report: Report,
    objects: Sequence[Mapping[str, Any]],
    classes: set[str],
    deadline: float,
) -> None:
    """Play provisioners and device plugins until every pod is bound or nothing changes any more."""
    known = classes | {str(o["metadata"]["name"]) for o in objects if o["kind"] == "StorageClass"}
    shapes = {f"{s.name}-{i}": s for s in report.nodes for i in range(s.count)}
    advertisers = {
        (str(o["metadata"].get("namespace") or "default"), str(o["metadata"]["name"])): str(
            o["metadata"]["annotations"][lb.ADVERTISES_ANNOTATION]
        )
        for o in objects
        if o["kind"] == "DaemonSet" and lb.ADVERTISES_ANNOTATION in ((o["metadata"].get("annotations")) or {})
    }
    advertised: set[tuple[str, str]] = set()
    if not any(s.source.startswith("node group") for s in report.nodes):
        # an existing cluster: its own device plugin is a prerequisite (preflight), assumed here
        for node, shape in shapes.items():
            _advertise(http, node, shape.devices)
        advertised |= {(n, r) for n, s in shapes.items() for r in s.devices}
        report.notes.append(
            "GPUs assumed advertised by the existing cluster's device plugin (autoheal preflight checks it)"
        )
    last_sig, last_change = "", time.monotonic()
    while True:
        _provision(http, known)
        state = _snapshot(http)
        for pod in state.pods:  # a plugin's pod that has a node advertises there (seen next round)
            owner = _owner(pod)
            resource = advertisers.get((pod["metadata"]["namespace"], owner)) if owner else None
            node = pod["spec"].get("nodeName")
            if resource and node and (node, resource) not in advertised and node in shapes:
                amount = shapes[node].devices.get(resource, 0)
                _advertise(http, node, {resource: amount})
                advertised.add((node, resource))
        now = time.monotonic()
        if state.signature != last_sig:
            last_sig, last_change = state.signature, now
        pending = [p for p in state.pods if not p["spec"].get("nodeName")]
        complete = not pending and not _missing_pods(http)
        if complete or now - last_change > SETTLE_S or now > deadline:
            break
        time.sleep(0.5)
    _verdict(http, report, state.pods)


def _pods(http: httpx.Client) -> list[dict[str, Any]]:
    r = http.get("/api/v1/pods")
    r.raise_for_status()
    return list(r.json().get("items", []))


def _owner(pod: Mapping[str, Any]) -> str | None:
    refs = pod["metadata"].get("ownerReferences") or []
    return next((str(r["name"]) for r in refs if r.get("kind") == "DaemonSet"), None)


def _advertise(http: httpx.Client, node: str, devices: Mapping[str, int]) -> None:
    if not devices:
        return
    values = {k: str(v) for k, v in devices.items()}
    patch = {"status": {"capacity": values, "allocatable": values}}
    r = http.patch(
        f"/api/v1/nodes/{node}/status",
        content=json.dumps(patch),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    r.raise_for_status()


def _provision(http: httpx.Client, classes: set[str]) -> None:
    """A volume for each pending claim whose class exists: what its CSI driver would create."""
    r = http.get("/api/v1/persistentvolumeclaims")
    r.raise_for_status()
    for claim in r.json().get("items", []):
        cls = claim["spec"].get("storageClassName")
        if claim.get("status", {}).get("phase") == "Bound" or cls not in classes:
            continue
        meta = claim["metadata"]
        name = f"pv-{meta['namespace']}-{meta['name']}"[:253]
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
                "accessModes": claim["spec"]["accessModes"],
                "storageClassName": cls,
                "persistentVolumeReclaimPolicy": "Delete",
                "claimRef": {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]},
                "hostPath": {"path": f"/proof/{name}"},
            },
        }
        res = http.post(
            "/api/v1/persistentvolumes", content=json.dumps(pv), headers={"Content-Type": "application/json"}
        )
        if res.status_code not in (201, 409):
            res.raise_for_status()


def _snapshot(http: httpx.Client) -> _State:
    pods = _pods(http)
    sig = sorted(
        (
            p["metadata"]["namespace"],
            p["metadata"]["name"],
            p["spec"].get("nodeName") or "",
            _unscheduled(p) or "",
        )
        for p in pods
    )
    r = http.get("/api/v1/persistentvolumeclaims")
    claims = sorted(
        (c["metadata"]["name"], c.get("status", {}).get("phase", "")) for c in r.json().get("items", [])
    )
    nodes = http.get("/api/v1/nodes").json().get("items", [])
    alloc = sorted(
        (n["metadata"]["name"], json.dumps(n["status"].get("allocatable"), sort_keys=True)) for n in nodes
    )
    return _State(pods, json.dumps([sig, claims, alloc]))


def _unscheduled(pod: Mapping[str, Any]) -> str | None:
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or cond.get("reason") or "not scheduled")
    return None


def _workloads(http: httpx.Client) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for kind in ("deployments", "statefulsets", "daemonsets"):
        r = http.get(f"/apis/apps/v1/{kind}")
        r.raise_for_status()
        out += [{**i, "kind": kind} for i in r.json().get("items", [])]
    return out


def _missing_pods(http: httpx.Client) -> list[tuple[str, str]]:
    """(workload, problem) for each workload whose controller has not made all its pods."""
    missing = []
    for w in _workloads(http):
        ref = f"{w['kind'][:-1]} {w['metadata']['namespace']}/{w['metadata']['name']}"
        status = w.get("status") or {}
        if w["kind"] == "daemonsets":
            if int(status.get("desiredNumberScheduled", 0)) == 0:
                missing.append(
                    (ref, "selects no node (its nodeSelector, affinity or tolerations match none)")
                )
            continue
        want = int(w["spec"].get("replicas", 1))
        have = int(status.get("replicas", 0))
        if have < want:
            why = "; ".join(
                str(c.get("message"))
                for c in status.get("conditions") or []
                if c.get("status") == "True" and "Failure" in str(c.get("type"))
            )
            missing.append((ref, f"{have} of {want} pods created" + (f": {why}" if why else "")))
    return missing


def _verdict(http: httpx.Client, report: Report, pods: Sequence[Mapping[str, Any]]) -> None:
    report.pods_total = len(pods)
    report.pods_bound = sum(1 for p in pods if p["spec"].get("nodeName"))
    for p in pods:
        if not p["spec"].get("nodeName"):
            why = _unscheduled(p) or "not tried by the scheduler"
            report.findings.append(
                Finding("pod", f"{p['metadata']['namespace']}/{p['metadata']['name']}", why)
            )
    for ref, problem in _missing_pods(http):
        report.findings.append(Finding("workload", ref, problem))


# --- a stack by name ---------------------------------------------------------------------------


def record_stack(project: Path, stack: str, out: Path) -> list[dict[str, Any]]:
    """Run the stack's program under Pulumi mocks (review.mockstack, as a module run: the review
    is a sibling layer) with `project`'s code first on the path, and return what it declares."""
    res = subprocess.run(
        [sys.executable, "-m", "review.mockstack", str(project), stack, str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if res.returncode != 0:
        tail = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"
        raise RuntimeError(f"stack {stack}: its program fails under mocks: {tail}")
    rows: list[dict[str, Any]] = json.loads(out.read_text())
    return rows
