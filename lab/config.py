"""The shape of one lab: its pools, its ports and where its files live.

A lab is saved as `<root>/<name>/lab.json` when it comes up, so `status`, `inject`, `down` and the
tests find the same ports and paths without being told twice. Port blocks are explicit (`port_base`)
so two labs, or a lab and a system service, never collide.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autoheal.errors import ConfigError
from autoheal.journalrules import JournalKind, replicas_problem
from autoheal.slurmconf import SlurmConfSpec, SlurmPool

# Offsets from port_base. slurmd ports start at SLURMD_OFFSET, one per node.
PORTS = {
    "slurmctld": 0,
    "prometheus": 1,
    "alertmanager": 2,
    "postgres": 3,  # the runners' shared journal (runner_journal: postgres)
    "simulator": 4,
    "runner": 5,  # replica 0 (the only one unless runner_replicas > 1)
    "sink": 6,
    "pool_controller": 7,
    "runner-1": 8,
    "runner-2": 9,
    "owner-inbox": 10,  # where the runner tells job owners (the demo listens: lab.demo)
    "moto": 12,  # the lab's AWS (lab.aws): moto's server
    "aws": 13,  # the AWS endpoint the lab's clients use: a proxy in front of moto (lab.aws)
    "kube": 20,  # a block of 20 for the control plane
}
SLURMD_OFFSET = 100
MAX_NODES = 2600  # slurmd ports end below 32768 (Linux ephemeral range) for port_base <= 30000
MAX_RUNNER_REPLICAS = 3
# a pods lab (slurm: pods): the stack's runner namespace (Pulumi.lab.yaml) and the node port of its
# Service, the host's way in (each lab has its own nodes, so every lab may use the same port)
RUNNER_NAMESPACE = "autoheal"
RUNNER_NODE_PORT = 30095


class PoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="h100", pattern=r"^[a-z][a-z0-9]{0,15}$")
    prefix: str = Field(default="gpu", pattern=r"^[a-z][a-z0-9-]{0,20}$")
    size: int = Field(default=4, ge=1)
    spares: int = Field(default=2, ge=0)
    headroom: int = Field(default=6, ge=0)
    gpus_per_node: int = Field(default=8, ge=1, le=16)
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    gpu_type: str = "h100"
    # who plays the cloud for this pool: the lab's pool controller, or EC2 + Auto Scaling (moto,
    # lab.aws), whose launches the pool controller turns into lab nodes
    backend: Literal["lab", "aws"] = "lab"
    # nodes named like a cloud's, `<prefix>-<i>.<domain>` (e.g. us-west-2.compute.internal): dots
    # in Kubernetes and Slurm node names; the whole name stays a label value (63 characters)
    domain: str = Field(default="", pattern=r"^([a-z0-9][a-z0-9-]{0,30}(\.[a-z0-9][a-z0-9-]{0,30}){0,3})?$")

    def slurm(self) -> SlurmPool:
        return SlurmPool(
            name=self.name,
            prefix=self.prefix,
            size=self.size,
            spares=self.spares,
            headroom=self.headroom,
            gpus_per_node=self.gpus_per_node,
            gpu_type=self.gpu_type,
            domain=self.domain,
        )

    @model_validator(mode="after")
    def _names_fit(self) -> PoolConfig:
        longest = max(self.slurm().node_names(), key=len)
        if len(longest) > 63:
            raise ValueError(
                f"domain: node names such as {longest} are longer than 63 characters (the"
                " kubernetes.io/hostname label's limit); shorten the prefix or the domain"
            )
        return self


class LabConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="default", pattern=r"^[a-z][a-z0-9-]{0,30}$")
    root: Path = Field(default_factory=lambda: Path(os.environ.get("AUTOHEAL_LAB_ROOT", ".lab")))
    port_base: int = Field(default=21000, ge=1024, le=30000)
    pools: list[PoolConfig] = Field(default_factory=lambda: [PoolConfig()])
    webhook_url: str | None = None
    interval: str = "1s"
    kube: bool = True
    runner: bool = True
    slurmd_limit: int | None = Field(default=None, ge=0)
    # how long start-up may wait for KWOK nodes Ready and the first scrape; None: scaled to size
    start_timeout: float | None = Field(default=None, gt=0)
    grace_seconds: int = Field(default=120, ge=1)
    provision_delay: float = Field(default=5.0, ge=0)
    # how many of the nodes that exist at start are real (kubelet + containerd, lab/nodes) rather
    # than KWOK; a real node the pool controller retires is replaced by a real node
    real_nodes: int = Field(default=0, ge=0)
    watchers: bool = True  # one XID watcher per GPU node (lab.watch; small labs only)
    # the runner's journal: one SQLite file, or a PostgreSQL server the lab runs (lab.postgres)
    # that several replicas share, as production runs them in HA
    runner_journal: JournalKind = "sqlite"
    # runner replicas; more than one elect a leader on a Lease (needs postgres and kube)
    runner_replicas: int = Field(default=1, ge=1, le=MAX_RUNNER_REPLICAS)
    # where Slurm and the runner run: "host" (Debian's slurmctld and one slurmd process per node,
    # the runner as a host process: fast, and scales to thousands of nodes) or "pods" (what
    # `pulumi up` declares, on real nodes only: slurmctld, login and slurmd pods, the runner in its
    # pod with its ServiceAccount; the pool controller adds real nodes whose slurmd pods join)
    slurm: Literal["host", "pods"] = "host"
    # a pods lab's runner pod lends Slurm nodes to inference bursts (remediation/lender.py): its
    # runner settings `lending` (remediation.config.LendingSettings keys; `enabled` is implied);
    # empty: off. `lab demo --scenario burst` sets short timers (lab.burst.LENDING)
    lending: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _fits(self) -> LabConfig:
        n = self.node_count
        if n > MAX_NODES:
            raise ValueError(f"pools: {n} nodes do not fit the port block (max {MAX_NODES})")
        hardware = sum(p.size + p.spares for p in self.pools)
        if self.real_nodes > hardware:
            raise ValueError(
                f"real_nodes: {self.real_nodes} is more than the {hardware} nodes the pools start with"
            )
        if self.real_nodes and not self.kube:
            raise ValueError("real_nodes: real nodes need the Kubernetes control plane (kube: true)")
        if replicas_problem(self.runner_journal, self.runner_replicas) is not None:  # replicas: postgres
            raise ValueError(
                f"runner_replicas: {self.runner_replicas} replicas share one journal, which SQLite cannot"
                " be; set runner_journal: postgres (--runner-journal postgres) or runner_replicas: 1"
            )
        if self.runner_replicas > 1 and not self.kube:
            raise ValueError(
                f"runner_replicas: {self.runner_replicas} replicas elect their leader on a Kubernetes"
                " Lease; set kube: true (drop --no-kube) or runner_replicas: 1"
            )
        if self.slurm == "pods":
            self._check_pods(hardware)
        if self.lending:
            self._check_lending()
        self._check_aws()
        prefixes = [p.prefix for p in self.pools]
        if len(set(prefixes)) != len(prefixes):
            raise ValueError("pools: every pool needs its own prefix")
        self.root = self.root.resolve()
        return self

    def _check_pods(self, hardware: int) -> None:
        """Slurm as pods runs on real nodes only (a KWOK node runs no pod) and its runner is the
        stack's one pod."""
        if not self.kube:
            raise ValueError("slurm: pods runs Slurm on Kubernetes; set kube: true (drop --no-kube)")
        if self.real_nodes == 0:
            self.real_nodes = hardware
        if self.real_nodes != hardware:
            raise ValueError(
                f"real_nodes: slurm pods runs every node as a real node ({hardware}), got {self.real_nodes};"
                " drop --real-nodes or use --slurm host"
            )
        if self.runner_replicas != 1 or self.runner_journal != "sqlite":
            raise ValueError(
                "runner_replicas / runner_journal: with slurm pods the runner is the stack's one pod"
                " with its SQLite journal on a volume; use --slurm host for the HA runners"
            )

    def _check_lending(self) -> None:
        """The lender runs in the stack's runner pod, with settings the runner accepts."""
        from pydantic import ValidationError

        from autoheal.errors import field_errors
        from remediation.config import LendingSettings

        if not self.pods:
            raise ValueError(
                "lending: the lender runs in the stack's runner pod; set slurm: pods (--slurm pods)"
            )
        try:
            LendingSettings.model_validate({**self.lending, "enabled": True})
        except ValidationError as exc:
            raise ValueError(f"lending: {field_errors(exc.errors(), 'lending')}") from None

    def _check_aws(self) -> None:
        """An aws pool's nodes are KWOK nodes with host slurmds: the providerID that maps a node to
        its instance lives on the Kubernetes Node, and the bridge (lab.aws) makes no real node."""
        aws = [p.name for p in self.pools if p.backend == "aws"]
        if not aws:
            return
        if not self.kube:
            raise ValueError(
                f"pools {aws}: backend aws maps nodes to instances on Kubernetes; set kube: true"
            )
        if self.real_nodes or self.pods:
            raise ValueError(
                f"pools {aws}: backend aws runs KWOK nodes with host slurmds; use slurm: host and"
                " real_nodes: 0, or backend: lab"
            )

    @property
    def aws_pools(self) -> list[PoolConfig]:
        return [p for p in self.pools if p.backend == "aws"]

    @property
    def pods(self) -> bool:
        """Slurm and the runner run as the stack's pods (not as host processes)."""
        return self.slurm == "pods"

    @property
    def run_dir(self) -> Path:
        return self.root / self.name

    def port(self, service: str) -> int:
        return self.port_base + PORTS[service]

    def url(self, service: str, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port(service)}{path}"

    @property
    def effective_webhook_url(self) -> str:
        return self.webhook_url or self.url("runner", "/webhook")

    @property
    def runner_services(self) -> list[str]:
        """The runner replicas' service names (and PORTS keys): runner, runner-1, runner-2."""
        return ["runner" if i == 0 else f"runner-{i}" for i in range(self.runner_replicas)]

    @property
    def webhook_urls(self) -> list[str]:
        """Where Alertmanager posts: `webhook_url` if given, else every runner replica (replicas
        share the journal, which deduplicates an alert delivered to each of them)."""
        if self.webhook_url:
            return [self.webhook_url]
        return [self.url(s, "/webhook") for s in self.runner_services]

    def slurm_pools(self) -> list[SlurmPool]:
        return [p.slurm() for p in self.pools]

    def slurm_spec(self) -> SlurmConfSpec:
        d = self.run_dir / "slurm"
        return SlurmConfSpec(
            cluster_name=f"lab{self.name.replace('-', '')}"[:30],
            controller_host="localhost",
            controller_port=self.port("slurmctld"),
            pools=self.slurm_pools(),
            state_dir=str(d / "state"),
            spool_dir=str(self.socket_dir / "spool"),
            log_dir=str(self.run_dir / "logs"),
            run_dir=str(d / "run"),
            gres_dev_dir=str(d / "dev"),
            slurmd_port_base=self.port_base + SLURMD_OFFSET,
            node_addr="127.0.0.1",
            auth_socket=str(self.socket_dir / "munge.socket"),
            grace_seconds=self.grace_seconds,
        )

    @property
    def node_count(self) -> int:
        return sum(p.size + p.spares + p.headroom for p in self.pools)

    @property
    def kube_timeout(self) -> float:
        return self.start_timeout or max(120.0, 0.1 * self.node_count)

    @property
    def pipeline_timeout(self) -> float:
        return self.start_timeout or max(30.0, 0.05 * self.node_count)

    @property
    def socket_dir(self) -> Path:
        """A short directory for UNIX sockets (munge, slurmd's per-step sockets in its spool):
        a socket path must fit in 108 bytes, which a run dir under a test's tmp path does not."""
        digest = hashlib.sha256(str(self.run_dir).encode()).hexdigest()[:10]
        return Path(tempfile.gettempdir()) / f"autoheal-{digest}"

    @property
    def slurm_conf(self) -> Path:
        return self.run_dir / "slurm" / "slurm.conf"

    @property
    def kubeconfig(self) -> Path:
        return self.run_dir / "kubeconfig"

    def slurm_env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.slurm_conf)}

    def save(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "lab.json").write_text(self.model_dump_json(indent=2))


def load_lab(name: str = "default", root: Path | None = None) -> LabConfig | None:
    """The saved config of a lab that was brought up, or None if there is none."""
    base = (root or Path(os.environ.get("AUTOHEAL_LAB_ROOT", ".lab"))).resolve()
    path = base / name / "lab.json"
    if not path.exists():
        return None
    try:
        return LabConfig.model_validate(json.loads(path.read_text()))
    except ValueError as exc:
        raise ConfigError(f"{path}: invalid lab state: {exc}") from exc
