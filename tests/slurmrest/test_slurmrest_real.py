"""The slurmrestd client against a real Slurm 26.05 (Debian forky): slurmctld with auth/slurm and
auth/jwt, one slurmd, slurmrestd with rest_auth/jwt, run from a forky root filesystem on this host.

The root filesystem is built once with mmdebstrap (images.debian, ~40 s from the mirror) and cached
as a tar under the image cache; each run unpacks it into its own folder and runs each daemon in a
mount namespace of its own (`unshare --mount`: /proc and /dev mounted for the chroot vanish with
the daemon), chrooted. Two nodes: gpu-nodeset-0 has the slurmd (jobs run on it), gpu-nodeset-1 is
a record only (nothing answers on its port), named as Slinky's StatefulSet mode names them.
A second, smaller one from trixie (Slurm 24.11.5: slurmctld and slurmrestd only) is the Slurm
older than the backend supports, refused by the version check with its release named.
No mirror, no mmdebstrap or not root: skipped, saying which.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from autoheal.nodemap import NodeMapRule, map_nodes
from autoheal.slurmrest import (
    SETTING_TOKEN_FILE,
    SETTING_USER,
    SignedToken,
    SlurmRest,
    SlurmRestAuthError,
    SlurmRestUnreachable,
    SlurmRestVersionError,
    TokenFile,
    sign_hs256,
)
from components.preflight.slurmrest import check_slurmrest
from images import debian
from images.build import cache_root
from remediation.cordon_sync import SYNC_REASON, CordonSync, KubeNode, KubeNodes, SyncJournal
from remediation.lending import Job
from remediation.slurm_existing import RestSlurm
from tests.support import port_base, wait_for

SUITE = "forky"
PACKAGES = ("slurmctld", "slurmd", "slurmrestd", "slurm-client", "slurm-wlm-jwt-plugin")
# the mirror serves a snapshot of testing whose Release is past its Valid-Until
APT_OPTIONS = ('Acquire::Check-Valid-Until "false"',)
PORTS = port_base(
    29450
)  # +0 slurmctld, +1 slurmd, +2 slurmrestd, +3 nothing (the record-only node); +10: 24.11
NODES = ("gpu-nodeset-0", "gpu-nodeset-1")
LIB = "/usr/lib/x86_64-linux-gnu/slurm-wlm"


def rootfs_tar(suite: str, packages: tuple[str, ...]) -> Path:
    """The cached root filesystem's tar (built on first use); skips when it cannot be built."""
    if os.geteuid() != 0:
        pytest.skip("SLURM NOT TESTED: needs root (chroot, mount namespaces)")
    if shutil.which("mmdebstrap") is None or shutil.which("unshare") is None:
        pytest.skip(
            "SLURM 26.05 NOT TESTED: mmdebstrap or unshare missing (scripts/bootstrap.sh installs them)"
        )
    key = hashlib.sha256(repr((suite, packages, APT_OPTIONS)).encode()).hexdigest()[:12]
    cache = cache_root() / "slurmrest"
    tar = cache / f"{suite}-{key}.tar"
    if tar.exists():
        return tar
    cache.mkdir(parents=True, exist_ok=True)
    part = tar.with_suffix(".part")
    try:
        debian.mmdebstrap(
            suite,
            packages,
            part,
            cache_root() / "debs" / suite,
            cache / f"{suite}-{key}.log",
            apt_options=APT_OPTIONS,
            timeout=600,
        )
    except debian.BuildError as exc:
        part.unlink(missing_ok=True)
        pytest.skip(f"SLURM NOT TESTED: the {suite} root filesystem could not be built: {exc}")
    part.rename(tar)
    return tar


SLURM_CONF = """\
ClusterName=ahrest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
AuthType=auth/slurm
CredType=auth/slurm
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=/etc/slurm/jwt_hs256.key
SlurmUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
NodeName={n0} NodeAddr=127.0.0.1 CPUs=1 RealMemory=100 State=UNKNOWN
NodeName={n1} NodeAddr=127.0.0.1 Port={nowhere} CPUs=1 RealMemory=100 State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class ForkySlurm:
    root: Path
    url: str
    key: Path  # slurmctld's jwt key
    procs: list[subprocess.Popen[bytes]]

    def run(self, *argv: str) -> str:
        """A Slurm command inside the root filesystem (auth/slurm with its key, as root)."""
        res = subprocess.run(["chroot", str(self.root), *argv], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, f"{argv}: {res.stderr}"
        return res.stdout

    def client(self, user: str = "root", lifespan: float = 60, **kw: object) -> SlurmRest:
        return SlurmRest(self.url, user, SignedToken(self.key, user, lifespan=lifespan, **kw))  # type: ignore[arg-type]

    def log(self, name: str) -> str:
        path = self.root / "var/log/slurm" / name
        return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"


def _daemon(
    root: Path, argv: list[str], out: Path, user: str = "", env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """One daemon in a mount namespace of its own, chrooted: the namespace's mounts of /proc and
    /dev go with it. No --fork: the Popen's pid is the daemon's, so a signal reaches it."""
    userspec = f"--userspec={user}:{user} " if user else ""
    script = (
        f"mount -t proc proc {root}/proc && mount --rbind /dev {root}/dev && "
        f"exec chroot {userspec}{root} {' '.join(argv)}"
    )
    with out.open("wb") as fh:
        return subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=5)


@contextmanager
def running_slurm(
    suite: str, packages: tuple[str, ...], base: Path, ports: int, slurmd: bool, extra_conf: str = ""
) -> Iterator[ForkySlurm]:
    """slurmctld (+ slurmd on NODES[0]) + slurmrestd from `suite`'s root filesystem, until exit."""
    t0 = time.monotonic()
    tar = rootfs_tar(suite, packages)
    built = time.monotonic() - t0
    root = base / "root"
    root.mkdir()
    subprocess.run(["tar", "-C", str(root), "-xf", str(tar)], check=True, timeout=120)  # device nodes too
    etc = root / "etc/slurm"
    for d in ("var/spool/slurmctld", "var/spool/slurmd", "var/log/slurm", "run/slurm"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for name in ("slurm.key", "jwt_hs256.key"):
        (etc / name).write_bytes(os.urandom(32))
        (etc / name).chmod(0o600)
    host = socket.gethostname().split(".")[0]
    conf = SLURM_CONF.format(
        host=host, ctld=ports, slurmd=ports + 1, nowhere=ports + 3, n0=NODES[0], n1=NODES[1]
    )
    (etc / "slurm.conf").write_text(conf + extra_conf)
    procs = [_daemon(root, ["/usr/sbin/slurmctld", "-D"], base / "slurmctld.out")]
    s = ForkySlurm(root, f"http://127.0.0.1:{ports + 2}", etc / "jwt_hs256.key", procs)
    try:
        wait_for(
            lambda: procs[0].poll() is None and "Running as primary controller" in s.log("slurmctld.log"),
            30,
            f"{suite} slurmctld",
        )
        if slurmd:
            (etc / "cgroup.conf").write_text("CgroupPlugin=disabled\n")  # no cgroup tree in the chroot
            procs.append(_daemon(root, ["/usr/sbin/slurmd", "-D", "-N", NODES[0]], base / "slurmd.out"))
        # -s: only the slurmctld endpoints (24.11 stops at startup on openapi/slurmdbd without slurmdbd)
        restd = [
            "/usr/sbin/slurmrestd",
            "-a",
            "rest_auth/jwt",
            "-s",
            "openapi/slurmctld",
            f"127.0.0.1:{ports + 2}",
        ]
        # SLURM_JWT=daemon: slurmrestd passes the clients' tokens through to slurmctld (only
        # slurmrestd: in slurmctld's environment it switches its own auth to jwt, and 26.05 stops)
        procs.append(_daemon(root, restd, base / "slurmrestd.out", user="slurm", env={"SLURM_JWT": "daemon"}))
        c = s.client()

        def up() -> bool:
            try:
                if not slurmd:
                    return bool(c.served().release)
                return "IDLE" in c.nodes()[NODES[0]].state
            except Exception:
                return False

        wait_for(up, 60, f"{suite} slurmrestd up; slurmd log:\n{s.log('slurmd.log')}")
        c.close()
        print(f"\n{suite} Slurm up in {time.monotonic() - t0:.1f} s (root filesystem {built:.1f} s of it)")
        yield s
    finally:
        _stop(procs)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkySlurm]:
    with running_slurm(SUITE, PACKAGES, tmp_path_factory.mktemp("forky"), PORTS, slurmd=True) as s:
        yield s


@pytest.fixture(scope="module")
def old_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkySlurm]:
    """Slurm 24.11 (trixie, what autoheal's own images carry): older than the backend supports."""
    packages = ("slurmctld", "slurmrestd", "slurm-client", "slurm-wlm-jwt-plugin")
    with running_slurm("trixie", packages, tmp_path_factory.mktemp("trixie"), PORTS + 10, slurmd=False) as s:
        yield s


def test_version_api_and_preflight(slurm: ForkySlurm) -> None:
    c = slurm.client()
    served = c.check()
    assert served.release.startswith("26.05.") and served.version >= (26, 5, 0)
    assert served.api_versions[:2] == ("v0.0.45", "v0.0.44")  # what 26.05 serves (also v0.0.43, v0.0.42)
    assert c.api_version == "v0.0.45"
    rows = check_slurmrest(slurm.client())
    assert [(r.name, r.status) for r in rows] == [
        ("slurmrestd reachable", "pass"),
        ("slurm version", "pass"),
        ("slurmrestd authorised", "pass"),
    ], rows


@pytest.mark.parametrize("api", ["v0.0.45", "v0.0.44"])
def test_list_drain_with_reason_and_resume(slurm: ForkySlurm, api: str) -> None:
    c = SlurmRest(slurm.url, "root", SignedToken(slurm.key, "root"), api_version=api)
    nodes = c.nodes()
    assert set(nodes) == set(NODES)
    assert not nodes[NODES[0]].drained
    for name in NODES:  # the live node and the record-only one
        reason = f"autoheal: XID 79 {name} ({api})"
        c.drain([name], reason)
        got = c.node(name)
        assert got.drained and "DRAIN" in got.state and got.reason == reason, got
        assert reason in slurm.run("scontrol", "show", "node", name)  # Slurm itself says so
        c.resume([name])
        got = c.node(name)
        assert "DRAIN" not in got.state and got.reason == "", got
    # what the mapping reads from the live node list: Slinky's StatefulSet names via the pods
    pods = [
        {
            "metadata": {"name": n, "labels": {"app.kubernetes.io/name": "slurmd"}},
            "spec": {"nodeName": f"k{i}"},
        }
        for i, n in enumerate(NODES)
    ]
    kube = [{"metadata": {"name": k}} for k in ("k0", "k1", "k2")]
    m = map_nodes(
        NodeMapRule("pod-hostname", selector="app.kubernetes.io/name=slurmd"), kube, pods, c.nodes()
    )
    assert m.mapped == {"k0": NODES[0], "k1": NODES[1]} and set(m.unmapped) == {"k2"}


def test_jobs_on_a_node_and_requeue(slurm: ForkySlurm) -> None:
    job = slurm.run(
        "sbatch",
        "--parsable",
        "-w",
        NODES[0],
        "-o",
        "/dev/null",
        "--comment",
        "checkpoint=1234",
        "--wrap",
        "sleep 300",
    ).strip()
    c = slurm.client()
    try:
        running = wait_for(lambda: c.jobs_on(NODES[0]), 30, f"job {job} running on {NODES[0]}")
        assert [j.job_id for j in running] == [job] and running[0].nodes == (NODES[0],)
        assert c.node(NODES[0]).busy
        # what the lender reads (remediation/slurm_existing.RestSlurm): the job and its checkpoint
        assert RestSlurm(c).jobs_on(NODES[0]) == (Job(job, running[0].priority, 1234.0),)
        assert RestSlurm(c).nodes()[NODES[0]].busy
        pinned = SlurmRest(slurm.url, "root", SignedToken(slurm.key, "root"), api_version="v0.0.44")
        with pytest.raises(SlurmRestVersionError, match="no job requeue"):
            pinned.requeue([job])
        c.requeue([job])
        wait_for(lambda: not c.jobs_on(NODES[0]), 30, f"job {job} requeued off {NODES[0]}")
        again = [j for j in c.jobs() if j.job_id == job]
        assert again and again[0].state == "PENDING", again  # requeued, not cancelled
    finally:
        slurm.run("scancel", job)


def test_signed_token_refreshed_before_and_after_expiry(slurm: ForkySlurm) -> None:
    # proactive: a 2 s token, re-signed in its last half second; a call after it expired succeeds
    c = slurm.client(lifespan=2, refresh_margin=0.5)
    c.nodes()
    time.sleep(2.5)
    assert set(c.nodes()) == set(NODES)
    src = c.tokens
    assert isinstance(src, SignedToken) and src.signed == 2 and c.refreshed == 0

    # reactive: the runner's clock 2 s behind slurmctld's, so it sends a token slurmctld already
    # finds expired; the refusal makes it sign again, and the one retry succeeds
    lag = SignedToken(slurm.key, "root", lifespan=4, refresh_margin=0, clock=lambda: time.time() - 2)
    c = SlurmRest(slurm.url, "root", lag)
    c.nodes()
    time.sleep(2.8)
    assert set(c.nodes()) == set(NODES)
    assert c.refreshed == 1 and lag.signed == 2


def test_token_file_expired_bad_and_rotated(slurm: ForkySlurm, tmp_path: Path) -> None:
    f = tmp_path / "token"
    key = slurm.key.read_bytes()
    now = int(time.time())
    f.write_text(sign_hs256(key, {"iat": now - 120, "exp": now - 60, "sun": "root"}))
    c = SlurmRest(slurm.url, "root", TokenFile(f), api_version="v0.0.45")
    with pytest.raises(
        SlurmRestAuthError, match=r"Protocol authentication error \(1007\).*expired \d+ s ago"
    ) as err:
        c.nodes()
    assert err.value.setting == SETTING_TOKEN_FILE
    rows = check_slurmrest(c)
    assert rows[-1].name == "slurmrestd authorised" and rows[-1].status == "fail"
    assert SETTING_TOKEN_FILE in rows[-1].fix

    f.write_text(sign_hs256(os.urandom(32), {"iat": now, "exp": now + 600, "sun": "root"}))  # not Slurm's key
    os.utime(f, ns=(time.time_ns(), time.time_ns() + 10**9))
    with pytest.raises(SlurmRestAuthError, match=rf"put a valid token for user 'root' in {f}"):
        c.nodes()

    f.write_text(sign_hs256(key, {"iat": now, "exp": now + 600, "sun": "root"}))  # the Secret rotated
    os.utime(f, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    assert set(c.nodes()) == set(NODES)


def test_a_user_who_may_not_drain_names_the_user_setting(slurm: ForkySlurm) -> None:
    c = slurm.client(user="slurm")  # a valid token, but not SlurmUser, root or an operator
    assert set(c.nodes()) == set(NODES)  # reading is allowed
    with pytest.raises(
        SlurmRestAuthError, match=r"does not allow user 'slurm'.*Invalid user id \(2010\)"
    ) as err:
        c.drain([NODES[1]], "autoheal: not allowed")
    assert err.value.setting == SETTING_USER
    assert not slurm.client().node(NODES[1]).drained


def test_cordon_sync_drains_and_resumes_through_slurmrestd(slurm: ForkySlurm, tmp_path: Path) -> None:
    """Cordon sync's reconcile, unchanged, on the existing backend: a cordon drains the Slurm node
    with autoheal's reason, the cordon lifted resumes it, and each is journalled."""
    journal = SyncJournal(tmp_path / "sync.jsonl")
    # reconcile reads Slurm only; the Kubernetes side is handed in (no API server is read here)
    sync = CordonSync(
        nodes=KubeNodes(tmp_path / "no-kubeconfig"), slurm=RestSlurm(slurm.client()), journal=journal
    )
    c = slurm.client()
    done = sync.reconcile([KubeNode(NODES[0]), KubeNode(NODES[1], unschedulable=True)], time.time())
    assert [(a.node, a.verb) for a in done] == [(NODES[1], "drain")]
    assert c.node(NODES[1]).reason == SYNC_REASON and c.node(NODES[1]).drained
    done = sync.reconcile([KubeNode(NODES[1])], time.time())
    assert [(a.node, a.verb) for a in done] == [(NODES[1], "resume")]
    assert not c.node(NODES[1]).drained
    assert [json.loads(line)["action"] for line in journal.path.read_text().splitlines()] == [
        "drain",
        "resume",
    ]


def test_an_older_slurm_is_refused_naming_its_version(old_slurm: ForkySlurm) -> None:
    """Slurm 24.11 (trixie) behind a real slurmrestd: refused by the version check, the preflight
    row says which Slurm it found."""
    c = old_slurm.client()
    served = c.served()
    assert served.release.startswith("24.11.")
    with pytest.raises(
        SlurmRestVersionError, match=rf"runs Slurm {served.release}; the existing backend needs Slurm 25\.11"
    ):
        c.check()
    rows = check_slurmrest(old_slurm.client())
    assert [(r.name, r.status) for r in rows] == [
        ("slurmrestd reachable", "pass"),
        ("slurm version", "fail"),
    ], rows
    assert served.release in rows[1].detail


def test_slurmctld_down_behind_slurmrestd_is_unreachable(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A Slurm of its own (this one is broken): slurmctld stops, slurmrestd still answers, and
    says after its MessageTimeout (10 s by default, 3 s here) that it cannot reach slurmctld."""
    base = tmp_path_factory.mktemp("broken")
    with running_slurm(SUITE, PACKAGES, base, PORTS + 20, slurmd=False, extra_conf="MessageTimeout=3\n") as s:
        c = s.client()
        assert set(c.nodes()) == set(NODES)
        _stop(s.procs[:1])  # slurmctld only
        t0 = time.monotonic()
        with pytest.raises(SlurmRestUnreachable, match=r"could not reach slurmctld .*\(1800\)") as err:
            c.nodes()
        waited = time.monotonic() - t0
        assert err.value.setting == "slurm.rest.url" and waited < 15, waited
        print(f"\nslurmctld down: SlurmRestUnreachable after {waited:.1f} s")
