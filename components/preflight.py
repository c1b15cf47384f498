"""Preflight: is an existing cluster fit for the stack, checked before anything is installed on it.

A `cluster.backend: kubeconfig` stack installs onto a cluster it did not build, so what the stack
takes for granted is read from the cluster first, and each check says what is wrong and how to fix
it: the pools' nodes (labelled, advertising their GPUs), the StorageClasses the volumes ask for,
the Prometheus Operator when the stack uses it, a node the system pods can run on, the Kubernetes
version, what the nodes run (kernel, runtime; the cgroup version where it can be seen).

`autoheal preflight --stack NAME` (components/cli.py) and the Pulumi program (`__main__.py`, which
fails the preview with the report) both call `preflight()`. The checks are pure functions over a
`ClusterView`, what a few reads of the API returned (plain JSON dicts), so tests can hand them any
cluster; `read_cluster` does the reads, with short timeouts and no retries, so an unreachable
cluster fails in seconds with its cause.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from autoheal import labels as lb
from autoheal.errors import ConfigError
from components.config import PROJECT, StackSpec, TaintSpec, read_stack_config, resolve_path

Status = Literal["pass", "info", "warn", "fail"]

# Native sidecar containers (an init container with restartPolicy: Always) carry the runner's munge
# sidecar and Slurm's config reloader: beta and on by default since 1.29 (GA in 1.33).
MIN_KUBERNETES = (1, 29)
GPU_RESOURCE = lb.GPU_RESOURCE
DEFAULT_CLASS_ANNOTATIONS = (
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
)
MONITORING_GROUP = "monitoring.coreos.com"
OPERATOR_CRDS = ("prometheusrules", "servicemonitors", "alertmanagerconfigs")
# A DaemonSet's pods tolerate these by themselves (the node lifecycle's own taints).
_DAEMONSET_TOLERATED = (
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/pid-pressure",
    "node.kubernetes.io/unschedulable",
    "node.kubernetes.io/network-unavailable",
)
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Check:
    """One row of the report: `fix` says what to do when the status is warn or fail."""

    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass
class Report:
    stack: str
    server: str
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def ok(self) -> bool:
        return not self.failed

    def as_dict(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "server": self.server,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "checks": [asdict(c) for c in self.checks],
        }

    def text(self, only: Iterable[Status] | None = None) -> str:
        """Plain text (the Pulumi program's error): one paragraph per check shown."""
        want = set(only) if only is not None else None
        lines = []
        for c in self.checks:
            if want is not None and c.status not in want:
                continue
            lines.append(f"[{c.status.upper()}] {c.name}: {c.detail}")
            if c.fix and c.status in ("warn", "fail"):
                lines.append(f"    fix: {c.fix}")
        return "\n".join(lines)


@dataclass
class ClusterView:
    """What the checks read from the API: plain JSON objects as the API server returned them.
    `None` for a list means it could not be read (`denied` names why)."""

    version: dict[str, Any]
    nodes: list[dict[str, Any]]
    storage_classes: list[dict[str, Any]] | None
    crds: set[str] | None  # names of CustomResourceDefinitions of monitoring.coreos.com
    prometheuses: list[dict[str, Any]] | None = None
    alertmanagers: list[dict[str, Any]] | None = None
    namespace: dict[str, Any] | None = None  # the stack's namespace, when it exists
    cgroup_v1_nodes: set[str] | None = None  # nodes whose kubelet posted a CgroupV1 event
    denied: dict[str, str] = field(default_factory=dict)


# --- reading the stack --------------------------------------------------------------------------


def _config_text(value: Any) -> str:
    """A config value as Pulumi hands it to the program: objects and lists as JSON text."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value)


def stack_values(project_dir: Path, stack: str) -> dict[str, str]:
    """The stack's config as the engine passes it: Pulumi.yaml's defaults overridden by
    Pulumi.<stack>.yaml, keys without the project prefix (as review/mockstack.py reads them)."""
    stack_file = project_dir / f"Pulumi.{stack}.yaml"
    try:
        project_doc = yaml.safe_load((project_dir / "Pulumi.yaml").read_text()) or {}
        stack_doc = yaml.safe_load(stack_file.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"stack {stack}: cannot read {exc.filename}: {exc.strerror}") from None
    name = str(project_doc.get("name", PROJECT))
    values: dict[str, Any] = {
        k: spec["default"]
        for k, spec in (project_doc.get("config") or {}).items()
        if isinstance(spec, dict) and "default" in spec
    }
    for key, value in (stack_doc.get("config") or {}).items():
        ns, _, bare = str(key).rpartition(":")
        if ns in ("", name):
            if isinstance(value, dict) and set(value) == {"secure"}:
                continue  # an encrypted value: not one the checks read
            values[bare] = value
    return {k: _config_text(v) for k, v in values.items()}


def load_stack(project_dir: Path, stack: str) -> StackSpec:
    """The validated StackSpec, read the way `__main__.py` reads `pulumi.Config`."""
    return read_stack_config(stack_values(project_dir, stack).get)


# --- reading the cluster ------------------------------------------------------------------------


class Unreachable(Exception):
    """The API server could not be asked at all; the message is the cause."""


class Kube:
    """GETs on the API server of a kubeconfig, as JSON, with short timeouts and no retries."""

    def __init__(
        self,
        kubeconfig: str,
        context: str | None,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        read_timeout: float = READ_TIMEOUT_S,
    ) -> None:
        from kubernetes import client, config

        cfg = client.Configuration()
        try:
            if "\n" in kubeconfig:  # the kubeconfig's text (Pulumi's provider accepts either)
                config.load_kube_config_from_dict(  # type: ignore[no-untyped-call]
                    yaml.safe_load(kubeconfig),
                    context=context,
                    client_configuration=cfg,
                    persist_config=False,
                )
            else:
                if not Path(kubeconfig).is_file():
                    raise Unreachable(f"kubeconfig {kubeconfig} does not exist")
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=kubeconfig, context=context, client_configuration=cfg, persist_config=False
                )
        except Unreachable:
            raise
        except Exception as exc:  # the loader's own errors: a bad file, an unknown context
            raise Unreachable(f"kubeconfig {_short(kubeconfig)}: {type(exc).__name__}: {exc}") from None
        cfg.retries = 0  # one try: a refused or silent address is reported at once, not retried
        self.host = str(cfg.host)
        self._timeout = (connect_timeout, read_timeout)
        self._api = client.ApiClient(cfg)

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    def get(self, path: str, query: Mapping[str, str] | None = None) -> tuple[int, Any]:
        """(status, decoded body or None); Unreachable when no answer came."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        params = self._api.param_serialize(
            "GET",
            path,
            query_params=list((query or {}).items()),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        try:
            resp = self._api.call_api(*params, _request_timeout=self._timeout)
            body = resp.read()  # type: ignore[no-untyped-call]
        except urllib3.exceptions.MaxRetryError as exc:
            raise Unreachable(_cause(exc.reason or exc)) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Unreachable(_cause(exc)) from None
        except ApiException as exc:  # the client reports TLS failures this way (status 0)
            raise Unreachable(" ".join(str(exc.reason).split())[:300]) from None
        if resp.status != 200:
            return resp.status, None
        try:
            return resp.status, json.loads(body)
        except ValueError:
            raise Unreachable(f"{path} answered something that is not JSON: {body[:80]!r}") from None


def _short(kubeconfig: str) -> str:
    return "(inline text)" if "\n" in kubeconfig else kubeconfig


def _cause(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    for marker, said in (
        ("Connection refused", "connection refused"),
        ("timed out", "no answer (timed out)"),
        ("Name or service not known", "host name not found"),
        ("No route to host", "no route to host"),
        ("CERTIFICATE_VERIFY_FAILED", "the server's certificate is not trusted by the kubeconfig"),
    ):
        if marker in text:
            return f"{said} ({type(exc).__name__})"
    return f"{type(exc).__name__}: {text[:300]}"


def read_cluster(kube: Kube, cfg: StackSpec) -> ClusterView:
    """The reads the checks need: a few lists, each from the API server's cache."""
    denied: dict[str, str] = {}

    def listing(path: str, what: str, query: Mapping[str, str] | None = None) -> list[dict[str, Any]] | None:
        status, body = kube.get(path, {"resourceVersion": "0", **(query or {})})
        if status == 200:
            return list(body.get("items") or [])
        if status == 404:
            return None
        denied[what] = f"{status} reading {path}"
        return None

    status, version = kube.get("/version")
    if status != 200:
        raise Unreachable(f"GET /version answered {status}: {_auth_hint(status)}")
    nodes = listing("/api/v1/nodes", "nodes")
    classes = listing("/apis/storage.k8s.io/v1/storageclasses", "storageclasses")
    crds: set[str] | None = None
    prometheuses = alertmanagers = None
    namespace = None
    if cfg.monitoring.prometheus_operator:
        items = listing(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "customresourcedefinitions"
        )
        if items is not None:
            crds = {
                str(i["spec"]["names"]["plural"]) for i in items if i["spec"].get("group") == MONITORING_GROUP
            }
            if "prometheuses" in crds:
                prometheuses = listing(f"/apis/{MONITORING_GROUP}/v1/prometheuses", "prometheuses")
            if "alertmanagers" in crds:
                alertmanagers = listing(f"/apis/{MONITORING_GROUP}/v1/alertmanagers", "alertmanagers")
        status, body = kube.get(f"/api/v1/namespaces/{cfg.namespace}")
        namespace = body if status == 200 else None
    events = listing(
        "/api/v1/events", "events", {"fieldSelector": "reason=CgroupV1,involvedObject.kind=Node"}
    )
    v1 = {str(e.get("involvedObject", {}).get("name")) for e in events} if events is not None else None
    return ClusterView(
        version=version,
        nodes=nodes if nodes is not None else [],
        storage_classes=classes,
        crds=crds,
        prometheuses=prometheuses,
        alertmanagers=alertmanagers,
        namespace=namespace,
        cgroup_v1_nodes=v1,
        denied=denied,
    )


def _auth_hint(status: int) -> str:
    if status == 401:
        return "the kubeconfig's credentials were refused (expired token or certificate?): renew them"
    if status == 403:
        return "the kubeconfig's user may not read the API: use a user with read access to the cluster"
    return "not a Kubernetes API server?"


# --- helpers over API objects -------------------------------------------------------------------


def _name(obj: Mapping[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", "?"))


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("labels") or {})


def _ready(node: Mapping[str, Any]) -> bool:
    conds = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _quantity(value: Any) -> int:
    """An integer quantity (a count of GPUs); anything else counts as none."""
    try:
        return int(str(value))
    except ValueError:
        return 0


def _gpus(node: Mapping[str, Any]) -> int:
    return _quantity((node.get("status", {}).get("allocatable") or {}).get(GPU_RESOURCE, 0))


def _tolerates(tolerations: Sequence[TaintSpec], taint: Mapping[str, Any]) -> bool:
    """Whether one of `tolerations` (as the components write them) tolerates `taint`: a key
    without a value is tolerated with `Exists`, one with a value with `Equal`; effects match."""
    for t in tolerations:
        if t.key != taint.get("key") or t.effect != taint.get("effect"):
            continue
        if t.value is None or t.value == taint.get("value"):
            return True
    return False


def _blocking(taints: Iterable[Mapping[str, Any]], tolerations: Sequence[TaintSpec]) -> list[str]:
    """The taints that keep a pod with `tolerations` off a node (PreferNoSchedule does not)."""
    return [
        _taint_text(t)
        for t in taints
        if t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(tolerations, t)
    ]


def _taint_text(t: Mapping[str, Any]) -> str:
    value = f"={t['value']}" if t.get("value") else ""
    return f"{t.get('key')}{value}:{t.get('effect')}"


def _names(items: Iterable[str], limit: int = 5) -> str:
    items = sorted(items)
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) of a Kubernetes version such as v1.31.2-eks-1234; None if it is not one."""
    m = re.match(r"^v?(\d+)\.(\d+)", text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def _version_text(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


# --- the checks ---------------------------------------------------------------------------------


def check_server_version(view: ClusterView) -> Check:
    text = str(view.version.get("gitVersion", ""))
    v = parse_version(text)
    minimum = _version_text(MIN_KUBERNETES)
    if v is None:
        return Check("server version", "warn", f"the API server reports {text!r}, not a version", "")
    if v < MIN_KUBERNETES:
        return Check(
            "server version",
            "fail",
            f"Kubernetes {text}: autoheal needs {minimum} or later (native sidecar containers)",
            f"upgrade the control plane to {minimum} or later",
        )
    return Check("server version", "pass", f"Kubernetes {text} (at least {minimum})")


def check_kubelet_versions(view: ClusterView) -> Check:
    server = parse_version(str(view.version.get("gitVersion", "")))
    old: list[str] = []
    unknown: list[str] = []
    newer: list[str] = []
    seen: dict[str, int] = {}
    for node in view.nodes:
        text = str(node.get("status", {}).get("nodeInfo", {}).get("kubeletVersion", ""))
        v = parse_version(text)
        seen[text] = seen.get(text, 0) + 1
        if v is None:
            unknown.append(f"{_name(node)} ({text or 'none'})")
        elif v < MIN_KUBERNETES:
            old.append(f"{_name(node)} ({text})")
        elif server is not None and v > server:
            newer.append(f"{_name(node)} ({text})")
    summary = ", ".join(f"{k or '?'} x{n}" for k, n in sorted(seen.items())) or "no nodes"
    minimum = _version_text(MIN_KUBERNETES)
    if old:
        return Check(
            "kubelet versions",
            "fail",
            f"kubelets older than {minimum}: {_names(old)}",
            f"upgrade those nodes' kubelets to {minimum} or later (or drain and replace them)",
        )
    if newer:
        return Check(
            "kubelet versions",
            "warn",
            f"kubelets newer than the API server: {_names(newer)} (Kubernetes' skew policy forbids it)",
            "upgrade the control plane first",
        )
    if unknown:
        return Check(
            "kubelet versions",
            "warn",
            f"not a kubelet version: {_names(unknown)} (simulated nodes?)"
            + (f"; all: {summary}" if len(unknown) < len(view.nodes) else ""),
            "",
        )
    return Check("kubelet versions", "pass", summary)


def check_node_os(view: ClusterView) -> Check:
    """What the nodes run; the cgroup version only where the cluster shows it (a kubelet's
    CgroupV1 event): the Node object does not carry it."""
    kernels: dict[str, int] = {}
    images: dict[str, int] = {}
    runtimes: dict[str, int] = {}
    for node in view.nodes:
        info = node.get("status", {}).get("nodeInfo", {})
        for bucket, key in (
            (kernels, "kernelVersion"),
            (images, "osImage"),
            (runtimes, "containerRuntimeVersion"),
        ):
            value = str(info.get(key) or "?")
            bucket[value] = bucket.get(value, 0) + 1

    def show(bucket: dict[str, int]) -> str:
        return ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(bucket.items())) or "-"

    facts = f"kernel {show(kernels)}; OS {show(images)}; runtime {show(runtimes)}"
    if view.cgroup_v1_nodes:
        return Check(
            "node OS, cgroups",
            "warn",
            f"cgroup v1 on {_names(view.cgroup_v1_nodes)} (their kubelets' CgroupV1 event); {facts}",
            "move those nodes to cgroup v2 (a distribution that boots with it, or "
            "systemd.unified_cgroup_hierarchy=1): kubelets from 1.35 refuse v1 by default",
        )
    return Check(
        "node OS, cgroups",
        "info",
        f"{facts}; cgroup version: not observable from the Kubernetes API (on a node: "
        "`stat -fc %T /sys/fs/cgroup` says cgroup2fs for v2; Slurm's cgroup.conf autodetects either)",
    )


def check_pool_nodes(cfg: StackSpec, view: ClusterView) -> list[Check]:
    """Per pool: its nodes exist (size + spares of them), carry its labels and no taint its slurmd
    pods do not tolerate, and advertise its GPUs."""
    out: list[Check] = []
    spare_taint = TaintSpec(**lb.spare_taint())  # type: ignore[arg-type]
    for pool in cfg.pools:
        name = f"pool {pool.name}"
        selector = f"{lb.POOL_LABEL}={pool.name}"
        members = [n for n in view.nodes if _labels(n).get(lb.POOL_LABEL) == pool.name]
        ready = [n for n in members if _ready(n)]
        want = pool.size + pool.spares
        wanted = f"size {pool.size} + spares {pool.spares} = {want}"
        label_cmd = f"kubectl label node <node> {selector}"
        if not members:
            out.append(
                Check(
                    f"{name}: nodes",
                    "fail",
                    f"no node is labelled {selector} (the pool wants {wanted})",
                    f"label the pool's GPU nodes: {label_cmd}",
                )
            )
            continue
        not_ready = sorted({_name(n) for n in members} - {_name(n) for n in ready})
        late = f"; not Ready: {_names(not_ready)}" if not_ready else ""
        if len(ready) < pool.size:
            out.append(
                Check(
                    f"{name}: nodes",
                    "fail",
                    f"{len(ready)} Ready nodes labelled {selector}, fewer than the pool's size "
                    f"({wanted}){late}",
                    f"add {want - len(ready)} nodes ({label_cmd}) or lower size in Pulumi.<stack>.yaml",
                )
            )
        elif len(ready) < want:
            out.append(
                Check(
                    f"{name}: nodes",
                    "warn",
                    f"{len(ready)} Ready nodes labelled {selector}: {want - len(ready)} short of {wanted}, "
                    f"so fewer hot spares than declared{late}",
                    f"add {want - len(ready)} nodes ({label_cmd}) or lower spares",
                )
            )
        elif len(members) > want:
            out.append(
                Check(
                    f"{name}: nodes",
                    "warn",
                    f"{len(members)} nodes labelled {selector}, more than {wanted}: "
                    f"every one runs slurmd{late}",
                    "raise size/spares to match, or take the label off the extra nodes",
                )
            )
        else:
            out.append(
                Check(f"{name}: nodes", "pass", f"{len(ready)} Ready nodes labelled {selector} ({wanted})")
            )

        missing: dict[str, list[str]] = {}
        for node in members:
            have = _labels(node)
            for key, value in pool.labels.items():
                if have.get(key) != value:
                    missing.setdefault(f"{key}={value}", []).append(_name(node))
        tolerated = [*pool.taints, spare_taint]
        tainted: dict[str, list[str]] = {}
        for node in members:
            taints = [
                t
                for t in node.get("spec", {}).get("taints") or []
                if t.get("key") not in _DAEMONSET_TOLERATED and t.get("key") != lb.QUARANTINE_TAINT_KEY
            ]
            for text in _blocking(taints, tolerated):
                tainted.setdefault(text, []).append(_name(node))
        problems = [f"{label} missing on {_names(nodes)}" for label, nodes in sorted(missing.items())]
        problems += [
            f"{_names(nodes)} tainted {taint}, which slurmd does not tolerate"
            for taint, nodes in sorted(tainted.items())
        ]
        if problems:
            fixes = []
            if missing:
                fixes.append("kubectl label node <node> " + " ".join(sorted(missing)))
            if tainted:
                fixes.append(
                    f"add the taint to autoheal:pools[{cfg.pools.index(pool)}].taints, "
                    "or remove it from the nodes"
                )
            out.append(Check(f"{name}: labels, taints", "fail", "; ".join(problems), "; ".join(fixes)))
        else:
            shown = ", ".join(f"{k}={v}" for k, v in sorted(pool.labels.items())) or "no labels declared"
            out.append(Check(f"{name}: labels, taints", "pass", f"{shown}; taints tolerated"))

        gpus = {_name(n): _gpus(n) for n in members}
        none = sorted(n for n, g in gpus.items() if g == 0)
        few = sorted(f"{n} ({g})" for n, g in gpus.items() if 0 < g < pool.gpus_per_node)
        if len(none) == len(members):
            out.append(
                Check(
                    f"{name}: GPUs",
                    "fail",
                    f"no node of pool {pool.name} advertises {GPU_RESOURCE}",
                    "install the NVIDIA device plugin or GPU Operator (it advertises the GPUs to Kubernetes)",
                )
            )
        elif none or few:
            problems = []
            if none:
                problems.append(
                    f"{_names(none)} advertise no {GPU_RESOURCE} (the device plugin is not running there)"
                )
            if few:
                problems.append(f"{_names(few)} advertise fewer than gpusPerNode {pool.gpus_per_node}")
            out.append(
                Check(
                    f"{name}: GPUs",
                    "fail",
                    "; ".join(problems),
                    "check the device plugin's pods on those nodes (and the GPUs: nvidia-smi), "
                    "or set gpusPerNode to what each node has",
                )
            )
        else:
            out.append(
                Check(
                    f"{name}: GPUs",
                    "pass",
                    f"every node advertises at least {pool.gpus_per_node} {GPU_RESOURCE}",
                )
            )
    return out


def _storage_wants(cfg: StackSpec) -> dict[str | None, list[str]]:
    """StorageClass name (None: the default) -> the config keys whose volumes use it."""
    wants: dict[str | None, list[str]] = {}
    st = cfg.slurm.storage
    wants.setdefault(st.state_storage_class, []).append("slurm.storage.stateStorageClass")
    wants.setdefault(st.shared_storage_class, []).append("slurm.storage.sharedStorageClass")
    if cfg.runner.journal == "sqlite":  # a PostgreSQL journal has no volume of ours
        wants.setdefault(cfg.runner.journal_storage_class, []).append("runner.journalStorageClass")
    return wants


def check_storage(cfg: StackSpec, view: ClusterView) -> list[Check]:
    if view.storage_classes is None:
        why = view.denied.get("storageclasses", "the storage.k8s.io API is not served")
        return [
            Check(
                "storage classes",
                "fail",
                f"cannot list StorageClasses ({why})",
                "let the kubeconfig's user list storageclasses (storage.k8s.io)",
            )
        ]
    by_name = {_name(sc): sc for sc in view.storage_classes}
    defaults = sorted(
        _name(sc)
        for sc in view.storage_classes
        if any(
            (sc.get("metadata", {}).get("annotations") or {}).get(a) == "true"
            for a in DEFAULT_CLASS_ANNOTATIONS
        )
    )
    out = []
    for wanted, keys in _storage_wants(cfg).items():
        used_by = ", ".join(keys)
        if wanted is None:
            if defaults:
                out.append(Check("storage: default class", "pass", f"{defaults[0]} (for {used_by} unset)"))
            else:
                have = _names(by_name) if by_name else "none"
                out.append(
                    Check(
                        "storage: default class",
                        "fail",
                        f"no default StorageClass, and {used_by} name none (StorageClasses here: {have})",
                        "mark one default (kubectl annotate storageclass <name> "
                        "storageclass.kubernetes.io/is-default-class=true) or name one in those keys",
                    )
                )
        elif wanted in by_name:
            provisioner = by_name[wanted].get("provisioner", "?")
            out.append(Check(f"storage: {wanted}", "pass", f"provisioner {provisioner} (for {used_by})"))
        else:
            have = _names(by_name) if by_name else "none"
            out.append(
                Check(
                    f"storage: {wanted}",
                    "fail",
                    f"StorageClass {wanted} (named by {used_by}) does not exist; StorageClasses here: {have}",
                    f"create StorageClass {wanted} (install its CSI driver) "
                    f"or name an existing one in {used_by}",
                )
            )
    return out


def _system_pods(cfg: StackSpec) -> list[tuple[str, str, Mapping[str, str], Sequence[TaintSpec]]]:
    """(row, config key, nodeSelector, tolerations) of the pods that must run off the GPU pools."""
    return [
        ("system node: slurmctld, login", "slurm", cfg.slurm.node_selector, cfg.slurm.tolerate_taints),
        ("system node: runner", "runner", cfg.runner.node_selector, cfg.runner.tolerate_taints),
    ]


def check_system_nodes(cfg: StackSpec, view: ClusterView) -> list[Check]:
    out = []
    for row, key, selector, tolerations in _system_pods(cfg):
        matching = [n for n in view.nodes if all(_labels(n).get(k) == v for k, v in selector.items())]
        usable, why_not = [], {}
        for node in matching:
            spec = node.get("spec", {})
            if not _ready(node):
                why_not[_name(node)] = "not Ready"
            elif spec.get("unschedulable"):
                why_not[_name(node)] = "cordoned"
            elif blocking := _blocking(spec.get("taints") or [], tolerations):
                why_not[_name(node)] = ", ".join(blocking)
            else:
                usable.append(_name(node))
        sel = f" matching {key}.nodeSelector {dict(selector)}" if selector else ""
        if usable:
            out.append(Check(row, "pass", f"{len(usable)} Ready nodes{sel}, e.g. {_names(usable, 3)}"))
            continue
        if not matching:
            detail = f"no node{sel}" if selector else "the cluster has no nodes"
            fix = (
                f"label a node with {dict(selector)} or change {key}.nodeSelector"
                if selector
                else "add nodes"
            )
        else:
            taints = sorted({w for w in why_not.values() if w not in ("not Ready", "cordoned")})
            detail = (
                f"no Ready, schedulable node{sel} without a taint the pods do not tolerate: "
                + "; ".join(f"{n}: {w}" for n, w in sorted(why_not.items())[:5])
            )
            fix = "add an untainted system node (a CPU node group)"
            if taints:
                fix += f", or set {key}.tolerateTaints to tolerate {taints[0]}"
        out.append(Check(row, "fail", detail, fix))
    return out


def _matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A Kubernetes LabelSelector (matchLabels, matchExpressions) against labels; None matches
    nothing here (the caller decides what an absent selector means)."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _selects(
    owner: Mapping[str, Any],
    selector_key: str,
    ns_selector_key: str,
    labels: Mapping[str, str],
    namespace: str,
    namespace_labels: Mapping[str, str],
) -> bool:
    """Whether a Prometheus or Alertmanager object picks up an object of ours: its selector
    matches our labels (absent: none), and its namespace selector our namespace (absent: only
    its own namespace), as the Prometheus Operator reads them."""
    spec = owner.get("spec") or {}
    if not _matches(spec.get(selector_key), labels):
        return False
    ns_selector = spec.get(ns_selector_key)
    if ns_selector is None:
        return bool(owner.get("metadata", {}).get("namespace") == namespace)
    return _matches(ns_selector, namespace_labels)


def check_prometheus_operator(cfg: StackSpec, view: ClusterView) -> list[Check]:
    if not cfg.monitoring.prometheus_operator:
        return []
    if view.crds is None:
        why = view.denied.get("customresourcedefinitions", "the apiextensions API is not served")
        return [
            Check(
                "prometheus operator: CRDs",
                "fail",
                f"cannot list CustomResourceDefinitions ({why})",
                "let the kubeconfig's user list customresourcedefinitions",
            )
        ]
    missing = [f"{p}.{MONITORING_GROUP}" for p in OPERATOR_CRDS if p not in view.crds]
    out = []
    if missing:
        out.append(
            Check(
                "prometheus operator: CRDs",
                "fail",
                f"monitoring.prometheusOperator is true, but {', '.join(missing)} not installed",
                "install the Prometheus Operator (e.g. the kube-prometheus-stack chart) with its CRDs, "
                "or set monitoring.prometheusOperator: false",
            )
        )
        return out
    out.append(Check("prometheus operator: CRDs", "pass", ", ".join(OPERATOR_CRDS) + " present"))
    out.append(_selector_check(cfg, view, cfg.monitoring.operator_labels))
    return out


def _selector_check(cfg: StackSpec, view: ClusterView, extra: Mapping[str, str]) -> Check:
    """Whether a Prometheus (an Alertmanager) takes the objects with the labels the monitoring
    component gives them: `monitoring.operatorLabels` under the component's own."""
    name = "prometheus operator: selectors"
    try:  # the labels the monitoring component gives its objects (imported here: it loads Pulumi)
        from components.common import base_labels
        from components.monitoring import ALERTMANAGER_LABELS, DCGM_LABELS, RULE_LABELS
    except ImportError as exc:  # a CLI installed without the `pulumi` extra
        return Check(
            name, "info", f"not checked: the objects' labels come from the Pulumi components ({exc})"
        )
    ns = cfg.namespace
    ns_labels = {
        **base_labels("autoheal", "namespace"),
        **_labels(view.namespace or {}),
        "kubernetes.io/metadata.name": ns,
    }
    if not view.prometheuses:
        return Check(
            name,
            "warn",
            "no Prometheus object in the cluster: the rules and the ServiceMonitor would be loaded by none",
            "create a Prometheus (kube-prometheus-stack does) or point monitoring at the one you run",
        )
    wants = [
        (
            "PrometheusRule",
            {**extra, **RULE_LABELS},
            view.prometheuses,
            "ruleSelector",
            "ruleNamespaceSelector",
        ),
        (
            "ServiceMonitor",
            {**extra, **DCGM_LABELS},
            view.prometheuses,
            "serviceMonitorSelector",
            "serviceMonitorNamespaceSelector",
        ),
        (
            "AlertmanagerConfig",
            {**extra, **ALERTMANAGER_LABELS},
            view.alertmanagers or [],
            "alertmanagerConfigSelector",
            "alertmanagerConfigNamespaceSelector",
        ),
    ]
    unselected, selected = [], []
    for kind, labels, owners, sel, ns_sel in wants:
        by = [
            f"{o['metadata'].get('namespace')}/{_name(o)}"
            for o in owners
            if _selects(o, sel, ns_sel, labels, ns, ns_labels)
        ]
        if by:
            selected.append(f"{kind} by {by[0]}")
        elif owners:
            shown = {
                f"{o['metadata'].get('namespace')}/{_name(o)}": (o.get("spec") or {}).get(sel) for o in owners
            }
            unselected.append(f"{kind} (namespace {ns}) is selected by none of {json.dumps(shown)[:300]}")
        else:  # no Alertmanager object (Prometheus objects were checked for above)
            selected.append(f"{kind}: no Alertmanager object to select it (not checked)")
    if unselected:
        return Check(
            name,
            "fail",
            "; ".join(unselected),
            "set monitoring.operatorLabels to the labels those selectors match (kube-prometheus-stack: "
            "{release: <its release name>}), and let their namespace selectors take namespace " + ns,
        )
    return Check(name, "pass", "; ".join(selected))


def check_access(view: ClusterView) -> list[Check]:
    """A read the checks needed and were refused (the checks that needed it say so too)."""
    if "nodes" in view.denied:
        return [
            Check(
                "read access",
                "fail",
                f"the kubeconfig's user may not list nodes ({view.denied['nodes']}): "
                "the node checks saw none",
                "use a kubeconfig whose user may list nodes (cluster-wide read)",
            )
        ]
    return []


def _node_checks(cfg: StackSpec, view: ClusterView) -> list[Check]:
    return [
        check_kubelet_versions(view),
        check_node_os(view),
        *check_pool_nodes(cfg, view),
        *check_system_nodes(cfg, view),
    ]


def run_checks(cfg: StackSpec, view: ClusterView) -> list[Check]:
    """Every check, in the report's order. Without the right to list nodes, the checks of nodes
    are left out (the `read access` row says why) rather than reported as no nodes."""
    nodes_read = "nodes" not in view.denied
    return [
        *check_access(view),
        check_server_version(view),
        *(_node_checks(cfg, view) if nodes_read else []),
        *check_storage(cfg, view),
        *check_prometheus_operator(cfg, view),
    ]


# --- the whole preflight ------------------------------------------------------------------------


def kubeconfig_of(cfg: StackSpec, root: Path) -> str:
    """The stack's kubeconfig as the program hands it to the provider (a path resolved against
    the project folder, or the kubeconfig's own text)."""
    value = cfg.cluster.kubeconfig
    if not value:
        raise ConfigError(f"{PROJECT}:cluster.kubeconfig: not set (backend {cfg.cluster.backend})")
    return value if "\n" in value else str(resolve_path(root, value))


def preflight(
    cfg: StackSpec,
    root: Path,
    stack: str = "",
    kubeconfig: str | None = None,
    context: str | None = None,
    connect_timeout: float = CONNECT_TIMEOUT_S,
) -> Report:
    """Every check of an existing cluster against the stack. `kubeconfig`/`context` override the
    stack's. An unreachable cluster is one failed check (the others are not run)."""
    t0 = time.monotonic()
    where = kubeconfig or kubeconfig_of(cfg, root)
    # another kubeconfig than the stack's comes without the stack's context
    ctx = context if context is not None or kubeconfig else cfg.cluster.context
    report = Report(stack=stack, server=_short(where))  # the API server's URL once it is read
    try:
        kube = Kube(where, ctx, connect_timeout=connect_timeout)
    except Unreachable as exc:
        report.checks.append(
            Check(
                "cluster reachable",
                "fail",
                str(exc),
                "point cluster.kubeconfig at a kubeconfig for the cluster",
            )
        )
        report.seconds = time.monotonic() - t0
        return report
    report.server = kube.host
    try:
        view = read_cluster(kube, cfg)
    except Unreachable as exc:
        report.checks.append(
            Check(
                "cluster reachable",
                "fail",
                f"{kube.host}: {exc}",
                "start the cluster or fix cluster.kubeconfig / cluster.context (is the API server up, "
                "and reachable from here: VPN, firewall, endpoint access?)",
            )
        )
        report.seconds = time.monotonic() - t0
        return report
    finally:
        kube.close()
    report.checks.append(
        Check("cluster reachable", "pass", f"{kube.host} answered ({len(view.nodes)} nodes)")
    )
    report.checks.extend(run_checks(cfg, view))
    report.seconds = time.monotonic() - t0
    return report
