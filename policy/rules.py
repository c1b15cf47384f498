"""The policy rules as plain functions over (resource type, properties), so tests call them directly.

Each resource rule returns a list of violation messages (empty: compliant). Properties use the
Kubernetes API's camelCase names, as Pulumi passes them to a policy pack; during a preview some
values may be unknown, and the pack's runtime reports those checks as not yet decidable.

The rules, and why:
* GPU pools have hot spares and automatic remediation, unless explicitly waived: a pool with
  neither turns every GPU fault into a 3 a.m. page. A waiver is the annotation
  `autoheal.io/policy-waiver` with the reason, so it is visible in review.
* Controller state is persistent: slurmctld's StateSaveLocation (and the runner's journal) must be
  on a PersistentVolumeClaim, or a pod restart loses the job queue (or the incident record).
* No wildcard RBAC: `*` in apiGroups, resources, verbs or nonResourceURLs grants more than anyone
  reviewed; the runner's role lists its verbs.
* Images are pinned by digest (`images-pinned-by-digest`): a tag can move under a running pool,
  so two nodes of one pool could run different code. The stack's images default to the digests
  `autoheal images build` recorded in `images.lock.json`; without one they are tags, and the
  violation names the stack config key that sets each container's image (or the build to run).
  dcgm-exporter is NVIDIA's image, whose digest nobody here can know offline: the stack must
  name it by digest or leave dcgm-exporter to the GPU Operator.
* SSH is not open to the world (`login-source-ranges`): a LoadBalancer Service that serves SSH
  (the Slurm login, or any port 22) lists loadBalancerSourceRanges, none of them everything
  (0.0.0.0/0, ::/0): a public SSH endpoint is scanned within minutes. Waivable, as the pools.
* The webhook requires a token: every Alertmanager webhook receiver authenticates with a token
  read from a Secret (a file or a Secret key selector, never inline), and the runner is given its
  token from a Secret.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import yaml

from autoheal.imagelock import pinned_by_digest
from autoheal.labels import (
    ALERTMANAGER_CONFIG_LABEL,
    COMPONENT_LABEL,
    NODE_POOL_COMPONENT,
    POLICY_WAIVER_ANNOTATION,
    POOL_LABEL,
    REMEDIATION_ANNOTATION,
    RUNNER_COMPONENT,
    SLURMCTLD_COMPONENT,
    STATE_DIR_ANNOTATION,
)

CONTROLLER_COMPONENTS = frozenset({SLURMCTLD_COMPONENT})
TOKEN_ENV = "AUTOHEAL_TOKEN_FILE"  # noqa: S105 (an env var name)
DEFAULT_STATE_DIR = "/var/spool/slurmctld"

CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
ROLE_TYPES = frozenset(
    {
        "kubernetes:rbac.authorization.k8s.io/v1:Role",
        "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole",
    }
)
WORKLOAD_TYPES = frozenset(
    {
        "kubernetes:apps/v1:Deployment",
        "kubernetes:apps/v1:StatefulSet",
        "kubernetes:apps/v1:DaemonSet",
        "kubernetes:apps/v1:ReplicaSet",
        "kubernetes:core/v1:Pod",
    }
)
ALERTMANAGER_CONFIG_CR = "kubernetes:monitoring.coreos.com/v1alpha1:AlertmanagerConfig"
EKS_NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _seq(value: Any) -> Sequence[Any]:
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return value
    return ()


def _meta(props: Mapping[str, Any]) -> tuple[str, Mapping[str, Any], Mapping[str, Any]]:
    meta = _map(props.get("metadata"))
    name = meta.get("name")
    return (
        name if isinstance(name, str) else "<unnamed>",
        _map(meta.get("labels")),
        _map(meta.get("annotations")),
    )


def _document(text: Any, parse: Callable[[str], Any]) -> Mapping[str, Any] | None:
    """A JSON or YAML document held in a ConfigMap key; None when it is missing or unreadable."""
    try:
        doc = parse(text) if isinstance(text, str) else None
    except (ValueError, yaml.YAMLError):  # json.JSONDecodeError is a ValueError
        return None
    return doc if isinstance(doc, Mapping) else None


def _waived(annotations: Mapping[str, Any]) -> bool:
    reason = annotations.get(POLICY_WAIVER_ANNOTATION)
    return isinstance(reason, str) and reason.strip() != ""


# --- GPU pools -------------------------------------------------------------------------------


def gpu_pool_has_spares_and_remediation(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """A pool description (ConfigMap labelled node-pool) needs spares >= 1 and remediation on."""
    if resource_type == EKS_NODE_GROUP:
        return _eks_node_group(props)
    if resource_type != CONFIG_MAP:
        return []
    name, labels, annotations = _meta(props)
    if labels.get(COMPONENT_LABEL) != NODE_POOL_COMPONENT:
        return []
    if _waived(annotations):
        return []
    pool = _document(_map(props.get("data")).get("pool.json"), json.loads)
    if pool is None:
        return [f"GPU pool {name}: data['pool.json'] is missing or not JSON"]
    out = []
    spares = pool.get("spares")
    if not isinstance(spares, int) or spares < 1:
        out.append(
            f"GPU pool {name} has no hot spares (spares={spares!r}): a GPU fault leaves its jobs "
            f"waiting for a new node; add spares or annotate {POLICY_WAIVER_ANNOTATION} with the reason"
        )
    enabled = _map(pool.get("remediation")).get("enabled")
    if enabled is not True or annotations.get(REMEDIATION_ANNOTATION) == "disabled":
        out.append(
            f"GPU pool {name} has automatic remediation disabled; enable it or annotate "
            f"{POLICY_WAIVER_ANNOTATION} with the reason"
        )
    return out


def _eks_node_group(props: Mapping[str, Any]) -> list[str]:
    """A node group of a pool must hold at least one instance more than... nothing to compare to
    here, so only its shape is checked: a fixed, non-zero desired size (the spares live in it)."""
    labels = _map(props.get("labels"))
    if POOL_LABEL not in labels:
        return []
    scaling = _map(props.get("scalingConfig"))
    desired, minimum = scaling.get("desiredSize"), scaling.get("minSize")
    if isinstance(desired, int) and isinstance(minimum, int) and minimum < desired:
        return [
            f"node group of pool {labels[POOL_LABEL]}: minSize {minimum} < desiredSize {desired} "
            "lets the cloud shrink the pool below its active nodes plus spares"
        ]
    return []


def stack_has_remediation(resources: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """Pools with remediation enabled need a remediation runner in the same stack."""
    pools: list[str] = []
    runner = False
    for rtype, props in resources:
        name, labels, annotations = _meta(props)
        if (
            rtype == CONFIG_MAP
            and labels.get(COMPONENT_LABEL) == NODE_POOL_COMPONENT
            and annotations.get(REMEDIATION_ANNOTATION, "enabled") == "enabled"
            and not _waived(annotations)
        ):
            pools.append(name)
        if rtype in WORKLOAD_TYPES and labels.get(COMPONENT_LABEL) == RUNNER_COMPONENT:
            runner = True
    if pools and not runner:
        return [
            f"GPU pools {', '.join(sorted(pools))} expect automatic remediation, but the stack "
            "has no remediation runner (a workload labelled "
            f"{COMPONENT_LABEL}={RUNNER_COMPONENT})"
        ]
    return []


# --- persistent controller state --------------------------------------------------------------


def _pod_spec(resource_type: str, props: Mapping[str, Any]) -> Mapping[str, Any]:
    if resource_type == "kubernetes:core/v1:Pod":
        return _map(props.get("spec"))
    return _map(_map(_map(props.get("spec")).get("template")).get("spec"))


def _covers(mount_path: str, state_dir: str) -> bool:
    mount = mount_path.rstrip("/") or "/"
    return state_dir == mount or state_dir.startswith(mount.rstrip("/") + "/")


def controller_state_is_persistent(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """slurmctld, and any workload annotated with a state dir, keeps that dir on a PVC."""
    if resource_type not in WORKLOAD_TYPES:
        return []
    name, labels, annotations = _meta(props)
    is_controller = labels.get(COMPONENT_LABEL) in CONTROLLER_COMPONENTS
    state_dir = annotations.get(STATE_DIR_ANNOTATION)
    if not is_controller and not isinstance(state_dir, str):
        return []
    if not isinstance(state_dir, str):
        state_dir = DEFAULT_STATE_DIR
    if is_controller and resource_type != "kubernetes:apps/v1:StatefulSet":
        return [
            f"{name}: the Slurm controller must be a StatefulSet (one stable pod with its own "
            f"volume), not {resource_type.rsplit(':', 1)[-1]}"
        ]
    pod = _pod_spec(resource_type, props)
    claims = {
        _map(t.get("metadata")).get("name")
        for t in map(_map, _seq(_map(props.get("spec")).get("volumeClaimTemplates")))
    }
    for vol in map(_map, _seq(pod.get("volumes"))):
        if "persistentVolumeClaim" in vol:
            claims.add(vol.get("name"))
    claims.discard(None)
    for container in map(_map, _seq(pod.get("containers"))):
        for mount in map(_map, _seq(container.get("volumeMounts"))):
            path = mount.get("mountPath")
            if mount.get("name") in claims and isinstance(path, str) and _covers(path, state_dir):
                return []
    return [
        f"{name}: state directory {state_dir} is not on a PersistentVolumeClaim (use a "
        "volumeClaimTemplate or a persistentVolumeClaim volume mounted there); a restart would "
        "lose it"
    ]


# --- RBAC ------------------------------------------------------------------------------------


def no_wildcard_rbac(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    if resource_type not in ROLE_TYPES:
        return []
    name, _, _ = _meta(props)
    out = []
    for i, rule in enumerate(map(_map, _seq(props.get("rules")))):
        for fld in ("apiGroups", "resources", "verbs", "nonResourceURLs"):
            values = [v for v in _seq(rule.get(fld)) if isinstance(v, str)]
            if any(v == "*" or v.endswith("/*") for v in values):
                out.append(f"{name}: rules[{i}].{fld} has a wildcard {values}; list what is needed")
    return out


# --- the webhook token -----------------------------------------------------------------------


def _alertmanager_file_violations(name: str, text: Any) -> list[str]:
    cfg = _document(text, yaml.safe_load)
    if cfg is None:
        return [f"{name}: alertmanager.yml is missing or not YAML"]
    out = []
    for rcv in map(_map, _seq(cfg.get("receivers"))):
        for j, hook in enumerate(map(_map, _seq(rcv.get("webhook_configs")))):
            where = f"{name}: receiver {rcv.get('name')!r} webhook_configs[{j}]"
            http = _map(hook.get("http_config"))
            auth = _map(http.get("authorization"))
            if auth.get("credentials") or http.get("bearer_token"):
                out.append(f"{where}: the token is inline; use credentials_file from a Secret")
            elif not (auth.get("credentials_file") or http.get("bearer_token_file")):
                out.append(f"{where}: no bearer token; the runner rejects unauthenticated alerts")
    return out


def _alertmanager_cr_violations(name: str, spec: Mapping[str, Any]) -> list[str]:
    out = []
    for rcv in map(_map, _seq(spec.get("receivers"))):
        for j, hook in enumerate(map(_map, _seq(rcv.get("webhookConfigs")))):
            where = f"{name}: receiver {rcv.get('name')!r} webhookConfigs[{j}]"
            cred = _map(_map(_map(hook.get("httpConfig")).get("authorization")).get("credentials"))
            if not (cred.get("name") and cred.get("key")):
                out.append(f"{where}: no bearer token Secret (httpConfig.authorization.credentials)")
    return out


def _runner_token_violations(resource_type: str, name: str, props: Mapping[str, Any]) -> list[str]:
    pod = _pod_spec(resource_type, props)
    secret_volumes = {v.get("name") for v in map(_map, _seq(pod.get("volumes"))) if "secret" in v}
    for c in map(_map, _seq(pod.get("containers"))):
        env = {e.get("name"): e for e in map(_map, _seq(c.get("env")))}
        token = env.get(TOKEN_ENV)
        if token is None:
            continue
        if "valueFrom" in token and "secretKeyRef" in _map(token.get("valueFrom")):
            return []
        path = token.get("value")
        for m in map(_map, _seq(c.get("volumeMounts"))):
            mpath = m.get("mountPath")
            if (
                m.get("name") in secret_volumes
                and isinstance(path, str)
                and isinstance(mpath, str)
                and _covers(mpath, path)
            ):
                return []
        return [f"{name}: {TOKEN_ENV} does not point into a mounted Secret"]
    return [f"{name}: the remediation runner has no webhook token ({TOKEN_ENV} from a Secret)"]


def webhook_requires_token(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    name, labels, _ = _meta(props)
    if resource_type == CONFIG_MAP and labels.get(ALERTMANAGER_CONFIG_LABEL) == "true":
        return _alertmanager_file_violations(name, _map(props.get("data")).get("alertmanager.yml"))
    if resource_type == ALERTMANAGER_CONFIG_CR:
        return _alertmanager_cr_violations(name, _map(props.get("spec")))
    if resource_type in WORKLOAD_TYPES and labels.get(COMPONENT_LABEL) == RUNNER_COMPONENT:
        return _runner_token_violations(resource_type, name, props)
    return []


# --- images pinned by digest ----------------------------------------------------------------


# Which stack config key sets a container's image, by the workload's component label (the values
# components/ give base_labels) and, for munge, the container's name: the violation names the fix.
_IMAGE_KEYS = {
    SLURMCTLD_COMPONENT: "slurm.images.controller",
    "login": "slurm.images.login",
    "slurmd": "slurm.images.slurmd",
    RUNNER_COMPONENT: "runner.image",  # its munge containers too: the runner image has munge
    "xid-watcher": "monitoring.watcherImage",
    "gpu-metrics": "monitoring.dcgmImage",
}
_SLURM_COMPONENTS = frozenset({SLURMCTLD_COMPONENT, "login", "slurmd"})
_MUNGE_CONTAINERS = frozenset({"munge-key", "munged"})
_BUILD_FIX = (
    "run `autoheal images build --push REGISTRY` (the stack defaults to the images.lock.json it writes)"
)


def _image_fix(component: Any, container: Any) -> str:
    """How to pin this container's image: the stack config key to set and where a digest comes from."""
    if component in _SLURM_COMPONENTS and container in _MUNGE_CONTAINERS:
        key = "slurm.images.munge"
    elif isinstance(component, str) and component in _IMAGE_KEYS:
        key = _IMAGE_KEYS[component]
    else:  # not one of the stack's own workloads
        return "name it as repo@sha256:<digest>"
    if key == "monitoring.dcgmImage":
        return (
            f"set autoheal:{key} to NVIDIA's dcgm-exporter by digest "
            "(nvcr.io/nvidia/k8s/dcgm-exporter@sha256:...), or autoheal:monitoring.dcgmExporter: false "
            "where the GPU Operator runs dcgm-exporter"
        )
    return f"set autoheal:{key} to a reference by digest (repo@sha256:...), or {_BUILD_FIX}"


def images_pinned_by_digest(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """Every container (init containers and sidecars too) names its image by digest: a tag can
    move, so two nodes of one pool could run different code and a rollback is not a rollback."""
    if resource_type not in WORKLOAD_TYPES:
        return []
    name, labels, _ = _meta(props)
    spec = _pod_spec(resource_type, props)
    found = []
    for field in ("initContainers", "containers"):
        for c in map(_map, _seq(spec.get(field))):
            image = c.get("image")
            if isinstance(image, str) and not pinned_by_digest(image):
                fix = _image_fix(labels.get(COMPONENT_LABEL), c.get("name"))
                found.append(
                    f"{name}: container {c.get('name', '?')} image {image!r} is not pinned by digest "
                    f"(a tag can move under a running pool); {fix}"
                )
    return found


# --- SSH not open to the world ---------------------------------------------------------------

SERVICE = "kubernetes:core/v1:Service"
LOGIN_COMPONENT = "login"  # the Slurm login's Service (components/slurm/login.py)
SSH_PORT = 22
_EVERYWHERE = frozenset({"0.0.0.0/0", "::/0"})


def login_not_open_to_the_world(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """A LoadBalancer Service serving SSH admits only listed source ranges, none of them all."""
    if resource_type != SERVICE:
        return []
    name, labels, annotations = _meta(props)
    spec = _map(props.get("spec"))
    if spec.get("type") != "LoadBalancer" or _waived(annotations):
        return []
    ssh = labels.get(COMPONENT_LABEL) == LOGIN_COMPONENT or any(
        _map(p).get("port") == SSH_PORT for p in _seq(spec.get("ports"))
    )
    if not ssh:
        return []
    ranges = [r for r in _seq(spec.get("loadBalancerSourceRanges")) if isinstance(r, str)]
    fix = (
        "set autoheal:slurm.loginSourceRanges to the CIDRs users connect from, or annotate "
        f"{POLICY_WAIVER_ANNOTATION} with the reason (autoheal:slurm.loginPolicyWaiver)"
    )
    if not ranges:
        return [
            f"{name}: a LoadBalancer serving SSH with no loadBalancerSourceRanges is open to the world; {fix}"
        ]
    open_to = sorted(set(ranges) & _EVERYWHERE)
    if open_to:
        return [f"{name}: loadBalancerSourceRanges {open_to} admit SSH from anywhere; {fix}"]
    return []


RESOURCE_RULES = {
    "gpu-pool-spares-and-remediation": gpu_pool_has_spares_and_remediation,
    "controller-state-persistent": controller_state_is_persistent,
    "no-wildcard-rbac": no_wildcard_rbac,
    "webhook-requires-token": webhook_requires_token,
    "images-pinned-by-digest": images_pinned_by_digest,
    "login-source-ranges": login_not_open_to_the_world,
}
STACK_RULE = "gpu-pools-have-a-runner"


def judge(resources: Iterable[tuple[str, str, Mapping[str, Any]]]) -> list[tuple[str, str, str]]:
    """(rule, urn, message) of every violation in a stack's resources, given as (urn, type,
    inputs): the pack's verdict without the pack's runtime (a stack-wide rule has no urn)."""
    listed = list(resources)
    found = [
        (name, urn, msg)
        for urn, rtype, inputs in listed
        for name, rule in RESOURCE_RULES.items()
        for msg in rule(rtype, inputs)
    ]
    found += [(STACK_RULE, "", msg) for msg in stack_has_remediation((t, i) for _, t, i in listed)]
    return found
