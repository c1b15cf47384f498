"""The stack's configuration model: what `Pulumi.<stack>.yaml` may say, validated before any
resource is declared.

Pulumi hands a Python program every config value as a string (objects and arrays as JSON), and
its project schema only checks top-level types. So `__main__.py` reads the known keys, and this
module decodes and validates them with pydantic; a mistake fails the preview with a message that
names the key as the user typed it (`autoheal:pools[0].size`) and the type that was expected.
Components never see this module: `__main__.py` turns the validated model into their plain args.
Its models are named `*Spec` (StackSpec, PoolSpec, RunnerSpec, ...): what a stack file declares,
not the runner's own config (remediation/config.py, RunnerConfig), the lab's (lab/config.py) or a
component's args (`*Args`).

The images the config does not name come from the lock file `autoheal images build` writes
(autoheal/imagelock.py, `with_locked_images`): references by digest, which the policy pack
requires, without copying digests into every stack file.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from autoheal.backends import PoolBackendName, default_backend
from autoheal.errors import ConfigError
from autoheal.imagelock import LOCK_FILE, read_lock
from autoheal.journalrules import JournalKind, postgres_url_problem, replicas_problem
from autoheal.names import is_node_name
from components.device_plugins import (
    EFA_DEVICE_PLUGIN_IMAGE,
    GPU_OPERATOR_VERSION,
    NVIDIA_DEVICE_PLUGIN_IMAGE,
)
from components.instances import instance_type, slurmd_fit_problem

PROJECT = "autoheal"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _known_instance_type(value: str) -> str:
    instance_type(value)  # a ValueError naming the known types
    return value


class SystemNodeGroupSpec(_Model):
    """The untainted nodes CoreDNS, slurmctld, login and the runner run on (never drained by the
    runbook: it only touches GPU pools' nodes)."""

    instance_type: str = Field(default="m7i.xlarge", alias="instanceType")
    size: int = Field(default=2, ge=1)
    ami_type: str = Field(default="AL2023_x86_64_STANDARD", alias="amiType")
    disk_size_gb: int = Field(default=50, ge=20, alias="diskSizeGb")
    labels: dict[str, str] = Field(default_factory=dict)

    _instance_type = field_validator("instance_type")(_known_instance_type)


class EksStorageSpec(_Model):
    """The StorageClasses the EKS stack can make; each is declared when the stack's storage keys
    (slurm.storage.stateStorageClass / sharedStorageClass, runner.journalStorageClass) name it."""

    ebs_class: str = Field(default="gp3", alias="ebsClass", pattern=_DNS_SUBDOMAIN)
    efs_class: str = Field(default="efs-sc", alias="efsClass", pattern=_DNS_SUBDOMAIN)
    # FSx for Lustre, a file system per claim (checkpoints: slurm.storage.checkpointStorageClass)
    fsx_class: str = Field(default="fsx-lustre", alias="fsxClass", pattern=_DNS_SUBDOMAIN)
    fsx_deployment_type: Literal["SCRATCH_2", "PERSISTENT_1", "PERSISTENT_2"] = Field(
        default="PERSISTENT_2", alias="fsxDeploymentType"
    )
    # MB/s per TiB of a PERSISTENT file system (PERSISTENT_2: 125, 250, 500 or 1000)
    fsx_throughput: int = Field(default=250, alias="fsxThroughput", ge=12, le=1000)


class EksSpec(_Model):
    region: str = Field(min_length=1)
    subnet_ids: list[str] = Field(alias="subnetIds", min_length=2)
    version: str = "1.31"
    endpoint_public_access: bool = Field(default=True, alias="endpointPublicAccess")
    public_access_cidrs: list[str] = Field(default_factory=list, alias="publicAccessCidrs")
    tags: dict[str, str] = Field(default_factory=dict)
    system_node_group: SystemNodeGroupSpec = Field(default=SystemNodeGroupSpec(), alias="systemNodeGroup")
    # what advertises nvidia.com/gpu: NVIDIA's device plugin (a DaemonSet), the GPU Operator
    # (a Helm release), or nothing (the cluster already runs one)
    device_plugin: Literal["nvidia", "gpu-operator", "none"] = Field(default="nvidia", alias="devicePlugin")
    device_plugin_image: str = Field(default=NVIDIA_DEVICE_PLUGIN_IMAGE, alias="devicePluginImage")
    gpu_operator_version: str = Field(default=GPU_OPERATOR_VERSION, alias="gpuOperatorVersion")
    efa_device_plugin_image: str = Field(default=EFA_DEVICE_PLUGIN_IMAGE, alias="efaDevicePluginImage")
    # SHA-1 thumbprints for the OIDC provider; none: IAM verifies the EKS issuer's certificate
    # against its own trusted CAs (what it has done for EKS issuers since 2023)
    oidc_thumbprints: list[str] = Field(default_factory=list, alias="oidcThumbprints", max_length=5)
    storage: EksStorageSpec = EksStorageSpec()

    @field_validator("oidc_thumbprints")
    @classmethod
    def _thumbprints(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if not re.fullmatch(r"[0-9a-fA-F]{40}", v)]
        if bad:
            raise ValueError(f"a thumbprint is 40 hex digits (a SHA-1), got {bad}")
        return value


class ClusterSpec(_Model):
    backend: Literal["kubeconfig", "eks"] = "kubeconfig"
    kubeconfig: str | None = None
    context: str | None = None
    eks: EksSpec | None = None

    @model_validator(mode="after")
    def _backend_args(self) -> ClusterSpec:
        if self.backend == "kubeconfig" and not self.kubeconfig:
            raise ValueError("backend 'kubeconfig' needs 'kubeconfig' (a path to a kubeconfig)")
        if self.backend == "eks" and self.eks is None:
            raise ValueError("backend 'eks' needs an 'eks' object (region, subnetIds)")
        return self


class TaintSpec(_Model):
    key: str = Field(min_length=1)
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class EksNodeGroupSpec(_Model):
    instance_type: str = Field(default="p5.48xlarge", alias="instanceType")
    ami_type: str = Field(default="AL2023_x86_64_NVIDIA", alias="amiType")
    capacity_type: Literal["ON_DEMAND", "SPOT", "CAPACITY_BLOCK"] = Field(
        default="ON_DEMAND", alias="capacityType"
    )
    disk_size_gb: int = Field(default=200, ge=20, alias="diskSizeGb")
    # EFA interfaces, a cluster placement group and the EFA device plugin; default: where the
    # instance type has EFA (components/instances.py)
    efa: bool | None = None
    # an EC2 capacity reservation (or capacity block) the pool's instances launch into
    capacity_reservation_id: str | None = Field(
        default=None, alias="capacityReservationId", pattern=r"^cr-[0-9a-f]{8,17}$"
    )
    # the pool's subnets (none: the cluster's; with EFA, the first of them, as a cluster
    # placement group lives in one availability zone)
    subnet_ids: list[str] = Field(default_factory=list, alias="subnetIds")

    _instance_type = field_validator("instance_type")(_known_instance_type)

    @model_validator(mode="after")
    def _efa_possible(self) -> EksNodeGroupSpec:
        if self.efa and not instance_type(self.instance_type).has_efa:
            raise ValueError(f"efa: instance type {self.instance_type} has no EFA interfaces")
        if self.capacity_type == "CAPACITY_BLOCK" and self.capacity_reservation_id is None:
            raise ValueError("capacityType CAPACITY_BLOCK needs capacityReservationId (the block's id)")
        return self

    @property
    def uses_efa(self) -> bool:
        return instance_type(self.instance_type).has_efa if self.efa is None else self.efa


class PoolSpec(_Model):
    name: str
    prefix: str | None = None
    gpu_model: str = Field(default="h100", alias="gpuModel", min_length=1)
    gpus_per_node: int = Field(default=8, ge=1, le=64, alias="gpusPerNode")
    size: int = Field(ge=1)
    spares: int = Field(default=1, ge=0)
    headroom: int = Field(default=0, ge=0)
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[TaintSpec] = Field(default_factory=list)
    cpus: int = Field(default=2, ge=1)
    real_memory_mb: int = Field(default=1000, ge=1, alias="realMemoryMb")
    # slurmd requests (= limits) cpus and realMemoryMb, a Guaranteed pod; default: on EKS (where
    # the instance type says what fits), not on an existing cluster whose nodes the stack cannot see
    guaranteed: bool | None = None
    remediation: bool = True
    # Why this pool may run without spares or remediation; the policy pack decides, not this model.
    waiver: str | None = None
    eks: EksNodeGroupSpec | None = None
    # how the runbook reboots and retires this pool's nodes (pools/); default: StackSpec.backend
    backend: PoolBackendName | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not is_node_name(value) or "." in value:
            raise ValueError("must be a DNS label (lower-case a-z, 0-9 and '-')")
        return value

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str | None) -> str | None:
        if value is not None and (not is_node_name(f"{value}-1") or "." in value):
            raise ValueError("must make valid node names (lower-case a-z, 0-9 and '-')")
        return value

    @property
    def node_prefix(self) -> str:
        return self.prefix or self.name


class SlurmImagesSpec(_Model):
    """Unset: the lock file's `slurm` image, else components/slurm's tag default."""

    controller: str | None = None
    slurmd: str | None = None
    login: str | None = None
    munge: str | None = None


class SlurmStorageSpec(_Model):
    state_size: str = Field(default="10Gi", alias="stateSize")
    home_size: str = Field(default="100Gi", alias="homeSize")
    checkpoint_size: str = Field(default="1Ti", alias="checkpointSize")
    state_storage_class: str | None = Field(default=None, alias="stateStorageClass")
    shared_storage_class: str | None = Field(default=None, alias="sharedStorageClass")
    shared_access_mode: Literal["ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"] = Field(
        default="ReadWriteMany", alias="sharedAccessMode"
    )
    # /checkpoints on a class of its own (on EKS: FSx for Lustre, cluster.eks.storage.fsxClass);
    # unset: sharedStorageClass
    checkpoint_storage_class: str | None = Field(default=None, alias="checkpointStorageClass")


class SoftwareVolumeSpec(_Model):
    """A read-only software tree for the jobs (components/slurm/storage.py): a claim or a host path."""

    name: str = Field(pattern=r"^[a-z]([-a-z0-9]{0,30}[a-z0-9])?$")
    mount_path: str = Field(alias="mountPath", pattern=r"^/[^\s]*$")
    claim: str | None = None
    host_path: str | None = Field(default=None, alias="hostPath", pattern=r"^/[^\s]*$")

    @model_validator(mode="after")
    def _one_source(self) -> SoftwareVolumeSpec:
        if (self.claim is None) == (self.host_path is None):
            raise ValueError(f"software volume {self.name!r}: give exactly one of claim and hostPath")
        if self.name in (
            "home",
            "checkpoints",
            "spool",
            "slurm-config",
            "munge-key",
            "munge-etc",
            "munge-socket",
        ):
            raise ValueError(
                f"software volume {self.name!r}: the name is taken by a Slurm volume; pick another"
            )
        return self


class SlurmSpec(_Model):
    namespace: str = "slurm"
    cluster_name: str = Field(default="autoheal", alias="clusterName")
    images: SlurmImagesSpec = SlurmImagesSpec()
    storage: SlurmStorageSpec = SlurmStorageSpec()
    authorized_keys: list[str] = Field(default_factory=list, alias="authorizedKeys")
    login_service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", alias="loginServiceType"
    )
    # the CIDRs a LoadBalancer login admits SSH from (the Service's loadBalancerSourceRanges)
    login_source_ranges: list[str] = Field(default_factory=list, alias="loginSourceRanges")
    # why a LoadBalancer login may admit SSH from anywhere (the policy pack refuses it otherwise)
    login_policy_waiver: str | None = Field(default=None, alias="loginPolicyWaiver", min_length=1)
    slurm_user: str = Field(default="slurm", alias="slurmUser")
    grace_seconds: int = Field(default=120, ge=0, alias="graceSeconds")
    # the stack's waitForRollout for Slurm alone (a lab whose real nodes run Slurm but have no
    # dcgm-exporter image waits for Slurm and not for monitoring)
    wait_for_rollout: bool | None = Field(default=None, alias="waitForRollout")
    # taints slurmctld and login tolerate (a cluster, like the lab, whose every node is a GPU node)
    tolerate_taints: list[TaintSpec] = Field(default_factory=list, alias="tolerateTaints")
    # labels a node must carry to run slurmctld and login (system nodes; the lab: its real nodes)
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    # read-only software trees mounted in the login and slurmd pods (the jobs' Python and PyTorch)
    software: list[SoftwareVolumeSpec] = Field(default_factory=list)

    @field_validator("login_source_ranges")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            try:
                ipaddress.ip_network(cidr)
            except ValueError:
                raise ValueError(f"{cidr!r} is not a CIDR (like 203.0.113.0/24)") from None
        return value


class MonitoringSpec(_Model):
    prometheus_operator: bool = Field(default=False, alias="prometheusOperator")
    # labels the Prometheus Operator selects its rules, monitors and Alertmanager configs by
    # (kube-prometheus-stack's default: {release: <its release name>})
    operator_labels: dict[str, str] = Field(default_factory=dict, alias="operatorLabels")
    # dcgm-exporter's image, by digest (the default is NVIDIA's tag: the policy pack refuses it)
    dcgm_image: str | None = Field(default=None, alias="dcgmImage")
    # False where something else runs dcgm-exporter (the GPU Operator; the lab's GPU simulator)
    dcgm_exporter: bool = Field(default=True, alias="dcgmExporter")
    # the XID watchers' image (the runner's: the lock file's, else ghcr.io/autoheal/runner:<version>)
    watcher_image: str | None = Field(default=None, alias="watcherImage")
    # the Prometheus the runbook reads a failed node's last DCGM series from, for its evidence
    # bundle (default with prometheusOperator: the operator's prometheus-operated Service)
    prometheus_url: str | None = Field(default=None, alias="prometheusUrl", pattern=r"^https?://\S+$")
    # where the XID watchers post (Alertmanager's base URL; default the Prometheus Operator's)
    alertmanager_url: str | None = Field(default=None, alias="alertmanagerUrl", pattern=r"^https?://\S+$")
    # a node directory of simulated kernel logs (<node>/kmsg) instead of /dev/kmsg: the lab's
    watcher_kernel_log_dir: str | None = Field(default=None, alias="watcherKernelLogDir", pattern=r"^/\S*$")
    watcher_resend_seconds: float = Field(default=60.0, gt=0, alias="watcherResendSeconds")
    watcher_hold_seconds: float = Field(default=300.0, gt=0, alias="watcherHoldSeconds")
    alertmanager_secrets_dir: str = Field(default="/etc/alertmanager/secrets", alias="alertmanagerSecretsDir")


class SecretKeySpec(_Model):
    """A key of a Secret in the runner's namespace, by reference: the stack never holds its value."""

    name: str = Field(pattern=r"^[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?$")
    key: str = Field(default="password", pattern=r"^[-._a-zA-Z0-9]{1,253}$")


class RunnerPostgresSpec(_Model):
    """The PostgreSQL journal the runner's replicas share (components/runner.py, RunnerPostgresArgs)."""

    # a libpq URL without a password: postgresql://user@host:port/db?sslmode=verify-full
    url: str = Field(min_length=1)
    # the password, given to the runner as PGPASSWORD; none: PGPASSFILE or a passwordless method
    password: SecretKeySpec | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        problem = postgres_url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class RunnerSpec(_Model):
    image: str | None = None
    dry_run: bool = Field(default=False, alias="dryRun")
    port: int = Field(default=9095, ge=1, le=65535)
    service_port: int = Field(default=8080, ge=1, le=65535, alias="servicePort")
    rules_file: str = Field(default="config/rules.yaml", alias="rulesFile")
    playbooks_dir: str = Field(default="playbooks", alias="playbooksDir")
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", alias="serviceType"
    )
    # the Service's node port when serviceType is NodePort (none: Kubernetes picks one)
    node_port: int | None = Field(default=None, ge=30000, le=32767, alias="nodePort")
    # reach slurmctld from the runner's pod (munge sidecar + the cluster's slurm.conf and key)
    slurm_access: bool = Field(default=True, alias="slurmAccess")
    journal_size: str = Field(default="1Gi", alias="journalSize")
    journal_storage_class: str | None = Field(default=None, alias="journalStorageClass")
    settings: dict[str, Any] = Field(default_factory=dict)
    tolerate_taints: list[TaintSpec] = Field(default_factory=list, alias="tolerateTaints")
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    # "sqlite": one runner, its journal on a PVC; "postgres": `replicas` runners sharing `postgres`
    # with leader election (autoheal/journalrules.py has the rules, components/runner.py the pods)
    journal: JournalKind = "sqlite"
    postgres: RunnerPostgresSpec | None = Field(default=None, validate_default=True)
    replicas: int = 1

    @field_validator("postgres")
    @classmethod
    def _postgres(cls, value: RunnerPostgresSpec | None, info: ValidationInfo) -> RunnerPostgresSpec | None:
        journal = info.data.get("journal")
        if journal == "postgres" and value is None:
            raise ValueError("journal 'postgres' needs postgres: {url: postgresql://user@host/db}")
        if journal == "sqlite" and value is not None:
            raise ValueError("postgres is only for journal 'postgres' (set journal: postgres)")
        return value

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, value: int, info: ValidationInfo) -> int:
        problem = replicas_problem(info.data.get("journal", "sqlite"), value)
        if problem is not None:
            raise ValueError(problem)
        return value


class StackSpec(_Model):
    namespace: str = "autoheal"
    cluster: ClusterSpec
    pools: list[PoolSpec] = Field(min_length=1)
    slurm: SlurmSpec = SlurmSpec()
    monitoring: MonitoringSpec = MonitoringSpec()
    runner: RunnerSpec = RunnerSpec()
    wait_for_rollout: bool = Field(default=True, alias="waitForRollout")
    # `pulumi up` checks the cluster first (components/preflight/); false only where the
    # cluster runs no pods by design (the KWOK lab: no storage provisioner, no real node)
    preflight: bool = True

    @model_validator(mode="after")
    def _unique_pools(self) -> StackSpec:
        for what, values in (
            ("names", [p.name for p in self.pools]),
            ("prefixes", [p.node_prefix for p in self.pools]),
        ):
            dupes = sorted({v for v in values if values.count(v) > 1})
            if dupes:
                raise ValueError(f"pool {what} must be unique (pools), repeated: {', '.join(dupes)}")
        for i, pool in enumerate(self.pools):
            if pool.backend == "lab" and self.cluster.backend == "eks":
                raise ValueError(
                    f"pools[{i}] ({pool.name}): backend 'lab' is the lab's pool controller; on EKS use 'aws'"
                )
        if self.cluster.backend == "eks":
            missing = [p.name for p in self.pools if p.eks is None]
            if missing:
                raise ValueError(f"backend 'eks' needs 'eks' on every pool; missing: {missing}")
            for i, pool in enumerate(self.pools):
                if pool.eks is not None and self.guaranteed(pool):
                    itype = instance_type(pool.eks.instance_type)
                    problem = slurmd_fit_problem(itype, pool.cpus, pool.real_memory_mb)
                    if problem:
                        raise ValueError(f"pools[{i}] ({pool.name}): {problem} (or guaranteed: false)")
        return self

    def backend(self, pool: PoolSpec) -> str:
        """The pool's backend: as declared, else the cluster's default (autoheal.backends)."""
        return pool.backend or default_backend(self.cluster.backend)

    def guaranteed(self, pool: PoolSpec) -> bool:
        """Whether the pool's slurmd pods are Guaranteed (PoolSpec.guaranteed, by default on EKS)."""
        return self.cluster.backend == "eks" if pool.guaranteed is None else pool.guaranteed


# Top-level keys and whether Pulumi passes them as JSON (objects, arrays) or as plain strings.
STRUCTURED_KEYS = ("cluster", "pools", "slurm", "monitoring", "runner")
SCALAR_KEYS = ("namespace", "waitForRollout", "preflight")

_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "bool_type": "a boolean (true or false)",
    "bool_parsing": "a boolean (true or false)",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "an object (a mapping)",
    "model_type": "an object (a mapping)",
    "model_attributes_type": "an object (a mapping)",
}


# keys whose value is not repeated in an error: a refused journal URL may carry a password
_NOT_ECHOED = {("runner", "postgres", "url")}


def _key_path(loc: tuple[int | str, ...]) -> str:
    out = PROJECT
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += (":" if i == 0 else ".") + part
    return out


def _describe(err: Mapping[str, Any]) -> str:
    key = _key_path(tuple(err["loc"]))
    kind = err["type"]
    if kind == "missing":
        return f"{key}: required, but not set"
    if kind == "extra_forbidden":
        return f"{key}: unknown key (check its spelling)"
    shown = repr(err.get("input"))[:60]
    if kind in _EXPECTED:
        return f"{key}: expected {_EXPECTED[kind]}, got {shown}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    if isinstance(err.get("input"), dict | list) or tuple(err["loc"]) in _NOT_ECHOED:
        return f"{key}: {msg}"  # a rule across several keys: the message names them
    return f"{key}: {msg} (got {shown})"


def parse_stack_config(raw: Mapping[str, Any]) -> StackSpec:
    """Validate decoded config values (keys as in Pulumi.<stack>.yaml, without the project)."""
    try:
        return StackSpec.model_validate(dict(raw))
    except ValidationError as exc:
        problems = [_describe(e) for e in exc.errors()]
        raise ConfigError("invalid stack configuration:\n  " + "\n  ".join(problems)) from exc


def read_stack_config(get: Callable[[str], str | None]) -> StackSpec:
    """Read the known keys through `get` (pulumi.Config().get) and validate them. Unset keys take
    the model's defaults, which mirror the defaults in Pulumi.yaml."""
    raw: dict[str, Any] = {}
    for key in SCALAR_KEYS:
        value = get(key)
        if value is not None:
            raw[key] = value
    for key in STRUCTURED_KEYS:
        text = get(key)
        if text is None:
            continue
        try:
            raw[key] = json.loads(text)
        except json.JSONDecodeError:
            kind = "a list" if key == "pools" else "an object"
            raise ConfigError(
                f"{PROJECT}:{key}: expected {kind}, got {text[:60]!r} "
                "(set structured values in Pulumi.<stack>.yaml or with `pulumi config set --path`)"
            ) from None
    return parse_stack_config(raw)


def read_image_lock(root: Path) -> dict[str, str]:
    """The references by digest in the project's lock file (`autoheal images build` writes it);
    none without one: the tag defaults stay, and the policy pack refuses them, naming the fix."""
    return read_lock(root / LOCK_FILE) or {}


def with_locked_images(cfg: StackSpec, locked: Mapping[str, str]) -> StackSpec:
    """`cfg` with the lock's images where the config names none: the `slurm` image for Slurm's
    controller, slurmd, login and munge, the `runner` image for the runner and the XID watchers
    (which run from it). An image the config names always wins, so a stack file can pin one
    image by hand and leave the others to the builder."""
    slurm_ref, runner_ref = locked.get("slurm"), locked.get("runner")
    images = cfg.slurm.images
    if slurm_ref:
        unset = {k: slurm_ref for k, v in images.model_dump().items() if v is None}
        images = images.model_copy(update=unset)
    runner, monitoring = cfg.runner, cfg.monitoring
    if runner_ref and runner.image is None:
        runner = runner.model_copy(update={"image": runner_ref})
    if runner_ref and monitoring.watcher_image is None:
        monitoring = monitoring.model_copy(update={"watcher_image": runner_ref})
    slurm = cfg.slurm.model_copy(update={"images": images})
    return cfg.model_copy(update={"slurm": slurm, "runner": runner, "monitoring": monitoring})


def resolve_path(root: Path, value: str) -> Path:
    """A path from config, relative to the project folder unless absolute."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else (root / p).resolve()


def load_runner_files(root: Path, runner: RunnerSpec) -> tuple[str, dict[str, str]]:
    """The routing rules text and the entry playbooks (top-level *.yml) the runner ships with."""
    rules = resolve_path(root, runner.rules_file)
    try:
        rules_text = rules.read_text()
    except OSError as exc:
        raise ConfigError(f"{PROJECT}:runner.rulesFile: cannot read {rules}: {exc}") from exc
    playbooks: dict[str, str] = {}
    pdir = resolve_path(root, runner.playbooks_dir)
    if not pdir.is_dir():
        raise ConfigError(f"{PROJECT}:runner.playbooksDir: {pdir} is not a folder")
    for path in sorted([*pdir.glob("*.yml"), *pdir.glob("*.yaml")]):
        playbooks[path.name] = path.read_text()
    return rules_text, playbooks
