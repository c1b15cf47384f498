"""The warm fence: the runbook's fence step without a play's start-up.

Why: fault -> fenced is the latency that matters most (until the node is drained, Slurm keeps
placing jobs on a dead GPU), and ansible-playbook spends ~2 s starting before its first task. The
warm fence is a child process that imports Ansible and the collection once. Per request it:

1. checks the run's extra vars against the play's input spec and derives `autoheal_run` with the
   same function as the play's first task (autoheal.cluster.runbook_inputs);
2. renders the fence task's arguments from the playbook itself (gpu_fatal_xid.yml, its one task
   that calls autoheal.cluster.fence), so the play stays the one definition of what a fence does;
3. runs the autoheal.cluster.fence module in a forked grandchild (a module exits the process), as
   Ansible runs a module file by hand: its arguments in a file named on its command line;
4. appends the `fenced` phase events to the run's events file, as the play's journal step does.

Everything it takes from the collection comes through one module of it,
plugins/plugin_utils/warm_fence.py, the only collection import outside the collection that the
layer contracts in pyproject.toml allow.

It renders the run's own inputs, so it also sends SIGTERM to the jobs of a full run of up to
WARM_SIGNAL_MAX_NODES nodes (a fence-only run, or a storm's big batch, signals none): the jobs
start their checkpoint at the fence, ~2 s before the play's fence step would have. It starts the
play's next task too, the requeue of each signalled job the moment it has left
(autoheal.cluster.slurm_jobs, rendered from the same playbook), in a detached process: a job that
checkpoints in half a second is requeued then, not when the play reaches that task ~3 s later,
and Slurm's credential wait (cred_expire) starts that much sooner. The play's own steps do the
same again; the run's signal ledger (`autoheal_signal_ledger`) makes each job signalled once and
requeued once, whichever process comes first, and lets the play report every job, even one that
has already left. A check mode run never comes here. Anything that goes wrong is reported, never
raised into the worker: the play fences, signals and requeues anyway, only later.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import selectors
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)
REQUEUE_LOG = "warm-requeue.json"  # the background requeue's result, beside the run's events
# The largest batch whose jobs the warm path signals (and requeues). A bigger batch is a storm:
# there the warm path fences only, as fast as it can, because the fence-only runs of the other
# nodes queue behind it (one request at a time per process); reading 100 nodes' opt-out labels
# and jobs took the storm's last cordon from ~6 s to 21 s (bench/storm.py; the opt-out read was a
# node read and a pod list per node then). The play's fence step signals them.
WARM_SIGNAL_MAX_NODES = 16
PLAYBOOK = "gpu_fatal_xid.yml"
READY = "ready"


@dataclass(frozen=True)
class WarmFenceResult:
    ok: bool
    seconds: float  # request to reply, as the worker saw it
    changed: bool = False
    error: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)


class _Child:
    """One warm fence process and its state; used by one request at a time."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.ready = False


class WarmFence:
    """The runner's handle on the warm fence processes: started once, each restarted if it dies,
    one request at a time per process (a fence takes ~0.2 s). There are `processes` of them, as
    many as the worker's fence-only runs at once (`max_concurrent_fences`): a storm's alerts reach
    the runner in a few webhook deliveries, so its held nodes go in two or three big batches, and
    with one process the second batch waited for the first (bench/storm.py --all-fail: 1,265
    nodes waited 4.9 s behind 720)."""

    def __init__(
        self, data_root: Path, timeout: float = 60.0, start_timeout: float = 60.0, processes: int = 1
    ) -> None:
        self.data_root = data_root
        self.timeout = timeout
        self.start_timeout = start_timeout
        self._children = [_Child() for _ in range(max(1, processes))]
        self._free: queue.Queue[_Child] = queue.Queue()
        for child in self._children:
            self._free.put(child)

    @property
    def processes(self) -> int:
        return len(self._children)

    def pids(self) -> list[int]:
        """The live warm fence processes (for status and tests)."""
        return [c.proc.pid for c in self._children if c.proc is not None and c.proc.poll() is None]

    def start(self) -> None:
        """Spawn the processes (each imports Ansible in the background; a first fence waits)."""
        for _ in self._children:
            child = self._free.get()
            try:
                self._spawn(child)
            finally:
                self._free.put(child)

    def _spawn(self, child: _Child) -> None:
        if child.proc is not None and child.proc.poll() is None:
            return
        child.proc = subprocess.Popen(
            [sys.executable, "-m", "remediation.warmfence", str(self.data_root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            start_new_session=True,  # a ^C to the runner is the runner's to handle
        )
        child.ready = False

    def _readline(self, out: IO[str], timeout: float) -> str:
        sel = selectors.DefaultSelector()
        sel.register(out, selectors.EVENT_READ)
        try:
            if not sel.select(timeout):
                raise TimeoutError(f"no answer in {timeout:.0f}s")
        finally:
            sel.close()
        line = out.readline()
        if not line:
            raise EOFError("the warm fence process ended")
        return line

    def fence(self, extravars: dict[str, Any]) -> WarmFenceResult:
        t0 = time.monotonic()
        child = self._free.get()  # a free process, or wait for one
        try:
            self._spawn(child)
            proc = child.proc
            assert proc is not None and proc.stdin is not None and proc.stdout is not None
            if not child.ready:
                line = self._readline(proc.stdout, self.start_timeout)
                if line.strip() != READY:
                    raise RuntimeError(f"warm fence did not start: {line.strip()[:300]}")
                child.ready = True
            proc.stdin.write(json.dumps(extravars) + "\n")
            proc.stdin.flush()
            reply = json.loads(self._readline(proc.stdout, self.timeout))
        except (OSError, ValueError, TimeoutError, EOFError, RuntimeError) as exc:
            self._kill(child)
            return WarmFenceResult(False, time.monotonic() - t0, error=str(exc))
        finally:
            self._free.put(child)
        return WarmFenceResult(
            ok=bool(reply.get("ok")),
            seconds=time.monotonic() - t0,
            changed=bool(reply.get("changed")),
            error=str(reply.get("error") or ""),
            events=list(reply.get("events") or []),
        )

    @staticmethod
    def _kill(child: _Child) -> None:
        proc, child.proc, child.ready = child.proc, None, False
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def close(self) -> None:
        for _ in self._children:
            child = self._free.get()  # waits for a request in flight to end
            proc, child.proc = child.proc, None
            if proc is not None:
                if proc.stdin is not None:
                    proc.stdin.close()  # the process ends at EOF
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        for child in self._children:
            self._free.put(child)


# ------------------------------------------------------------------ the process


def _tasks_calling(tasks: list[dict[str, Any]] | None, module: str) -> list[dict[str, Any]]:
    """Every task calling `module`, blocks included."""
    found: list[dict[str, Any]] = []
    for task in tasks or []:
        if module in task:
            found.append(task)
        for key in ("block", "rescue", "always"):
            found += _tasks_calling(task.get(key), module)
    return found


def _task_args(tasks: list[dict[str, Any]] | None, module: str, required: bool) -> Any:
    """The arguments of the play's one task calling `module`: found by the module it calls, never
    by its place in the play; two tasks calling it are refused (which one would the play mean?)."""
    found = _tasks_calling(tasks, module)
    if len(found) > 1:
        raise RuntimeError(f"{PLAYBOOK} has {len(found)} {module} tasks: the warm fence needs one")
    if not found:
        if required:
            raise RuntimeError(f"{PLAYBOOK} has no {module} task")
        return None
    return found[0][module]


class _Renderer:
    """The fence task of the playbook and the play's input spec, loaded once."""

    def __init__(self, data_root: Path) -> None:
        import yaml
        from ansible.parsing.dataloader import DataLoader
        from ansible.plugins.loader import init_plugin_loader

        init_plugin_loader([str(data_root / "collections")])  # the collection's imports need it
        # the collection's interface for the warm fence: the one module of it imported here
        from ansible_collections.autoheal.cluster.plugins.plugin_utils import warm_fence

        self.warm = warm_fence
        self.loader = DataLoader()
        self.playbook_dir = data_root / "playbooks"
        plays = self.loader.load_from_file(str(self.playbook_dir / PLAYBOOK), trusted_as_template=True)
        tasks = plays[0].get("tasks")
        self.task_args = _task_args(tasks, self.warm.FENCE_MODULE, required=True)
        # the requeue of the signalled jobs (the play runs it right after the fence)
        self.requeue_task = _task_args(tasks, self.warm.REQUEUE_MODULE, required=False)
        specs = yaml.safe_load((self.playbook_dir / "specs" / "inputs.yml").read_text())
        self.spec = specs[Path(PLAYBOOK).stem]

    def args(self, extravars: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the fence module's arguments, autoheal_run), as the play would have them."""
        from ansible.template import Templar

        given = {k: v for k, v in extravars.items() if k in self.spec}
        if len(given.get("autoheal_nodes") or []) > WARM_SIGNAL_MAX_NODES:
            given["autoheal_stop_after"] = "fenced"  # a storm's batch: fence only, signal nothing
        run: dict[str, Any] = self.warm.check_inputs(
            self.spec, given, os.getcwd(), str(self.playbook_dir), os.environ
        )
        rendered = Templar(loader=self.loader, variables={"autoheal_run": run}).template(self.task_args)
        return json.loads(json.dumps(rendered)), run

    def requeue_args(self, run: dict[str, Any], fence: dict[str, Any]) -> dict[str, Any] | None:
        """The requeue task's arguments after this fence, or None when it has nothing to do."""
        from ansible.template import Templar

        jobs = fence.get("jobs") or {}
        if self.requeue_task is None or not jobs.get("signalled_job_ids") or not run.get("signal_ledger"):
            return None
        variables = {"autoheal_run": run, "autoheal_fence": fence}
        rendered = Templar(loader=self.loader, variables=variables).template(self.requeue_task)
        args: dict[str, Any] = json.loads(json.dumps(rendered))
        return args if args.get("nodes") else None


def _module_main(fqcn: str, args: dict[str, Any], out_fd: int) -> None:
    """In a forked child: run module `fqcn` with `args`, its output on `out_fd`; never returns."""
    code = 1
    try:
        os.dup2(out_fd, 1)
        from ansible_collections.autoheal.cluster.plugins.plugin_utils.warm_fence import run_module

        code = run_module(fqcn, args)
    except BaseException:
        print(json.dumps({"failed": True, "msg": traceback.format_exc()[-2000:]}))
    finally:
        sys.stdout.flush()
        os._exit(code)


def _start_requeue(fqcn: str, args: dict[str, Any], log: Path) -> None:
    """Run the requeue module in a child of its own session (a restart of this process does not
    end it): it lives until its jobs have left, seconds to the grace period, and the server goes
    on at once. A thread reaps it, so no zombie is left to a PID 1 that does not reap (the
    runner is PID 1 in its pod)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            _module_main(fqcn, args, fd)
        finally:
            os._exit(1)
    threading.Thread(target=os.waitpid, args=(pid, 0), name=f"reap-{pid}", daemon=True).start()


def _run_module(fqcn: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The fence module's result: run in a forked child (a module ends its process)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: stdout is the pipe; never return into the server loop
        os.close(r)
        _module_main(fqcn, args, w)
    os.close(w)
    out = b""
    deadline = time.monotonic() + timeout
    with os.fdopen(r, "rb") as pipe:
        sel = selectors.DefaultSelector()
        sel.register(pipe, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(max(0.0, deadline - time.monotonic())):
                chunk = os.read(pipe.fileno(), 65536)
                if not chunk:
                    break
                out += chunk
        sel.close()
    timed_out = time.monotonic() >= deadline
    if timed_out:
        os.kill(pid, 9)
    os.waitpid(pid, 0)
    if timed_out:
        return {"failed": True, "msg": f"the fence module did not end in {timeout:.0f}s"}
    text = out.decode(errors="replace").strip()
    start = text.rfind("\n{")  # the module's JSON is the last thing it prints
    try:
        result: dict[str, Any] = json.loads(text[start + 1 :] if start >= 0 else text)
    except ValueError:
        return {"failed": True, "msg": f"unreadable module output: {text[-500:]}"}
    return result


def _serve(data_root: Path, timeout: float) -> None:
    renderer = _Renderer(data_root)  # first: it installs the collection loader the imports need
    warm = renderer.warm
    warm.import_modules()  # once, here: each forked child starts with them imported

    print(READY, flush=True)
    for line in sys.stdin:
        reply: dict[str, Any]
        try:
            extravars = json.loads(line)
            args, run = renderer.args(extravars)
            result = _run_module(warm.FENCE_MODULE, args, timeout)
            if result.get("failed"):
                reply = {"ok": False, "error": str(result.get("msg") or "the fence failed")[:2000]}
            else:
                events = warm.record_fenced(
                    run.get("journal_events") or "", result, run["incidents"], time.time()
                )
                requeue = renderer.requeue_args(run, result)
                if requeue is not None:
                    log_path = Path(run["signal_ledger"]).with_name(REQUEUE_LOG)
                    _start_requeue(warm.REQUEUE_MODULE, requeue, log_path)
                reply = {"ok": True, "changed": bool(result.get("changed")), "events": events}
        except Exception as exc:  # a bad request is answered, never the end of the process
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        print(json.dumps(reply, default=str), flush=True)


if __name__ == "__main__":
    try:
        _serve(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 60.0)
    except Exception as exc:
        print(f"error: {type(exc).__name__}: {exc}", flush=True)
        sys.exit(1)
