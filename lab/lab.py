"""Bring the whole lab up, report its health, and tear it down without leaving a process behind.

`up` is all-or-nothing: any service that fails to start stops everything that was started, and the
error names the service, the cause and its log file. `up` on a running lab does not start a second
copy; `down` on nothing is a no-op.
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from autoheal import proc as kernel
from autoheal.errors import LabError
from lab import aws, disk, pool, procs, prom, slurm, watch
from lab.config import RUNNER_NAMESPACE, LabConfig, PoolConfig, load_lab

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass
class ServiceStatus:
    name: str
    healthy: bool
    detail: str = ""


@dataclass
class LabStatus:
    name: str
    up: bool
    services: list[ServiceStatus] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return self.up and all(s.healthy for s in self.services)

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "up": self.up,
            "healthy": self.healthy,
            "services": [vars(s) for s in self.services],
        }


def hardware_nodes(cfg: LabConfig) -> list[str]:
    """Nodes that exist at start: each pool's active nodes and hot spares (not FUTURE headroom)."""
    return [n for p in cfg.slurm_pools() for n in p.active_nodes() + p.spare_nodes()]


def slurmd_nodes(cfg: LabConfig) -> list[str]:
    """Nodes that get a slurmd at start: all hardware, or the spares and the first `slurmd_limit` (a
    2,000-node storm lab keeps the rest as Slurm nodes that never answer, which is enough to
    drain them, and saves 8 MB of RSS per node)."""
    nodes = hardware_nodes(cfg)
    if cfg.slurmd_limit is None:
        return nodes
    # hot spares always get one: a promotion resumes them, so they must answer
    spares = {n for p in cfg.slurm_pools() for n in p.spare_nodes()}
    active = [n for n in nodes if n not in spares][: cfg.slurmd_limit]
    return [n for n in nodes if n in spares or n in active]


def current_nodes(cfg: LabConfig) -> list[str]:
    """Nodes that exist now: the pool controller's members once it has run, else the hardware."""
    state = cfg.run_dir / "pool" / "state.json"
    if state.exists():
        members = json.loads(state.read_text())["members"]
        return [n for names in members.values() for n in names]
    return hardware_nodes(cfg)


def node_models(cfg: LabConfig) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in cfg.pools:
        sp = p.slurm()
        for n in sp.active_nodes() + sp.spare_nodes():
            out[n] = p.gpu_model
    return out


def runner_available() -> bool:
    try:
        import remediation.cli  # noqa: F401
    except ImportError:
        return False
    return True


def kube_available() -> bool:
    try:
        from lab import controlplane
    except ImportError:
        return False
    try:
        for tool in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"):
            controlplane.tool_path(tool)
    except Exception:
        return False
    return True


def up(cfg: LabConfig, progress: Progress = _quiet) -> LabConfig:
    existing = load_lab(cfg.name, cfg.root)
    if existing is not None and procs.running(existing.run_dir):
        st = status(existing)
        if st.healthy:
            progress(f"lab {cfg.name!r} is already up")
            return existing
        raise LabError(
            f"lab {cfg.name!r} is partly running ({', '.join(s.name for s in st.services if not s.healthy)} "
            f"unhealthy); run `autoheal lab down --name {cfg.name}` first"
        )
    slurm.check_installed()
    prom.check_installed()
    _check_runner_setup(cfg)
    # before anything starts: a full disk fails late, as pods stuck Pending on disk-pressure nodes
    disk.require_free(cfg.root, disk.lab_need(cfg.real_nodes), f"lab {cfg.name!r}", [cfg.root])
    if cfg.real_nodes:
        from lab.nodes import cluster

        cluster.check_tools()  # a missing tool or kernel feature stops `up` before anything starts
    if cfg.pods:
        from lab import stack

        if not stack.available():
            raise LabError(
                "slurm: pods runs what `pulumi up` declares, and the Pulumi engine or its Kubernetes"
                " provider is not built; run scripts/build-tools.sh, or use --slurm host"
            )
    if (cfg.run_dir / "nodes").is_dir():
        from lab.nodes import cluster

        # real nodes of an earlier run that was killed: found by the lab's id, not by PID files
        cluster.teardown(cfg.run_dir)
    # a lab always starts fresh: no Slurm, pool or simulator state from an earlier run
    shutil.rmtree(cfg.socket_dir, ignore_errors=True)
    fresh = ("slurm", "pool", "monitoring", "simulator.json", "pids", "pulumi", "runner", "postgres", "aws")
    for stale in (*fresh, "gpunodes", "watchers"):
        path = cfg.run_dir / stale
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    cfg.save()
    t0 = time.monotonic()
    try:
        _start_all(cfg, progress)
    except BaseException:
        progress("start failed: stopping what was started")
        down(cfg)
        raise
    progress(f"lab {cfg.name!r} up in {time.monotonic() - t0:.1f}s ({cfg.run_dir})")
    return cfg


def _check_runner_setup(cfg: LabConfig) -> None:
    """What the runner's journal and replicas need is there, before anything starts."""
    if not (cfg.runner and runner_available()):
        return
    if cfg.runner_journal == "postgres":
        from lab.postgres import server_bin

        server_bin()  # names the package when PostgreSQL is not installed
    if cfg.runner_replicas > 1 and not (cfg.kube and kube_available()):
        raise LabError(
            f"runner_replicas: {cfg.runner_replicas} replicas elect their leader on a Kubernetes Lease,"
            " and the control plane is not built (scripts/build-tools.sh); or use runner_replicas: 1"
        )


def _step(progress: Progress, what: str) -> float:
    progress(f"starting {what}")
    return time.monotonic()


def _start_all(cfg: LabConfig, progress: Progress) -> None:
    if cfg.pods:
        _start_pods_lab(cfg, progress)
        return
    nodes = slurmd_nodes(cfg)
    _step(progress, "munged")
    slurm.write_config(cfg)
    slurm.start_munge(cfg)
    _step(progress, "slurmctld")
    slurm.start_slurmctld(cfg)
    _step(progress, f"{len(nodes)} slurmd")
    slurm.start_slurmd(cfg, nodes)
    _start_monitoring(cfg, progress)
    if watch.enabled(cfg):
        _step(progress, f"{len(hardware_nodes(cfg))} XID watchers")
        watch.start(cfg, hardware_nodes(cfg))
    if aws.enabled(cfg):
        _step(progress, f"the lab's AWS (moto): {len(cfg.aws_pools)} Auto Scaling groups")
        aws.start(cfg)
    if cfg.kube and kube_available():
        advertise = "127.0.0.1"
        if cfg.real_nodes:
            from lab.nodes import cluster

            _step(progress, "real-node network")
            advertise = cluster.prepare(cfg.run_dir).gateway
        _step(progress, "kubernetes control plane (KWOK nodes)")
        start_kube(cfg, advertise)
        if cfg.real_nodes:
            _step(progress, f"{cfg.real_nodes} real nodes (images, containerd, kubelet, kube-proxy, CoreDNS)")
            start_real_nodes(cfg, progress)
    progress("waiting for slurmd registration and the alert pipeline")
    slurm.wait_nodes_registered(cfg, nodes)
    prom.wait_pipeline(cfg, timeout=cfg.pipeline_timeout)
    _step(progress, "node-pool controller")
    pool.start(cfg)
    if cfg.runner and runner_available():
        replicas = f"{cfg.runner_replicas} replicas, " if cfg.runner_replicas > 1 else ""
        _step(progress, f"remediation runner ({replicas}{cfg.runner_journal} journal)")
        from lab import runner

        if cfg.aws_pools:  # the spare keeper reads them (lab.runner.aws_settings)
            declare_pools(cfg)
        runner.start(cfg)


def declare_pools(cfg: LabConfig) -> None:
    """The pools' descriptions as the stack writes them (ConfigMaps autoheal-pool-<name>, key
    pool.json, in the runner's namespace), for the spare keeper: `pulumi up` does not run in a
    host lab. Idempotent (an existing one is replaced)."""
    from autoheal.labels import COMPONENT_LABEL, NODE_POOL_COMPONENT
    from components.nodepool import GpuNodePoolArgs, describe_pool
    from lab import controlplane

    ns = RUNNER_NAMESPACE
    with controlplane.http_client(cfg.kubeconfig, pool=2, timeout=10) as http:
        r = http.post("/api/v1/namespaces", json={"metadata": {"name": ns}})
        if r.status_code not in (201, 409):
            raise LabError(f"pool ConfigMaps: namespace {ns}: {r.status_code} {r.text[:200]}")
        for p in cfg.pools:
            args = GpuNodePoolArgs(
                name=p.name,
                prefix=p.prefix,
                size=p.size,
                spares=p.spares,
                gpu_model=p.gpu_type,
                gpus_per_node=p.gpus_per_node,
                headroom=p.headroom,
                backend=p.backend,
            )
            text = describe_pool(args, p.slurm(), pool.node_labels(p, False))
            name = f"autoheal-pool-{p.name}"
            body = {
                "metadata": {"name": name, "labels": {COMPONENT_LABEL: NODE_POOL_COMPONENT}},
                "data": {"pool.json": text},
            }
            r = http.put(f"/api/v1/namespaces/{ns}/configmaps/{name}", json=body)
            if r.status_code == 404:
                r = http.post(f"/api/v1/namespaces/{ns}/configmaps", json=body)
            if r.status_code not in (200, 201):
                raise LabError(f"pool ConfigMaps: {ns}/{name}: {r.status_code} {r.text[:200]}")


def _start_pods_lab(cfg: LabConfig, progress: Progress) -> None:
    """Slurm and the runner as the stack declares them: the host keeps what plays the hardware
    and the cloud (the GPU simulator, the XID watchers, Prometheus and Alertmanager, the pool
    controller); `pulumi up` brings slurmctld, login, the slurmd pods and the runner's pod onto
    the real nodes, and Alertmanager posts to the runner's Service (lab.runner.start_pod_path)."""
    from lab import runner, stack
    from lab.nodes import cluster

    _start_monitoring(cfg, progress)
    _step(progress, "real-node network")
    advertise = cluster.prepare(cfg.run_dir).gateway
    prom.start_bridge(cfg, advertise)  # the stack's XID watchers post to Alertmanager from the nodes
    _step(progress, "kubernetes control plane")
    start_kube(cfg, advertise)
    _step(progress, f"{cfg.real_nodes} real nodes (images, containerd, kubelet, kube-proxy, CoreDNS)")
    start_real_nodes(cfg, progress)
    _step(progress, "the system node (slurmctld, login, runner)")
    cluster.add(cfg.run_dir, cluster.SYSTEM_NODE, {cluster.SYSTEM_LABEL: "true"}, [], 0, progress=progress)
    prom.wait_pipeline(cfg, timeout=cfg.pipeline_timeout)
    _step(progress, "node-pool controller")
    pool.start(cfg)
    t = _step(progress, "pulumi up: slurmctld, login, slurmd and the runner as pods")
    summary = stack.up(cfg)
    took = time.monotonic() - t
    (cfg.run_dir / "pulumi" / "up.json").write_text(
        json.dumps({"summary": summary, "seconds": round(took, 1)})
    )
    progress(f"pulumi up: {summary} in {took:.1f}s")
    _step(progress, "the runner's Service for Alertmanager")
    runner.start_pod_path(cfg)


def _start_monitoring(cfg: LabConfig, progress: Progress) -> None:
    """The GPU simulator, then Prometheus and Alertmanager loaded with what autoheal ships."""
    _step(progress, "GPU simulator")
    start_simulator(cfg)
    _step(progress, "prometheus + alertmanager")
    prom.write_config(cfg)
    prom.start_alertmanager(cfg)
    prom.start_prometheus(cfg)


def start_simulator(cfg: LabConfig) -> None:
    port = cfg.port("simulator")
    gpus = max(p.gpus_per_node for p in cfg.pools)
    procs.start_service(
        "simulator",
        [
            sys.executable,
            "-m",
            "lab.simulator",
            f"--port={port}",
            f"--gpus={gpus}",
            f"--nodes={json.dumps(node_models(cfg))}",
            f"--state={cfg.run_dir / 'simulator.json'}",
            f"--kmsg-dir={watch.kmsg_dir(cfg)}",
        ],
        cfg.run_dir,
        port=port,
        ready=procs.http_ok(cfg.url("simulator", "/healthz")),
        timeout=20,
    )


def real_node_names(cfg: LabConfig) -> list[str]:
    """The nodes that start as real nodes: the first `real_nodes` of the hardware (actives first)."""
    return hardware_nodes(cfg)[: cfg.real_nodes]


def _node_specs(cfg: LabConfig) -> list[tuple[str, PoolConfig, bool]]:
    """(node, pool, spare) for every node that exists at start."""
    out = []
    for p in cfg.pools:
        sp = p.slurm()
        out += [(n, p, False) for n in sp.active_nodes()] + [(n, p, True) for n in sp.spare_nodes()]
    return out


def start_kube(cfg: LabConfig, advertise_address: str = "127.0.0.1") -> None:
    from lab import controlplane

    real = set(real_node_names(cfg))
    # an aws pool's first nodes stand for the instances its group launched (lab.aws.start)
    seeded = aws.instances_file(cfg)
    instances: dict[str, str] = json.loads(seeded.read_text()) if aws.enabled(cfg) else {}
    specs = [
        controlplane.KubeNodeSpec(
            n,
            pool.node_labels(p, spare),
            pool.node_taints(spare),
            p.gpus_per_node,
            provider_id=instances.get(n, ""),
        )
        for n, p, spare in _node_specs(cfg)
        if n not in real
    ]
    controlplane.start_control_plane(
        cfg.run_dir, specs, cfg.port("kube"), timeout=cfg.kube_timeout, advertise_address=advertise_address
    )


def start_real_nodes(cfg: LabConfig, progress: Progress) -> None:
    """Real nodes with the same names, pool labels, spare label/taint and GPU count as KWOK's."""
    from lab import controlplane
    from lab.nodes import cluster

    real = set(real_node_names(cfg))
    specs = [
        (n, pool.node_labels(p, spare), pool.node_taints(spare), p.gpus_per_node)
        for n, p, spare in _node_specs(cfg)
        if n in real
    ]
    cluster.start(
        cfg.run_dir,
        cfg.socket_dir,
        controlplane.Ports.from_base(cfg.port("kube")).apiserver,
        specs,
        cfg.run_dir / "simulator.json",
        progress,
    )


JOB_CANCEL_WAIT_S = 10.0  # how long Slurm gets to end cancelled job steps before the sweep


@dataclass
class Teardown:
    """What `down` ended: the lab's services, its Slurm jobs and the processes those jobs ran, and
    what the runners' plays left."""

    services: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    job_processes: int = 0  # slurmstepd and job tasks that ended, by the cancel or by the sweep
    killed: int = 0  # of those, how many the sweep had to SIGKILL
    play_processes: int = 0  # what the runners' plays left running when the runners stopped

    def summary(self) -> str:
        text = f"stopped {_count(len(self.services), 'service')}"
        if self.jobs or self.job_processes:
            text += f", cancelled {_count(len(self.jobs), 'job')}"
            text += f", ended {_count(self.job_processes, 'job process', 'job processes')}"
            text += f" ({self.killed} by SIGKILL)" if self.killed else ""
        if self.play_processes:
            text += f", ended {_count(self.play_processes, 'play process', 'play processes')} left by runners"
        return text


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def down(cfg: LabConfig) -> Teardown:
    """Stop every process the lab caused: its jobs first (cancelled while slurmctld still runs),
    then its services by their PID files, then any job process that outlived them, and any
    process a runner's play left (lab.runner.play_processes: found by the run dir the runners
    carry in their environment).

    A job step's slurmstepd is detached from slurmd (its parent is init), so stopping slurmd
    leaves it and its tasks running, writing into the run dir; SIGTERM does not end a slurmstepd.
    Those are found by the lab's slurm.conf in their environment (lab.slurm.job_processes) and
    ended by PID and start time, SIGKILL after a short grace.
    """
    from lab import controlplane

    done = Teardown()
    # the pool controller first: a backfill it started while the lab goes down (a host slurmd, a
    # real node) would come after the PID files were read, and outlive the lab
    if procs.stop(cfg.run_dir, pool.PROC_NAME):
        done.services.append(pool.PROC_NAME)
    before = slurm.job_processes(cfg)
    done.jobs = slurm.cancel_jobs(cfg)
    if done.jobs:
        procs.wait_ended(before, JOB_CANCEL_WAIT_S)
    if (cfg.run_dir / "nodes").is_dir():
        from lab.nodes import cluster

        # first: its cgroups, bridge and routes are found by the lab's id, even after a crash
        done.services += cluster.teardown(cfg.run_dir)
    done.services += controlplane.stop_control_plane(cfg.run_dir) + _stop_services(cfg)
    leftovers = {*before, *slurm.job_processes(cfg)}
    _, done.killed = procs.terminate(sorted(leftovers))
    done.job_processes = sum(1 for t in leftovers if not kernel.is_same(*t))
    from lab import runner

    # a task a play was running when its runner stopped (or was killed) is nobody's child now
    done.play_processes, _ = procs.terminate(runner.play_processes(cfg))
    shutil.rmtree(cfg.socket_dir, ignore_errors=True)  # sockets and slurmd spool only
    return done


def _stop_services(cfg: LabConfig) -> list[str]:
    """Stop the lab's daemons in reverse dependency order: observers first, then the runners'
    journal (postgres), munge last."""
    names = procs.names(cfg.run_dir)
    first = [n for n in names if n not in ("postgres", "slurmctld", "munged")]
    stopped = procs.stop_many(cfg.run_dir, first)
    if "postgres" in names:
        from lab import runner

        if runner.stop_postgres(cfg):
            stopped.append("postgres")
    for n in ("slurmctld", "munged"):
        if n in names and procs.stop(cfg.run_dir, n):
            stopped.append(n)
    return stopped


def status(cfg: LabConfig) -> LabStatus:
    if cfg.pods:
        return _pods_status(cfg)
    live = procs.running(cfg.run_dir)
    st = LabStatus(cfg.name, up=bool(live))
    checks: list[tuple[str, Callable[[], str]]] = [
        ("munged", lambda: "socket ok"),
        (
            "slurmctld",
            lambda: slurm.run(cfg, ["scontrol", "ping"], timeout=5).split(" is ")[-1].strip(),
        ),
        ("prometheus", lambda: _http(cfg.url("prometheus", "/-/ready"))),
        ("alertmanager", lambda: _http(cfg.url("alertmanager", "/-/ready"))),
        ("simulator", lambda: _http(cfg.url("simulator", "/healthz"))),
        ("pool-controller", lambda: _http(cfg.url("pool_controller", "/healthz"))),
    ]
    if aws.enabled(cfg):
        checks.append((aws.SERVICE, lambda: _http(cfg.url("moto", "/moto-api/"))))
    if cfg.runner and runner_available():
        from lab import runner

        if cfg.runner_journal == "postgres":
            checks.append(("postgres", lambda: runner.postgres_ready(cfg)))
        for svc in cfg.runner_services:
            checks.append((svc, functools.partial(_runner_state, cfg, svc)))
    for name, check in checks:
        if name not in live:
            st.services.append(ServiceStatus(name, False, "not running"))
            continue
        try:
            st.services.append(ServiceStatus(name, True, check()))
        except Exception as exc:
            st.services.append(ServiceStatus(name, False, str(exc)[:120]))
    if "pool-controller" in live:
        st.services += [ServiceStatus(*row) for row in aws.pool_rows(cfg)]
    slurmds = [n for n in live if n.startswith("slurmd-")]
    with_slurmd = set(slurmd_nodes(cfg))
    want = [f"slurmd-{n}" for n in current_nodes(cfg) if n in with_slurmd or cfg.slurmd_limit is None]
    missing = [n for n in want if n not in live]
    st.services.append(
        ServiceStatus(
            "slurmd",
            not missing,
            f"{len(slurmds)} running" + (f"; missing {', '.join(missing[:5])}" if missing else ""),
        )
    )
    if watch.enabled(cfg):
        gone = [n for n in current_nodes(cfg) if watch.name(n) not in live]
        detail = f"{len(current_nodes(cfg)) - len(gone)} running" + (f"; missing {gone[:5]}" if gone else "")
        st.services.append(ServiceStatus("watchers", not gone, detail))
    if (cfg.run_dir / "kubeconfig").exists():
        try:
            from lab import controlplane

            for name, ok in controlplane.control_plane_status(cfg.run_dir).items():
                st.services.append(ServiceStatus(name, ok, "ok" if ok else "unhealthy"))
        except ImportError:
            pass
    if cfg.real_nodes:
        from lab.nodes import cluster

        for name, ok in cluster.status(cfg.run_dir).items():
            st.services.append(ServiceStatus(name, ok, "running" if ok else "not running"))
    return st


def _pods_status(cfg: LabConfig) -> LabStatus:
    """A pods lab: the host's services, the control plane and real nodes, then the stack's pods
    (each not Ready one named with its cause) and the runner's /readyz through its Service."""
    from lab import runner
    from lab.nodes import cluster

    live = procs.running(cfg.run_dir)
    st = LabStatus(cfg.name, up=bool(live))
    checks: list[tuple[str, Callable[[], str]]] = [
        ("prometheus", lambda: _http(cfg.url("prometheus", "/-/ready"))),
        ("alertmanager", lambda: _http(cfg.url("alertmanager", "/-/ready"))),
        ("simulator", lambda: _http(cfg.url("simulator", "/healthz"))),
        ("pool-controller", lambda: _http(cfg.url("pool_controller", "/healthz"))),
        ("runner", lambda: runner.pod_readyz(cfg)),
    ]
    for name, check in checks:
        if name != "runner" and name not in live:
            st.services.append(ServiceStatus(name, False, "not running"))
            continue
        try:
            st.services.append(ServiceStatus(name, True, check()))
        except Exception as exc:
            st.services.append(ServiceStatus(name, False, str(exc)[:300]))
    if cfg.kubeconfig.exists():  # the XID watchers are the stack's pods, listed below
        from lab import controlplane

        for name, ok in controlplane.control_plane_status(cfg.run_dir).items():
            st.services.append(ServiceStatus(name, ok, "ok" if ok else "unhealthy"))
        for name, ok in cluster.status(cfg.run_dir).items():
            st.services.append(ServiceStatus(name, ok, "running" if ok else "not running"))
        st.services += [ServiceStatus(n, ok, d) for n, ok, d in runner.stack_pods(cfg)]
    return st


def _runner_state(cfg: LabConfig, service: str) -> str:
    """`ready`, and for replicas whether this one leads."""
    from lab import runner

    state = _http(cfg.url(service, "/readyz"))
    if cfg.runner_replicas > 1:
        state += {True: ", leader", False: ", follower", None: ""}[runner.leads(cfg, service)]
    return state


def _http(url: str) -> str:
    r = httpx.get(url, timeout=2)
    r.raise_for_status()
    return "ready"


def inject(cfg: LabConfig, node: str, gpu: int | None, xid: int | None, vanish: bool = False) -> None:
    """Set (or with xid None, clear) the XID gauge of a simulated GPU; with `vanish` its series
    disappear instead (DCGM lost the GPU). The node's kernel log gets the driver's line."""
    if xid is None:
        r = httpx.post(cfg.url("simulator", "/v1/clear"), json={"node": node, "gpu": gpu}, timeout=5)
    else:
        body = {"node": node, "gpu": gpu, "xid": xid, "vanish": vanish}
        r = httpx.post(cfg.url("simulator", "/v1/xid"), json=body, timeout=5)
    if r.status_code != 200:
        raise LabError(f"simulator: {r.json().get('error', r.text)}")


def logs(cfg: LabConfig) -> dict[str, Path]:
    d = procs.log_dir(cfg.run_dir)
    return {p.stem: p for p in sorted(d.glob("*.log"))} if d.is_dir() else {}


def require(name: str, root: Path | None = None) -> LabConfig:
    cfg = load_lab(name, root)
    if cfg is None:
        raise LabError(f"lab {name!r} has never been brought up; run `autoheal lab up --name {name}`")
    return cfg
