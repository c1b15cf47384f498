"""The remediation runner as a lab service: the same `autoheal serve` a cluster runs, pointed at
the lab's Slurm, Kubernetes API, pool controller and the repository's playbooks.

Lab-specific play inputs (slurm.conf path, kubeconfig, which replacement backend) travel as the
runner's `play_vars`, so the playbooks and the rules file are exactly the shipped ones.

The journal is a SQLite file beside the runner (`runner_journal: sqlite`), or a PostgreSQL server
the lab runs as its `postgres` service (`runner_journal: postgres`, lab.postgres), which is what
production's replicas share. With `runner_replicas` > 1 each replica is its own service (runner,
runner-1, runner-2: own port, config and state dir) and they elect their leader on the Lease
`default/autoheal-runner` of the lab's control plane: only the leader runs plays, every replica
takes Alertmanager's webhooks.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import yaml

from autoheal import proc as kernel
from autoheal.backends import POOL_CLUSTER_ENV
from autoheal.errors import LabError
from autoheal.paths import data_root
from lab import procs
from lab.config import RUNNER_NAMESPACE, RUNNER_NODE_PORT, LabConfig

if TYPE_CHECKING:
    from lab.postgres import PostgresServer
    from remediation.journal import Journal

REPO = data_root()
POSTGRES = "postgres"  # the service (PID file, log) of the shared journal's server
DATABASE = "autoheal"
LEASE_NAMESPACE = "default"  # exists in every cluster: nothing to create
LEASE_NAME = "autoheal-runner"
# in the environment of every runner of a lab, so of everything their plays start (see play_processes)
RUN_DIR_ENV = "AUTOHEAL_LAB_RUN_DIR"


def runner_dir(cfg: LabConfig) -> Path:
    return cfg.run_dir / "runner"


def replica_dir(cfg: LabConfig, replica: int = 0) -> Path:
    """Replica 0 lives in runner/ (as the one runner always has), replica i in runner/runner-<i>/."""
    return runner_dir(cfg) if replica == 0 else runner_dir(cfg) / f"runner-{replica}"


def config_path(cfg: LabConfig, replica: int = 0) -> Path:
    return replica_dir(cfg, replica) / "runner.yaml"


def journal_path(cfg: LabConfig) -> Path:
    """The SQLite journal; a lab whose journal is PostgreSQL has none (see open_journal)."""
    if cfg.runner_journal != "sqlite":
        raise LabError(
            f"lab {cfg.name!r}: the runner's journal is PostgreSQL ({journal_dsn(cfg)}), not a SQLite"
            " file; open it with lab.runner.open_journal(cfg)"
        )
    return runner_dir(cfg) / "journal.sqlite"


def postgres_dir(cfg: LabConfig) -> Path:
    return cfg.run_dir / "postgres"


def postgres_server(cfg: LabConfig) -> PostgresServer:
    from lab.postgres import PostgresServer

    return PostgresServer(postgres_dir(cfg), cfg.port("postgres"), DATABASE)


def journal_dsn(cfg: LabConfig) -> str:
    """The shared journal's DSN (no password: the lab's server trusts loopback)."""
    from lab.postgres import SUPERUSER

    return f"postgresql://{SUPERUSER}@127.0.0.1:{cfg.port('postgres')}/{DATABASE}"


def open_journal(cfg: LabConfig) -> Journal | None:
    """The runners' journal, SQLite or PostgreSQL, or None while it does not exist yet (the
    caller closes it). A pods lab's runner keeps its SQLite file on its PersistentVolume, which
    the lab's provisioner backs with a directory of this host."""
    from remediation.journal import Journal

    if cfg.pods:
        found = pod_journal_path(cfg)
        return Journal(found) if found is not None and found.exists() else None
    if cfg.runner_journal == "postgres":
        proc = procs.read_proc(cfg.run_dir, POSTGRES)
        return Journal.postgres(journal_dsn(cfg)) if proc is not None and procs.is_alive(proc) else None
    path = journal_path(cfg)
    return Journal(path) if path.exists() else None


def start_postgres(cfg: LabConfig) -> str:
    """Start the shared journal's server as the lab service `postgres` (a no-op when it runs);
    returns the DSN. pg_ctl detaches the server, so its postmaster is given the lab's PID file
    and `down` stops it (stop_postgres)."""
    live = procs.read_proc(cfg.run_dir, POSTGRES)
    if live is not None and procs.is_alive(live):
        return journal_dsn(cfg)
    port = cfg.port("postgres")
    if not procs.port_free(port):
        raise LabError(f"postgres: port {port} is in use; choose another --port-base")
    server = postgres_server(cfg)
    try:
        server.start()
        pid = int((server.data / "postmaster.pid").read_text().split()[0])
        argv = [str(server.bin / "postgres"), "-D", str(server.data)]
        procs.adopt(POSTGRES, pid, cfg.run_dir, server.log, argv)
    except BaseException:
        server.stop()
        raise
    log = procs.log_path(cfg.run_dir, POSTGRES)  # `lab logs postgres` finds the server's log
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    log.symlink_to(server.log)
    return journal_dsn(cfg)


def stop_postgres(cfg: LabConfig) -> bool:
    """Stop the `postgres` service: a fast shutdown by pg_ctl (sessions ended, a checkpoint),
    then by PID whatever is still there. True if it was running."""
    proc = procs.read_proc(cfg.run_dir, POSTGRES)
    if proc is None:
        return False
    running = procs.is_alive(proc)
    if running:
        with contextlib.suppress(LabError, OSError, subprocess.SubprocessError):
            postgres_server(cfg).stop()
    procs.stop(cfg.run_dir, POSTGRES)  # removes the PID file; signals only if pg_ctl could not
    return running


def play_processes(cfg: LabConfig) -> list[tuple[int, int]]:
    """(PID, start ticks) of every live process that one of this lab's runners started, found by
    the run dir in its environment. Once the runners are stopped these are leftovers: a runner that
    exits ends its plays' ansible-playbook, but a task's shell, which ignores SIGHUP, is left to
    init (and a killed replica's plays are left whole). The caller and its ancestors are spared."""
    mine = str(cfg.run_dir)
    spared = {os.getpid(), *kernel.ancestors(os.getpid())}
    out = []
    for pid in kernel.pids():
        if pid not in spared and kernel.environ(pid).get(RUN_DIR_ENV) == mine:
            ticks = kernel.start_ticks(pid)
            if ticks:
                out.append((pid, ticks))
    return out


def postgres_ready(cfg: LabConfig) -> str:
    """Raises unless the shared journal's database answers a query."""
    import psycopg

    with psycopg.connect(journal_dsn(cfg), connect_timeout=2) as conn:
        conn.execute("SELECT 1")
    return "ready"


def leads(cfg: LabConfig, service: str) -> bool | None:
    """Whether a replica leads (its autoheal_leader gauge), None if it does not say."""
    text = httpx.get(cfg.url(service, "/metrics"), timeout=2).text
    for line in text.splitlines():
        if line.startswith("autoheal_leader "):
            return float(line.split()[1]) == 1.0
    return None


def write_config(
    cfg: LabConfig, overrides: dict[str, Any] | None = None, replica: int = 0, dsn: str | None = None
) -> Path:
    d = replica_dir(cfg, replica)
    d.mkdir(parents=True, exist_ok=True)
    backends = {p.backend for p in cfg.pools}
    play_vars: dict[str, Any] = {
        "autoheal_slurm_conf": str(cfg.slurm_conf),
        "autoheal_lab_name": cfg.name,
        "autoheal_lab_root": str(cfg.root),
        "autoheal_backend": backends.pop() if len(backends) == 1 else "lab",
        "autoheal_grace_seconds": cfg.grace_seconds,
        # the recovery ladder's bundles for the vendor (issue 15), beside the runner's journal
        "autoheal_evidence_dir": str(d / "evidence"),
    }
    if cfg.kubeconfig.exists():
        play_vars["autoheal_kubeconfig"] = str(cfg.kubeconfig)
    if cfg.aws_pools:  # the lab's simulator plays DCGM for every pool (KWOK nodes run no Job)
        play_vars["autoheal_validation"] = "lab"
        # as on EKS: a retire waits for the group's replacement; one that does not come is a
        # failed run (escalated once, the node stays fenced). The lab's boots take seconds.
        play_vars["autoheal_wait_replacement"] = True
        play_vars["autoheal_replacement_timeout"] = AWS_REPLACEMENT_TIMEOUT_S
    pool_size = sum(p.size + p.spares for p in cfg.pools)
    journal: dict[str, str]
    if cfg.runner_journal == "postgres":
        journal = {"journal_dsn": dsn or journal_dsn(cfg)}
    else:
        journal = {"journal_path": str(journal_path(cfg))}
    conf: dict[str, Any] = {
        "listen_host": "127.0.0.1",
        "listen_port": cfg.port(cfg.runner_services[replica]),
        "token_file": str(cfg.run_dir / "runner.token"),
        **journal,
        "rules_file": str(REPO / "config" / "rules.yaml"),
        "playbook_dir": str(REPO / "playbooks"),
        "state_dir": str(d / "state"),
        "kubeconfig": str(cfg.kubeconfig) if cfg.kubeconfig.exists() else None,
        "grace_seconds": cfg.grace_seconds,
        "ansible_python": sys.executable,
        # the lab's pool is small: let one incident at a time through, as the default budget does
        "budgets": {"max_nodes": max(1, pool_size // 3), "max_pool_percent": 34},
        "play_vars": play_vars,
    }
    if cfg.aws_pools:
        conf.update(aws_settings(cfg))
    conf["owners"] = owner_settings(cfg, d)
    # a degraded node's validation starts within a second of its job's end (production: 15 s),
    # without waiting for the drain's alert to resolve (a link flap's: its 600 s window)
    conf["degraded_return"] = {"interval_seconds": 1.0, "wait_quiet": False}
    if cfg.runner_replicas > 1:
        conf["leader_election"] = {
            "enabled": True,
            "identity": f"runner-{replica}",
            "namespace": LEASE_NAMESPACE,
            "lease_name": LEASE_NAME,
        }
    conf.update(overrides or {})
    # an override names the journal: it replaces the lab's (exactly one of the two is allowed)
    for key, other in (("journal_path", "journal_dsn"), ("journal_dsn", "journal_path")):
        if key in (overrides or {}):
            conf.pop(other, None)
    path = config_path(cfg, replica)
    path.write_text(yaml.safe_dump(conf, sort_keys=False))
    return path


# how long an aws lab's runbook waits for its group's replacement (EKS: 900 s, a GPU instance's
# boot and join; the lab's bridge takes its provision delay)
AWS_REPLACEMENT_TIMEOUT_S = 30
# how often the lab's spare keeper looks (production: 15 s; the lab's scrapes are 1 s too)
SPARE_KEEPER_INTERVAL_S = 2.0


def owner_settings(cfg: LabConfig, d: Path) -> dict[str, Any]:
    """Job owners told (remediation/owner_loop.py): the lab's user (who submits the demo's jobs)
    has an address in the lab's directory; messages go to the owner inbox the demo listens on;
    progress files are read under the lab root's folder (the demo's and the tests' checkpoints)."""
    import pwd

    user = pwd.getpwuid(os.getuid()).pw_name
    directory = d / "owners.yaml"
    directory.write_text(yaml.safe_dump({user: {"email": f"{user}@example.org"}}))
    return {
        # no retry in the lab: nobody listens but the demo, and the loop tries again each pass
        "sink": {"kind": "webhook", "url": cfg.url("owner-inbox", "/owners"), "retries": 0},
        "directory": str(directory),
        "interval_seconds": 1.0,
        "quiet_seconds": 1.0,
        "progress_roots": [str(cfg.root.resolve().parent)],
    }


def aws_settings(cfg: LabConfig) -> dict[str, Any]:
    """What a runner of a lab with aws pools is configured with beyond the lab's: each pool's
    backend, and the spare keeper, since an instance its group launches joins with the pool's
    labels only (lab.aws) and the keeper makes it a spare (the pools' ConfigMaps:
    lab.lab.declare_pools)."""
    return {
        "pool_backends": {p.name: p.backend for p in cfg.pools},
        "spare_keeper": {
            "enabled": True,
            "namespace": RUNNER_NAMESPACE,
            "interval_seconds": SPARE_KEEPER_INTERVAL_S,
        },
    }


def runner_env(cfg: LabConfig) -> dict[str, str]:
    """The runners' environment: the lab's, and with aws pools the AWS endpoint (the lab's proxy
    in front of moto), region and credentials, and the cluster `autoheal pool --backend aws`
    acts on (its groups' eks:cluster-name tag is the lab's name)."""
    env = {
        "AUTOHEAL_LAB_ROOT": str(cfg.root),
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        RUN_DIR_ENV: str(cfg.run_dir),
    }
    if cfg.aws_pools:
        from lab import aws

        env.update(aws.client_env(cfg))
        env[POOL_CLUSTER_ENV] = cfg.name
    return env


def start(cfg: LabConfig, overrides: dict[str, Any] | None = None) -> None:
    """Start the journal's server (postgres) if the lab has one, then every runner replica, each
    waited for until ready; `overrides` go into every replica's config."""
    if cfg.runner_replicas > 1 and not cfg.kubeconfig.exists():
        raise LabError(
            f"runner: {cfg.runner_replicas} replicas elect their leader on a Lease, and the lab has no"
            " Kubernetes control plane (build it with scripts/build-tools.sh, or runner_replicas: 1)"
        )
    dsn = start_postgres(cfg) if cfg.runner_journal == "postgres" else None
    cli = Path(sys.executable).with_name("autoheal")
    for replica, name in enumerate(cfg.runner_services):
        path = write_config(cfg, overrides, replica, dsn)
        procs.start_service(
            name,
            [str(cli), "serve", "--config", str(path)],
            cfg.run_dir,
            port=cfg.port(name),
            ready=procs.http_ok(cfg.url(name, "/readyz")),
            timeout=30,
            env=runner_env(cfg),
            cwd=REPO,
        )


# -- the runner as the stack's pod (slurm: pods) --------------------------------------------------

PROXY = "runner-proxy"  # the host's way in to that Service (lab.nodes.apiproxy --node-port)


def _kube_get(cfg: LabConfig, path: str) -> Any:
    from lab import controlplane

    with controlplane.http_client(cfg.kubeconfig, pool=1, timeout=10) as http:
        r = http.get(path)
        r.raise_for_status()
        return r.json()


def start_pod_path(cfg: LabConfig, timeout: float = 180) -> None:
    """After `pulumi up`: Alertmanager gets the webhook token the stack generated (the Secret the
    runner reads; Alertmanager reads its credentials file at each delivery), the host's forwarder
    to the runner's NodePort starts on the runner's lab port, and the runner is waited for until
    its /readyz passes (API server and slurmctld both answer it)."""
    import base64

    from components.runner import TOKEN_KEY, TOKEN_SECRET_NAME

    secret = _kube_get(cfg, f"/api/v1/namespaces/{RUNNER_NAMESPACE}/secrets/{TOKEN_SECRET_NAME}")
    token = cfg.run_dir / "runner.token"
    token.write_bytes(base64.b64decode(secret["data"][TOKEN_KEY]))
    token.chmod(0o600)
    argv = [
        sys.executable,
        "-m",
        "lab.nodes.apiproxy",
        f"--listen=127.0.0.1:{cfg.port('runner')}",
        f"--node-port={cfg.run_dir}:{RUNNER_NODE_PORT}",
    ]
    proc = procs.spawn(PROXY, argv, cfg.run_dir)
    last = ""

    def ready() -> bool:
        nonlocal last
        try:
            last = pod_readyz(cfg)
            return True
        except Exception as exc:
            last = str(exc)
            return False

    try:
        procs.wait_until(ready, timeout, "the runner's pod (/readyz through its Service)", proc)
    except LabError as exc:
        raise LabError(f"{exc}; last answer: {last}") from None


def pod_readyz(cfg: LabConfig) -> str:
    """`ready`, or an error carrying the runner's own causes (one per line of its /readyz)."""
    r = httpx.get(cfg.url("runner", "/readyz"), timeout=3)
    if r.status_code != 200:
        raise LabError(f"runner pod not ready: {r.text.strip()[:300]}")
    return "ready"


def pod_journal_path(cfg: LabConfig) -> Path | None:
    """Where the runner pod's SQLite journal lies on this host: its claim's volume directory."""
    from components.runner import RUNNER_NAME
    from lab.nodes import cluster

    claim = f"{RUNNER_NAME}-journal"
    try:
        pvc = _kube_get(cfg, f"/api/v1/namespaces/{RUNNER_NAMESPACE}/persistentvolumeclaims/{claim}")
        volume = pvc["spec"].get("volumeName")
        if not volume:
            return None
        pv = _kube_get(cfg, f"/api/v1/persistentvolumes/{volume}")
    except (httpx.HTTPError, LabError):
        return None
    host = (pv["spec"].get("hostPath") or {}).get("path")
    if not host or not Path(host).is_relative_to(cluster.volumes_dir(cfg.run_dir)):
        return None
    return Path(host) / "journal.sqlite"


def stack_pods(cfg: LabConfig) -> list[tuple[str, bool, str]]:
    """(name, ready, detail) for each pod of the stack's Slurm and runner namespaces; the detail
    of a pod that is not Ready is its unready containers' states and last log lines."""
    from lab.nodes import podreport

    out = []
    for ns in ("slurm", RUNNER_NAMESPACE):
        try:
            pods = _kube_get(cfg, f"/api/v1/namespaces/{ns}/pods")["items"]
        except (httpx.HTTPError, LabError) as exc:
            out.append((f"pods/{ns}", False, str(exc)[:200]))
            continue
        for pod in pods:
            name = f"pod/{pod['metadata']['name']}"
            conds = {c["type"]: c["status"] for c in (pod.get("status") or {}).get("conditions") or []}
            if conds.get("Ready") == "True":
                out.append((name, True, f"Ready on {pod['spec'].get('nodeName', '?')}"))
            else:
                out.append((name, False, podreport.describe(cfg.kubeconfig, pod)))
    return out
