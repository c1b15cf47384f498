"""A real Kubernetes control plane with KWOK-simulated GPU nodes, for the lab and its tests.

Why: autoheal remediates through the Kubernetes API (cordon, evict under PodDisruptionBudgets,
reschedule onto GPU capacity). A mock would not show how the real API server, scheduler and
controllers answer, so the lab runs the real ones, built from source by scripts/build-tools.sh.
KWOK plays the kubelets: a simulated node costs a few kilobytes, so a 2,000-node GPU cluster fits
on a laptop-sized machine.

The five processes (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok) are
started directly rather than through ``kwokctl``, by the lab's process manager (lab.procs), so
that each has a PID file (``run_dir/pids/<service>.json``, with the kernel start time), a log
(``run_dir/logs/<service>.log``), a health check, and a loopback port derived from ``port_base``
(two labs on one machine don't collide). ``stop_control_plane`` cleans up by PID from those
files, also after a failed or interrupted start, and never signals a recycled PID.

PKI (a CA, the API server's serving certificate, an admin client certificate and the
service-account signing key) is generated per run with ``cryptography``; ``run_dir/kubeconfig``
authenticates as ``system:masters``. Each start begins from an empty etcd. ServiceAccounts are
real: the API server signs tokens (``--service-account-signing-key-file``, TokenRequest works), the
ServiceAccount admission plugin gives pods projected tokens, and the controller manager creates
each namespace's accounts and its ``kube-root-ca.crt``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import shutil
import socket
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from autoheal.backoff import Backoff
from autoheal.errors import LabError
from autoheal.labels import GPU_RESOURCE
from lab import procs

SERVICES: tuple[str, ...] = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
)
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
STAGES_DIR = Path(str(resources.files("lab") / "kwok-stages"))  # package data of the lab
SERVICE_CIDR = "10.96.0.0/12"
_STOP_GRACE_S = 10.0


class ToolMissingError(LabError):
    """A binary that scripts/build-tools.sh builds is not in the tool cache."""


class ControlPlaneError(LabError):
    """A control-plane service failed to start or become healthy."""

    def __init__(self, service: str, cause: str, log: Path | None) -> None:
        self.service = service
        self.cause = cause
        self.log = log
        msg = f"{service}: {cause}"
        if log is not None:
            msg += f" (log: {log})"
            tail = procs.log_tail(log, 15, "\n")
            if tail:
                msg += "\n--- last lines of the log ---\n" + tail
        super().__init__(msg)


@dataclass(frozen=True)
class KubeNodeSpec:
    """One KWOK-managed node: its name, labels, taints and capacity."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)  # {"key","value","effect"}
    gpus: int = 8
    cpu: str = "192"
    memory: str = "2048Gi"
    pods: int = 110
    # What the kubelet keeps for itself, as a cloud node's allocatable (None: all of capacity);
    # the resources not named here are allocatable in full.
    allocatable: Mapping[str, str] | None = None
    # the cloud's id of the node's machine (aws:///<az>/<instance-id>), "" for none
    provider_id: str = ""


@dataclass(frozen=True)
class KubeHandle:
    """What a running control plane is: where to reach it and which processes it is."""

    kubeconfig: Path
    api_url: str
    pids: dict[str, int]
    run_dir: Path
    port_base: int


@dataclass(frozen=True)
class Ports:
    """Loopback ports of one control plane, all derived from one base port."""

    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int

    @classmethod
    def from_base(cls, base: int) -> Ports:
        if not 1024 <= base <= 65535 - 8:
            raise ValueError(f"port_base {base} is outside 1024..65527")
        return cls(base, base + 1, base + 2, base + 3, base + 4, base + 5)


# --- binaries -------------------------------------------------------------------------------


def tool_bin_dir() -> Path:
    """The stable bin/ directory of scripts/build-tools.sh (symlinks to pinned versions)."""
    explicit = os.environ.get("AUTOHEAL_TOOLS_BIN")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("AUTOHEAL_CACHE") or str(Path.home() / ".cache" / "autoheal")
    return Path(cache) / "bin"


def tool_path(name: str) -> Path:
    """Path of a built tool such as ``kube-apiserver``; raises ToolMissingError if absent."""
    path = tool_bin_dir() / name
    if not (path.exists() and os.access(path, os.X_OK)):
        raise ToolMissingError(
            f"{name} is not built: {path} is missing. Run scripts/build-tools.sh "
            "(first build: 30-45 min; later runs reuse the cache)."
        )
    return path


# --- PKI ------------------------------------------------------------------------------------


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _cert(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    sans: Sequence[x509.GeneralName] = (),
    client: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        # key identifiers: Python 3.13's default TLS context (VERIFY_X509_STRICT; the runner
        # image's Python) refuses a chain without an Authority Key Identifier
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
        )
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        usage = (
            x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH if client else (x509.oid.ExtendedKeyUsageOID.SERVER_AUTH)
        )
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def generate_pki(pki: Path) -> None:
    """Write ca, apiserver (serving), admin (client, system:masters) and sa key pairs."""
    pki.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("autoheal-lab-ca")
    ca = _cert(ca_name, ca_key, ca_name, ca_key, ca=True)
    service_ip = next(iter(ipaddress.IPv4Network(SERVICE_CIDR).hosts()))
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(service_ip),
    ]
    api_key = _key()
    api = _cert(_name("kube-apiserver"), api_key, ca_name, ca_key, sans=sans)
    admin_key = _key()
    admin = _cert(_name("autoheal-admin", "system:masters"), admin_key, ca_name, ca_key, client=True)
    for stem, cert, key in (("ca", ca, ca_key), ("apiserver", api, api_key), ("admin", admin, admin_key)):
        (pki / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pki / f"{stem}.key", key)
    sa_key = _key()
    _write_key(pki / "sa.key", sa_key)
    (pki / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _write_kubeconfig(path: Path, pki: Path, api_url: str) -> None:
    import base64

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "autoheal-lab",
                "cluster": {"server": api_url, "certificate-authority-data": b64(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": "autoheal-admin",
                "user": {
                    "client-certificate-data": b64(pki / "admin.crt"),
                    "client-key-data": b64(pki / "admin.key"),
                },
            }
        ],
        "contexts": [
            {"name": "autoheal-lab", "context": {"cluster": "autoheal-lab", "user": "autoheal-admin"}}
        ],
        "current-context": "autoheal-lab",
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    path.chmod(0o600)


# --- processes (through lab.procs, the lab's one process manager) ---------------------------

# Stopped in waves: the API server's shutdown talks to etcd (it removes its own endpoint), so
# etcd goes last; signalling all at once makes the API server hang until the grace period.
_STOP_WAVES: tuple[tuple[str, ...], ...] = (
    ("kwok", "kube-scheduler", "kube-controller-manager"),
    ("kube-apiserver",),
    ("etcd",),
)


def stop_control_plane(run_dir: Path) -> list[str]:
    """Stop every service of the control plane in run_dir by its PID file; returns the services
    that were running (none: a no-op).

    A PID is signalled only while it is still the process started (its kernel start time is in
    the PID file), SIGTERM first and SIGKILL after a grace period; PID files are removed.
    """
    run_dir = Path(run_dir)
    if not procs.pid_dir(run_dir).is_dir():
        return []
    return [name for wave in _STOP_WAVES for name in procs.stop_many(run_dir, wave, timeout=_STOP_GRACE_S)]


# --- health ---------------------------------------------------------------------------------


def _insecure_ctx() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # self-signed serving certs of KCM/scheduler on loopback
    return ctx


def _api_ctx(pki: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return ctx


def _health_checks(run_dir: Path, ports: Ports) -> dict[str, Callable[[], None]]:
    pki = run_dir / "pki"

    def get(url: str, verify: ssl.SSLContext | bool) -> Callable[[], None]:
        def check() -> None:
            r = httpx.get(url, verify=verify, timeout=2.0)
            if r.status_code != 200:
                raise RuntimeError(f"{url} answered {r.status_code}: {r.text[:200]}")

        return check

    def api_check() -> None:
        get(f"https://127.0.0.1:{ports.apiserver}/readyz", _api_ctx(pki))()

    return {
        "etcd": get(f"http://127.0.0.1:{ports.etcd}/health", False),
        "kube-apiserver": api_check,
        "kube-controller-manager": get(
            f"https://127.0.0.1:{ports.controller_manager}/healthz", _insecure_ctx()
        ),
        "kube-scheduler": get(f"https://127.0.0.1:{ports.scheduler}/healthz", _insecure_ctx()),
        "kwok": get(f"http://127.0.0.1:{ports.kwok}/healthz", False),
    }


def _wait_healthy(proc: procs.Proc, check: Callable[[], None], deadline: float) -> None:
    last = "no answer yet"
    while True:
        if not procs.is_alive(proc):
            code = procs.exit_code(proc)
            raise ControlPlaneError(proc.name, f"exited with code {code} while starting", proc.log)
        try:
            check()
            return
        except Exception as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise ControlPlaneError(proc.name, f"not healthy before the timeout ({last})", proc.log)
        time.sleep(0.1)


def control_plane_status(run_dir: Path) -> dict[str, bool]:
    """Service -> healthy (its process runs and its health endpoint answers 200)."""
    run_dir = Path(run_dir)
    try:
        meta = json.loads((run_dir / "cluster.json").read_text())
        ports = Ports.from_base(int(meta["port_base"]))
    except (OSError, ValueError, KeyError):
        return dict.fromkeys(SERVICES, False)
    checks = _health_checks(run_dir, ports)
    status: dict[str, bool] = {}
    for service in SERVICES:
        proc = procs.read_proc(run_dir, service)
        ok = proc is not None and procs.is_alive(proc)
        if ok:
            try:
                checks[service]()
            except Exception:
                ok = False
        status[service] = ok
    return status


# --- start ----------------------------------------------------------------------------------


def lease_seconds(n_nodes: int) -> int:
    """KWOK renews each node's Lease every quarter of its duration. At the kubelet default (40 s)
    2,000 nodes cost 200 writes/s, ~0.6 of this box's 2 cores in apiserver + etcd with nothing
    happening (measured); and nodes created together renew together (KWOK's jitter is 4%), so
    the writes come in bursts. Large labs renew every 150 s, and the node controller's grace
    period follows, so no node turns NotReady in between. Small labs keep the kubelet default."""
    return 40 if n_nodes <= 300 else 600


def node_grace_seconds(n_nodes: int) -> int:
    """How long the node controller waits for a node's Lease before it marks the node NotReady:
    Kubernetes' default (50 s), or longer where large labs renew their Leases less often."""
    return max(50, lease_seconds(n_nodes) + 20)


def _argv(
    run_dir: Path,
    ports: Ports,
    n_nodes: int = 0,
    advertise_address: str = "127.0.0.1",
    node_grace: int | None = None,
) -> dict[str, list[str]]:
    lease = lease_seconds(n_nodes)
    node_grace = node_grace or node_grace_seconds(n_nodes)
    pki = run_dir / "pki"
    kubeconfig = str(run_dir / "kubeconfig")
    etcd_url = f"http://127.0.0.1:{ports.etcd}"
    peer_url = f"http://127.0.0.1:{ports.etcd_peer}"
    delegated = [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
    ]
    return {
        "etcd": [
            str(tool_path("etcd")),
            "--name=lab",
            f"--data-dir={run_dir / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=lab={peer_url}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync=true",  # a throwaway lab store: durability buys nothing
            "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ],
        "kube-apiserver": [
            str(tool_path("kube-apiserver")),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            # real nodes (lab/nodes) reach the API server on their bridge's address, and so
            # do their pods through the `kubernetes` Service, whose endpoint this is
            f"--advertise-address={advertise_address}",
            # ask kubelets for logs/exec by node IP (a node name would go to the host's DNS),
            # authenticated with the admin client certificate (kubelets trust the lab CA)
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={pki / 'admin.crt'}",
            f"--kubelet-client-key={pki / 'admin.key'}",
            f"--secure-port={ports.apiserver}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            # The ServiceAccount admission plugin stays on (the default set), as on any cluster:
            # a pod gets its account's projected token (kube-api-access-*), signed with sa.key
            # and valid for this issuer, so the runner in its pod authenticates as its own
            # ServiceAccount (docs/architecture.md, "The runner in the cluster"). It refuses pods
            # whose account does not exist yet: start_control_plane waits for default/default.
            # who changed what (writes only, metadata level): proves which identity acted,
            # e.g. that the runbook cordoned and evicted as the runner's ServiceAccount
            f"--audit-policy-file={run_dir / 'audit-policy.yaml'}",
            f"--audit-log-path={run_dir / 'logs' / 'audit.log'}",
            "--audit-log-maxsize=100",
            "--audit-log-maxbackup=1",
            "--max-requests-inflight=1000",
            "--max-mutating-requests-inflight=500",
            "--profiling=false",
            "--v=1",
        ],
        "kube-controller-manager": [
            str(tool_path("kube-controller-manager")),
            *delegated,
            f"--secure-port={ports.controller_manager}",
            f"--cert-dir={run_dir / 'kcm'}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--use-service-account-credentials=false",
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            f"--node-monitor-grace-period={node_grace}s",
            "--profiling=false",
            "--v=1",
        ],
        "kube-scheduler": [
            str(tool_path("kube-scheduler")),
            *delegated,
            f"--secure-port={ports.scheduler}",
            f"--cert-dir={run_dir / 'scheduler'}",
            "--profiling=false",
            "--v=1",
        ],
        "kwok": [
            str(tool_path("kwok")),
            f"--kubeconfig={kubeconfig}",
            f"--config={run_dir / 'kwok.yaml'}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}={KWOK_ANNOTATION_VALUE}",
            f"--node-lease-duration-seconds={lease}",
            "--node-ip=127.0.0.1",
            f"--server-address=127.0.0.1:{ports.kwok}",
            "--cidr=10.244.0.0/16",
        ],
    }


# Writes at metadata level; not the heartbeats (leases, node and pod status), which on 2,000
# KWOK nodes would be most of the log and of its cost, and no reads.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    verbs: [get, list, watch]
  - level: None
    resources:
      - group: ""
        resources: [nodes/status, pods/status]
      - group: coordination.k8s.io
        resources: [leases]
  - level: Metadata
"""


def audit_log(run_dir: Path) -> list[dict[str, Any]]:
    """The API server's audit events so far (who did which write), oldest first."""
    path = Path(run_dir) / "logs" / "audit.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# KWOK's defaults (4 workers each) make 2,000 nodes take minutes to turn Ready.
_KWOK_OPTIONS = """apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  nodePlayStageParallelism: 16
  nodeLeaseParallelism: 16
  podPlayStageParallelism: 8"""


def _write_kwok_config(run_dir: Path) -> None:
    docs = [p.read_text().strip() for p in sorted(STAGES_DIR.glob("*.yaml"))]
    if not docs:
        raise ToolMissingError(f"no KWOK stage configs in {STAGES_DIR}")
    (run_dir / "kwok.yaml").write_text("\n---\n".join([_KWOK_OPTIONS, *docs]) + "\n")


def _check_ports_free(ports: Ports) -> None:
    """Fail early, naming the service, if a port is taken (a health check could otherwise
    be answered by someone else's server, e.g. another lab's etcd)."""
    owners = {
        "etcd": ports.etcd,
        "etcd (peer)": ports.etcd_peer,
        "kube-apiserver": ports.apiserver,
        "kube-controller-manager": ports.controller_manager,
        "kube-scheduler": ports.scheduler,
        "kwok": ports.kwok,
    }
    for service, port in owners.items():
        with socket.socket() as sock:
            # as the services themselves bind (Go sets SO_REUSEADDR): connections of a killed
            # earlier run in TIME_WAIT must not make a free port look taken for a minute
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError as exc:
                raise ControlPlaneError(
                    service.split()[0],
                    f"port 127.0.0.1:{port} is already in use ({exc.strerror}); "
                    "another lab may run there: choose another port_base",
                    None,
                ) from exc


def start_control_plane(
    run_dir: Path,
    nodes: Sequence[KubeNodeSpec],
    port_base: int,
    timeout: float = 120.0,
    advertise_address: str = "127.0.0.1",
    node_grace_seconds: int | None = None,
) -> KubeHandle:
    """Start etcd, the API server, controller manager, scheduler and KWOK; add ``nodes``.
    `node_grace_seconds`: the node controller's grace before NotReady (default node_grace_seconds();
    tests that stop a kubelet set it shorter: real kubelets renew their Lease every 10 s).

    Returns once every service is healthy and every node is Ready. On any failure (or
    interrupt) everything started here is stopped again before the error propagates.
    """
    run_dir = Path(run_dir).resolve()
    ports = Ports.from_base(port_base)
    for service in SERVICES:
        tool_path(service)  # a missing binary is reported before anything starts
    stop_control_plane(run_dir)  # leftovers of an earlier run in the same dir
    _check_ports_free(ports)
    deadline = time.monotonic() + timeout
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("etcd", "kcm", "scheduler"):
        shutil.rmtree(run_dir / stale, ignore_errors=True)
    for sub in ("pki", "logs", "pids"):
        (run_dir / sub).mkdir(exist_ok=True)
    api_url = f"https://127.0.0.1:{ports.apiserver}"
    meta = {
        "port_base": port_base,
        "api_url": api_url,
        "nodes": len(nodes),
        "advertise": advertise_address,
        "node_grace": node_grace_seconds,
    }
    (run_dir / "cluster.json").write_text(json.dumps(meta))
    try:
        generate_pki(run_dir / "pki")
        _write_kubeconfig(run_dir / "kubeconfig", run_dir / "pki", api_url)
        _write_kwok_config(run_dir)
        (run_dir / "audit-policy.yaml").write_text(AUDIT_POLICY)
        argv = _argv(run_dir, ports, len(nodes), advertise_address, node_grace_seconds)
        checks = _health_checks(run_dir, ports)
        started: dict[str, procs.Proc] = {}
        for service in ("etcd", "kube-apiserver"):
            started[service] = procs.spawn(service, argv[service], run_dir, cwd=run_dir)
            _wait_healthy(started[service], checks[service], deadline)
        rest = ("kube-controller-manager", "kube-scheduler", "kwok")
        for service in rest:
            started[service] = procs.spawn(service, argv[service], run_dir, cwd=run_dir)
        for service in rest:
            _wait_healthy(started[service], checks[service], deadline)
        handle = KubeHandle(
            kubeconfig=run_dir / "kubeconfig",
            api_url=api_url,
            pids={service: p.pid for service, p in started.items()},
            run_dir=run_dir,
            port_base=port_base,
        )
        wait_service_account(handle.kubeconfig, "default", "default", max(1.0, deadline - time.monotonic()))
        if nodes:
            add_nodes(handle, nodes, timeout=max(1.0, deadline - time.monotonic()))
        return handle
    except BaseException:
        stop_control_plane(run_dir)
        raise


def restart_service(handle: KubeHandle, service: str, down_for: float = 0.0, timeout: float = 60.0) -> None:
    """Stop one service of a running control plane, keep it down `down_for` seconds, start it again
    with the arguments it was started with and wait until it is healthy (an outage, as a fault
    test injects it)."""
    if service not in SERVICES:
        raise ValueError(f"service {service!r}: one of {', '.join(SERVICES)}")
    run_dir = handle.run_dir
    ports = Ports.from_base(handle.port_base)
    meta = json.loads((run_dir / "cluster.json").read_text())
    argv = _argv(
        run_dir,
        ports,
        int(meta.get("nodes", 0)),
        str(meta.get("advertise", "127.0.0.1")),
        meta.get("node_grace"),
    )
    procs.stop(run_dir, service, timeout=_STOP_GRACE_S)
    time.sleep(down_for)
    proc = procs.spawn(service, argv[service], run_dir, cwd=run_dir)
    _wait_healthy(proc, _health_checks(run_dir, ports)[service], time.monotonic() + timeout)


def wait_service_account(kubeconfig: Path, namespace: str, name: str, timeout: float = 60.0) -> None:
    """Wait until the controller manager has created a ServiceAccount (each namespace's
    `default` appears a moment after the namespace): the ServiceAccount admission plugin refuses
    a pod whose account is missing, so a pod created right after `lab up` would otherwise race it."""
    deadline = time.monotonic() + timeout
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}"
    with http_client(kubeconfig, pool=1, timeout=5) as http:
        while True:
            status = http.get(path).status_code
            if status == 200:
                return
            if time.monotonic() > deadline:
                log = procs.log_path(Path(kubeconfig).parent, "kube-controller-manager")
                raise ControlPlaneError(
                    "kube-controller-manager",
                    f"ServiceAccount {namespace}/{name} not created after {timeout:.0f}s "
                    f"(last GET: {status})",
                    log if log.exists() else None,
                )
            time.sleep(0.1)


# --- nodes ----------------------------------------------------------------------------------


def api_client(kubeconfig: Path, pool: int = 32) -> Any:
    """A ``kubernetes.client.ApiClient`` for the lab's kubeconfig (connection pool ``pool``)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg, persist_config=False)
    cfg.connection_pool_maxsize = pool
    return client.ApiClient(cfg)


def node_manifest(spec: KubeNodeSpec) -> dict[str, Any]:
    """The Node object for a spec: labels, taints, GPU capacity and the KWOK annotation."""
    capacity = {
        "cpu": spec.cpu,
        "memory": spec.memory,
        "pods": str(spec.pods),
        "ephemeral-storage": "7Ti",
        GPU_RESOURCE: str(spec.gpus),
    }
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        **spec.labels,
    }
    taints = []
    for t in spec.taints:
        taint = {"key": t["key"], "effect": t.get("effect", "NoSchedule")}
        if t.get("value"):
            taint["value"] = t["value"]
        taints.append(taint)
    spec_: dict[str, Any] = {"taints": taints} if taints else {}
    if spec.provider_id:
        spec_["providerID"] = spec.provider_id
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE, "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": spec_,
        "status": {
            "capacity": capacity,
            # nodeInfo etc. come from KWOK's initialize stage
            "allocatable": {**capacity, **(spec.allocatable or {})},
        },
    }


def _kubeconfig_of(target: KubeHandle | Path) -> Path:
    return target.kubeconfig if isinstance(target, KubeHandle) else Path(target)


def http_client(kubeconfig: Path, pool: int = 16, timeout: float = 30.0) -> httpx.Client:
    """A plain ``httpx.Client`` on the API server of a kubeconfig written by this module.

    Used where the ``kubernetes`` client is too slow: it validates every body with pydantic
    (about 5 ms of CPU per Node against 1 ms here), which matters for thousands of nodes.
    """
    import base64
    import tempfile

    cfg = yaml.safe_load(Path(kubeconfig).read_text())
    cluster = cfg["clusters"][0]["cluster"]
    user = cfg["users"][0]["user"]
    ctx = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    with tempfile.TemporaryDirectory() as tmp:  # load_cert_chain only reads files
        cert, key = Path(tmp) / "c.pem", Path(tmp) / "k.pem"
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        ctx.load_cert_chain(str(cert), str(key))
    return httpx.Client(
        base_url=cluster["server"],
        verify=ctx,
        timeout=timeout,
        limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool),
        headers={"Accept": "application/json"},
    )


def create_nodes(kubeconfig: Path, nodes: Sequence[KubeNodeSpec], workers: int = 16) -> None:
    """Create KWOK nodes concurrently; nodes that already exist are kept as they are."""
    # A handshake with an API server that has just started, on a loaded machine, once failed
    # with a TLS decode alert: a transport error is tried again (a repeat answers 409, kept).
    retry = Backoff(0.2, 2.0, tries=5)
    with http_client(kubeconfig, pool=workers) as http:

        def create(spec: KubeNodeSpec) -> None:
            body, headers = json.dumps(node_manifest(spec)), {"Content-Type": "application/json"}
            r = retry.call(
                lambda: http.post("/api/v1/nodes", content=body, headers=headers),
                retry_on=(httpx.TransportError,),
            )
            if r.status_code not in (200, 201, 409):
                raise ControlPlaneError(
                    "kube-apiserver", f"creating node {spec.name}: {r.status_code} {r.text[:300]}", None
                )

        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(create, nodes))


def add_nodes(
    target: KubeHandle | Path,
    nodes: Sequence[KubeNodeSpec],
    timeout: float = 120.0,
    workers: int = 16,
) -> None:
    """Create KWOK nodes concurrently (existing ones are kept) and wait until all are Ready."""
    kubeconfig = _kubeconfig_of(target)
    deadline = time.monotonic() + timeout
    create_nodes(kubeconfig, nodes, workers)
    wait_nodes_ready(kubeconfig, [n.name for n in nodes], timeout=max(1.0, deadline - time.monotonic()))


def ready_node_names(http: httpx.Client) -> set[str]:
    """Names of the nodes whose Ready condition is True (one list from the watch cache)."""
    r = http.get("/api/v1/nodes", params={"resourceVersion": "0"})
    r.raise_for_status()
    ready: set[str] = set()
    for item in r.json().get("items", []):
        for cond in item.get("status", {}).get("conditions") or []:
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                ready.add(item["metadata"]["name"])
    return ready


def wait_nodes_ready(kubeconfig: Path, names: Sequence[str], timeout: float = 120.0) -> None:
    """Wait until every named node reports Ready; ControlPlaneError naming kwok if not."""
    want = set(names)
    deadline = time.monotonic() + timeout
    with http_client(kubeconfig, pool=1) as http:
        while True:
            missing = want - ready_node_names(http)
            if not missing:
                return
            if time.monotonic() > deadline:
                sample = ", ".join(sorted(missing)[:5])
                log = procs.log_path(Path(kubeconfig).parent, "kwok")
                raise ControlPlaneError(
                    "kwok",
                    f"{len(missing)} of {len(want)} nodes not Ready after {timeout:.0f}s (e.g. {sample})",
                    log if log.exists() else None,
                )
            time.sleep(0.2 if len(want) < 100 else 1.0)


def delete_node(target: KubeHandle | Path, name: str) -> None:
    """Delete a node (no error if it is already gone)."""
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    with api_client(_kubeconfig_of(target), pool=2) as api:
        try:
            CoreV1Api(api).delete_node(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
