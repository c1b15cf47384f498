"""The runner's configuration: one YAML file, overridable by AUTOHEAL_* environment variables.

Relative paths are resolved against the config file's folder, so the same file works from any
working directory (a container, a test's tmp dir, the repo root). Secrets are never inline: the
bearer token is read from `token_file`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, ValidationError, field_validator, model_validator

from autoheal.backends import PoolBackendName
from autoheal.errors import ConfigError, field_errors
from autoheal.journalrules import dsn_has_password
from autoheal.labels import OPT_OUT_LABEL, POOL_LABEL, QUARANTINED, STATE_LABEL
from autoheal.names import is_node_name
from autoheal.nodemap import NodeMapRule
from autoheal.yamlfile import read_yaml
from remediation.cordon_sync import DEFAULT_IGNORED_TAINTS
from remediation.errors import RunnerConfigError


class Budgets(BaseModel):
    """How much of the fleet may be in remediation at once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_nodes: int = Field(default=5, ge=1)
    max_pool_percent: float = Field(default=10.0, gt=0, le=100)
    fence_held_nodes: bool = Field(
        default=False,
        description=(
            "past the budget (breaker open) still fence the held incidents' nodes: drain + cordon"
            " only, in fence-only runs (no job signalled, no spare, nothing destructive); see batches.py"
        ),
    )


class FailureDomains(BaseModel):
    """Link faults on many nodes of one failure domain at once (a leaf switch, a rack) are one
    incident for the domain - a human is paged, no node is drained - not a drain of the rack
    (remediation/domains.py). A node's domain is its label `label` (EKS sets
    topology.k8s.aws/network-node-layer-3, the network node nearest the instance, on instances
    with topology), else its entry in `nodes` (clusters without such a label)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    label: str = Field(
        default="topology.k8s.aws/network-node-layer-3",
        pattern=r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$|^$",
        description="the node label naming a node's failure domain ('': none)",
    )
    nodes: dict[str, str] = Field(default_factory=dict, description="node -> domain, where no label says it")
    faults: tuple[Literal["link_flap", "nic_errors"], ...] = Field(
        default=("link_flap", "nic_errors"), description="the degraded fault classes a domain shares"
    )
    min_nodes: int = Field(default=3, ge=2, le=10000, description="this many nodes of a domain: one incident")
    window_seconds: float = Field(default=300.0, gt=0, le=86400, description="...within this window")
    hold_seconds: float = Field(
        default=10.0,
        ge=0,
        le=600,
        description="a link fault of a node with a domain waits this long for its peers before the drain",
    )

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, value: dict[str, str]) -> dict[str, str]:
        bad = sorted(n for n, d in value.items() if not is_node_name(n) or not 0 < len(d) <= 63)
        if bad:
            raise ValueError(f"node names (and a domain of 1-63 characters) expected; got {bad}")
        return value


class NodeCap(BaseModel):
    """Per-node cap: more than `max_incidents` in `window_seconds` -> quarantine and page."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_incidents: int = Field(default=3, ge=1)
    window_seconds: int = Field(default=86400, gt=0)


class NotifySink(BaseModel):
    """A notification target: a generic JSON webhook or a Slack-compatible incoming webhook."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["webhook", "slack"] = "webhook"
    url: HttpUrl
    timeout_seconds: float = Field(default=5.0, gt=0)
    retries: int = Field(default=3, ge=0, le=10)


class LeaderElection(BaseModel):
    """Two or more replicas: only the holder of a Kubernetes Lease runs plays (remediation/leader.py).

    Defaults are shorter than client-go's 15/10/2 s: a killed leader is replaced within about
    `lease_duration_seconds` + `retry_period_seconds`, and healing is what waits meanwhile."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    namespace: str = Field(
        default="",
        pattern=r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?$",
        description="the Lease's namespace; default: the pod's ($POD_NAMESPACE), else autoheal",
    )
    lease_name: str = Field(default="autoheal-runner", pattern=r"^[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?$")
    identity: str = Field(
        default="", max_length=253, description="this replica's name; default: $POD_NAME, else host-pid"
    )
    lease_duration_seconds: float = Field(default=8.0, ge=2, le=300)
    renew_deadline_seconds: float = Field(default=6.0, gt=0)
    retry_period_seconds: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElection:
        if not self.retry_period_seconds < self.renew_deadline_seconds < self.lease_duration_seconds:
            got = (self.retry_period_seconds, self.renew_deadline_seconds, self.lease_duration_seconds)
            raise ValueError(
                "leader_election: need retry_period_seconds < renew_deadline_seconds"
                f" < lease_duration_seconds (got {' / '.join(map(str, got))})"
            )
        return self


class CordonSyncSettings(BaseModel):
    """The cordon sync (remediation/cordon_sync.py): off unless turned on; needs a cluster."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    resync_seconds: int = Field(default=300, ge=5, le=3600)
    ignore_taints: tuple[str, ...] = Field(
        default=DEFAULT_IGNORED_TAINTS, description="taint keys (or 'domain/' prefixes) that are no hold"
    )
    journal_path: Path | None = Field(default=None, description="default: <state_dir>/cordon-sync.jsonl")


class SpareKeeperSettings(BaseModel):
    """The spare keeper (remediation/spares.py): leader only, off unless turned on; needs a cluster."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    namespace: str = Field(
        default="",
        pattern=r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?$",
        description="where the pool ConfigMaps are; default: the pod's ($POD_NAMESPACE), else autoheal",
    )
    interval_seconds: float = Field(default=15.0, ge=1, le=3600)
    journal_path: Path | None = Field(default=None, description="default: <state_dir>/spare-keeper.jsonl")


class DeadNodeSettings(BaseModel):
    """Dead dynamic nodes leave Slurm (remediation/dead_nodes.py): leader only, off unless turned on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    grace_seconds: float = Field(
        default=30.0, ge=0, le=86400, description="how long a Node must be gone (a re-registration is not)"
    )
    interval_seconds: float = Field(default=10.0, ge=1, le=3600)
    journal_path: Path | None = Field(default=None, description="default: <state_dir>/dead-nodes.jsonl")


class DegradedReturnSettings(BaseModel):
    """A node drained for a degraded fault (playbooks/gpu_degraded.yml) is validated and returned
    once its jobs have ended (remediation/degraded_return.py); leader only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    interval_seconds: float = Field(default=15.0, ge=0.2, le=3600, description="how often Slurm is read")
    lookback_seconds: float = Field(
        default=7 * 86400.0, gt=0, description="drains older than this are left to on-call"
    )
    wait_quiet: bool = Field(
        default=True,
        description="validate once the drain's alert resolved (a link quiet for its window); lab: off",
    )


class LendingSettings(BaseModel):
    """Lending Slurm nodes to an inference burst (remediation/lender.py, remediation/lending.py):
    leader only, off unless turned on; needs a cluster."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    dry_run: bool = Field(default=False, description="plan and journal the moves, change nothing")
    paused: bool = Field(default=False, description="start no lend or return; moves under way finish")
    priority_class: str = Field(
        default="inference",
        pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
        description="the PriorityClass of the inference pods whose GPU demand is lent nodes",
    )
    pools: tuple[str, ...] = Field(default=(), description="the pools that lend; empty: every pool")
    max_nodes: int = Field(default=1, ge=0, le=10000, description="at most this many nodes lent fleet-wide")
    max_percent: float = Field(
        default=50.0, ge=0, le=100, description="at most this % of a pool (rounded down)"
    )
    min_training: int = Field(default=1, ge=0, description="never fewer training nodes left in a pool")
    cooldown_seconds: float = Field(default=300.0, ge=0, le=86400, description="no node moves twice within")
    return_after_seconds: float = Field(
        default=120.0, ge=0, le=86400, description="a lent node idle of inference this long goes back"
    )
    grace_seconds: float = Field(
        default=120.0, ge=0, le=86400, description="a lending node's jobs run this long before on_grace"
    )
    on_grace: Literal["requeue", "wait"] = "requeue"
    order: tuple[Literal["priority", "checkpoint"], ...] = ("priority", "checkpoint")
    interval_seconds: float = Field(default=10.0, ge=1, le=3600)
    event_namespace: str = Field(
        default="default",
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="where the Events on lent nodes go (the runner may create Events there)",
    )
    journal_path: Path | None = Field(default=None, description="default: <state_dir>/lending.jsonl")

    @field_validator("pools")
    @classmethod
    def _pools(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = sorted(p for p in value if not is_node_name(p) or "." in p)
        if bad:
            raise ValueError(f"pool names must be DNS labels (a-z, 0-9, '-'); got {bad}")
        return value


class OwnerSettings(BaseModel):
    """Telling job owners what happened to their jobs, and costing each fault (remediation/owners.py,
    remediation/owner_loop.py): leader only, off unless a sink is set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sink: NotifySink | None = Field(
        default=None, description="where owner messages go (webhook: JSON with `to`; slack: `channel`)"
    )
    directory: Path | None = Field(
        default=None, description="YAML: Slurm user -> {email: ...} or {slack: U...}; relative to this file"
    )
    mail_user: bool = Field(default=True, description="else the job's Slurm MailUser (sbatch --mail-user)")
    interval_seconds: float = Field(default=5.0, ge=0.2, le=300)
    quiet_seconds: float = Field(
        default=3.0, ge=0, le=600, description="a storm's batch: an owner's news is held while more comes"
    )
    max_hold_seconds: float = Field(default=60.0, ge=0, le=3600, description="...but no longer than this")
    first_step_wait_seconds: float = Field(
        default=120.0, ge=0, le=3600, description="how long a resumed job's first step is waited for"
    )
    lookback_seconds: float = Field(
        default=2 * 86400.0, gt=0, description="incidents this recent are looked at"
    )
    cost_window_seconds: float = Field(
        default=86400.0, gt=0, description="effective training time is over this window"
    )
    progress_roots: tuple[Path, ...] = Field(
        default=(), description="where a job's progress file (its comment: progress=PATH) may be read"
    )

    @field_validator("progress_roots", "directory")
    @classmethod
    def _absolute(cls, value: Any) -> Any:
        paths = value if isinstance(value, tuple) else (value,)
        bad = [str(p) for p in paths if p is not None and not Path(p).is_absolute()]
        if bad:
            raise ValueError(f"must be absolute paths (or relative to the config file); got {bad}")
        return value


class SlurmRestSettings(BaseModel):
    """slurmrestd of a Slurm autoheal did not deploy (autoheal/slurmrest.py): its URL, the user and
    where its JWT comes from: `token_file` (a mounted Secret, read again when it changes) or
    `jwt_key_file` (slurmctld's jwt key: autoheal signs its own tokens, each `token_lifespan_s`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(pattern=r"^https?://[^/\s]+", description="e.g. http://slurm-restapi.slurm:6820")
    user: str = Field(default="slurm", pattern=r"^[a-z_][a-z0-9_.-]{0,31}$", description="X-SLURM-USER-NAME")
    token_file: Path | None = None
    jwt_key_file: Path | None = None
    token_lifespan_s: float = Field(default=1800.0, ge=10, le=86400)
    api_version: Literal["v0.0.45", "v0.0.44"] | None = Field(
        default=None, description="default: newest served"
    )
    timeout_seconds: float = Field(default=30.0, gt=0, le=120)

    @model_validator(mode="after")
    def _one_token_source(self) -> SlurmRestSettings:
        if (self.token_file is None) == (self.jwt_key_file is None):
            raise ValueError(
                "token_file: set exactly one of token_file (a JWT in a mounted Secret) and jwt_key_file"
                " (slurmctld's jwt key: autoheal signs its own tokens)"
            )
        return self


class NodeMapSettings(BaseModel):
    """Which Slurm node a Kubernetes node is (autoheal/nodemap.py): `same`, `pod-hostname` (the slurmd
    pod's hostname, pods chosen by `selector`) or `annotation` (the node annotation `annotation`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: Literal["same", "pod-hostname", "annotation"] = "same"
    selector: str = Field(default="", max_length=1000)
    annotation: str = Field(default="", max_length=317)

    @model_validator(mode="after")
    def _complete(self) -> NodeMapSettings:
        try:
            NodeMapRule(self.rule, self.selector, self.annotation).check()
        except ConfigError as exc:  # "slurm.node_map.selector: ..." -> the field's own name first
            raise ValueError(str(exc).removeprefix("slurm.node_map.")) from exc
        return self


class SlurmSettings(BaseModel):
    """`backend: own`: the Slurm autoheal deployed (slurm.conf and munge, play_vars). `existing`: a
    Slurm someone else runs (Slinky, soperator, manifests), reached through slurmrestd (`rest`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["own", "existing"] = "own"
    rest: SlurmRestSettings | None = None
    node_map: NodeMapSettings = NodeMapSettings()

    @model_validator(mode="after")
    def _rest_for_existing(self) -> SlurmSettings:
        if self.backend == "existing" and self.rest is None:
            raise ValueError("rest: backend existing needs rest (url, user, token_file or jwt_key_file)")
        return self


class RunnerConfig(BaseModel):
    """Everything `autoheal serve` needs; see config/runner.yaml for a commented example."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    listen_host: str = "127.0.0.1"
    listen_port: int = Field(default=9095, ge=0, le=65535)
    token_file: Path
    journal_path: Path | None = Field(default=None, description="the SQLite journal: one runner's file")
    journal_dsn: str | None = Field(
        default=None,
        max_length=1000,
        description="a PostgreSQL journal that replicas share: a libpq URL or conninfo, without a"
        " password (give it as PGPASSWORD or in PGPASSFILE)",
    )
    rules_file: Path
    playbook_dir: Path
    state_dir: Path = Field(description="ansible-runner private data dirs, node locks")
    kubeconfig: Path | None = None
    dry_run: bool = False
    budgets: Budgets = Budgets()
    node_cap: NodeCap = NodeCap()
    failure_domains: FailureDomains = FailureDomains()
    dedup_window_seconds: int = Field(default=900, ge=0)
    opt_out_label: str = OPT_OUT_LABEL
    pool_label: str = POOL_LABEL
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    max_concurrent_runs: int = Field(default=4, ge=1, le=64)
    batch_window_seconds: float = Field(default=0.3, ge=0, le=60)
    max_batch: int = Field(default=100, ge=1)
    max_concurrent_fences: int = Field(
        default=2,
        ge=0,
        le=16,
        description="fence-only runs when more nodes wait than free run slots take (0: off); see batches.py",
    )
    max_fence_batch: int = Field(default=500, ge=1)
    warm_fence: bool = Field(
        default=True,
        description="fence on the warm path (no play start-up; the play's own fence step follows and"
        " finds it done); see remediation/warmfence.py",
    )
    pool_cache_seconds: float = Field(default=60.0, ge=0, description="how long pool membership is cached")
    quarantine_label: str = Field(
        default=f"{STATE_LABEL}={QUARANTINED}",
        pattern=r"^[A-Za-z0-9./_-]{1,253}=[A-Za-z0-9._-]{0,63}$",
        description="the label the fence sets; such a node found uncordoned cancels its incident",
    )
    uncordon_check_seconds: float = Field(
        default=5.0, ge=0, description="how often to look for nodes uncordoned by hand (0: never)"
    )
    journal_retention_days: float = Field(
        default=90.0,
        ge=0,
        description="closed incidents older than this are pruned from the journal (0: never)",
    )
    step_timeout_seconds: int = Field(default=900, ge=1)
    run_timeout_seconds: int = Field(default=3600, ge=1)
    grace_seconds: int = Field(default=120, ge=0)
    poll_seconds: float = Field(default=0.5, gt=0, le=10)
    ansible_python: Path | None = Field(
        default=None, description="interpreter for localhost tasks; default: this Python"
    )
    notify: tuple[NotifySink, ...] = ()
    in_cluster: bool = Field(
        default=False,
        description="no kubeconfig: the pod's ServiceAccount (remediation/incluster.py); error outside one",
    )
    cluster_checks: bool = Field(
        default=False, description="/readyz also checks the API server and slurmctld (on in a pod)"
    )
    cordon_sync: CordonSyncSettings = CordonSyncSettings()
    spare_keeper: SpareKeeperSettings = SpareKeeperSettings()
    dead_nodes: DeadNodeSettings = DeadNodeSettings()
    lending: LendingSettings = LendingSettings()
    degraded_return: DegradedReturnSettings = DegradedReturnSettings()
    owners: OwnerSettings = OwnerSettings()
    leader_election: LeaderElection = LeaderElection()
    slurm: SlurmSettings = SlurmSettings()
    play_vars: dict[str, Any] = Field(
        default_factory=dict,
        description="static extra vars for every play (e.g. autoheal_slurm_conf); rules override",
    )
    pool_backends: dict[str, PoolBackendName] = Field(
        default_factory=dict,
        description="pool -> how its nodes are rebooted and retired (autoheal.backends); an incident"
        " admitted on a node of such a pool runs with autoheal_backend set so, unless its rule sets it",
    )

    @model_validator(mode="after")
    def _one_journal(self) -> RunnerConfig:
        if (self.journal_path is None) == (self.journal_dsn is None):
            raise ValueError(
                "journal_path: set exactly one of journal_path (a SQLite file) and journal_dsn"
                " (a PostgreSQL database, for replicas)"
            )
        if self.journal_dsn is not None and dsn_has_password(self.journal_dsn):
            raise ValueError(
                "journal_dsn: carries a password; remove it and give it as PGPASSWORD or in PGPASSFILE"
            )
        return self

    @field_validator("pool_backends")
    @classmethod
    def _pool_backends(cls, value: dict[str, str]) -> dict[str, str]:
        bad = sorted(p for p in value if not is_node_name(p) or "." in p)
        if bad:
            raise ValueError(f"pool names must be DNS labels (a-z, 0-9, '-'); got {bad}")
        return value

    @field_validator("play_vars")
    @classmethod
    def _play_vars(cls, value: dict[str, Any]) -> dict[str, Any]:
        from remediation.rules import check_extra_var

        return {k: check_extra_var(k, v) for k, v in value.items()}


_PATH_KEYS = (
    "token_file",
    "journal_path",
    "rules_file",
    "playbook_dir",
    "state_dir",
    "kubeconfig",
    "ansible_python",
)
# play inputs that are paths (playbooks/specs/inputs.yml, type path)
_PLAY_PATH_VARS = (
    "autoheal_slurm_conf",
    "autoheal_kubeconfig",
    "autoheal_journal_events",
    "autoheal_lab_root",
)
_ENV_PREFIX = "AUTOHEAL_"
_ENV_KEYS = {
    "TOKEN_FILE": "token_file",
    "JOURNAL_PATH": "journal_path",
    "JOURNAL_DSN": "journal_dsn",
    "RULES_FILE": "rules_file",
    "PLAYBOOK_DIR": "playbook_dir",
    "STATE_DIR": "state_dir",
    "KUBECONFIG_PATH": "kubeconfig",
    "DRY_RUN": "dry_run",
    "LISTEN_HOST": "listen_host",
    "LISTEN_PORT": "listen_port",
}


def parse_config(data: Any, origin: str, base: Path, env: dict[str, str] | None = None) -> RunnerConfig:
    """Validate a config mapping; `base` resolves relative paths, `env` overrides keys."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RunnerConfigError(f"{origin}: the runner config must be a mapping")
    merged = dict(data)
    for suffix, key in _ENV_KEYS.items():
        value = (env or {}).get(_ENV_PREFIX + suffix)
        if value is not None:
            merged[key] = value
    for key in _PATH_KEYS:
        if merged.get(key) is not None:
            p = Path(str(merged[key])).expanduser()
            merged[key] = p if p.is_absolute() else (base / p).resolve()
    if isinstance(merged.get("owners"), dict):
        owners = merged["owners"] = dict(merged["owners"])
        if isinstance(owners.get("directory"), str):
            owners["directory"] = (base / Path(owners["directory"]).expanduser()).resolve()
        if isinstance(owners.get("progress_roots"), list):
            owners["progress_roots"] = [
                (base / Path(r).expanduser()).resolve() if isinstance(r, str) else r
                for r in owners["progress_roots"]
            ]
    rest = merged.get("slurm", {}).get("rest") if isinstance(merged.get("slurm"), dict) else None
    if isinstance(rest, dict):
        merged["slurm"] = {**merged["slurm"], "rest": dict(rest)}
        for key in ("token_file", "jwt_key_file"):
            if isinstance(rest.get(key), str):
                merged["slurm"]["rest"][key] = (base / Path(rest[key]).expanduser()).resolve()
    if isinstance(merged.get("play_vars"), dict):
        # the plays read relative paths from their own working directory, which is not this file's
        merged["play_vars"] = {
            k: str((base / Path(v).expanduser()).resolve())
            if k in _PLAY_PATH_VARS and v and isinstance(v, str) and not Path(v).expanduser().is_absolute()
            else v
            for k, v in merged["play_vars"].items()
        }
    try:
        return RunnerConfig.model_validate(merged)
    except ValidationError as exc:
        problems = field_errors(exc.errors(), "<root>")
        raise RunnerConfigError(f"{origin}: invalid runner config: {problems}") from exc


def load_config(path: Path, env: dict[str, str] | None = None) -> RunnerConfig:
    """Load the runner config file, applying AUTOHEAL_* overrides from `env` (default: os.environ).

    With `in_cluster` (and no kubeconfig), the pod's ServiceAccount becomes the runner's cluster
    identity (remediation.incluster): for its own reads and, as `autoheal_kubeconfig`, for the
    plays. Explicit, so a runner (or a test) that happens to run in some pod never picks up that
    pod's cluster by surprise.
    """
    from remediation.errors import KubeError
    from remediation.incluster import resolve_kubeconfig

    env = dict(os.environ) if env is None else env
    data = read_yaml(path, "the runner config", RunnerConfigError)
    cfg = parse_config(data, str(path), path.parent.resolve(), env)
    try:
        kubeconfig = (
            resolve_kubeconfig(cfg.kubeconfig, cfg.state_dir, env) if cfg.in_cluster else cfg.kubeconfig
        )
    except KubeError as exc:
        raise RunnerConfigError(f"{path}: {exc}") from exc
    if kubeconfig is None or kubeconfig == cfg.kubeconfig:
        return cfg
    play_vars = {"autoheal_kubeconfig": str(kubeconfig), **cfg.play_vars}
    return cfg.model_copy(update={"kubeconfig": kubeconfig, "play_vars": play_vars})
