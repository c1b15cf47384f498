"""The lab's side of the recovery ladder: what a node's GPUs and its cloud do when the runbook
resets a GPU, reboots a node or validates it (docs/runbook.md, "The recovery ladder").

In production these are `nvidia-smi --gpu-reset` on the node, the provider's reboot API and DCGM
diagnostics; in the lab the simulator plays the GPUs (reset clears a GPU's XID, a reboot the
node's) and a reboot also restarts the node's slurmd, as a real reboot does. The node_pool and
ladder roles reach these through `autoheal lab pool reset|reboot|health`.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from autoheal.backoff import Backoff
from autoheal.errors import LabError
from lab import procs, slurm, watch
from lab.config import LabConfig

# A reboot longer than this is a hang: the CLI fails and the play escalates.
REBOOT_TIMEOUT = 120.0
BATCH_WORKERS = 16  # calls in flight for a batch (a storm's 100 nodes)
CALL_ATTEMPTS = 3  # a call whose connection the simulator dropped is tried again
# 0.2 s, then 0.4 s between the tries; shared by the batch's threads (call() counts per call)
CALL_RETRY = Backoff(base=0.2, cap=0.4, jitter=0.0, tries=CALL_ATTEMPTS)


def _post(cfg: LabConfig, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One call to the simulator. A connection it dropped is tried again (its operations are
    idempotent: a reset or reboot of a clean GPU changes nothing); what still fails is this node's
    LabError, so a batch's other nodes go on."""

    def once() -> httpx.Response:
        try:
            return httpx.post(cfg.url("simulator", path), json=body, timeout=timeout)
        except httpx.TimeoutException as exc:  # a TransportError too, but a hang is not retried
            raise LabError(f"simulator {path}: no answer within {timeout:.0f}s (hung)") from exc

    try:
        r = CALL_RETRY.call(once, (httpx.TransportError,))
    except httpx.TransportError as exc:
        raise LabError(f"simulator {path}: {type(exc).__name__}: {exc} ({CALL_ATTEMPTS} tries)") from exc
    data: dict[str, Any] = r.json()
    if r.status_code != 200:
        raise LabError(f"simulator {path}: {data.get('error', r.text)}")
    return data


def health(cfg: LabConfig, node: str, peek: bool = False) -> dict[str, Any]:
    """The lab's DCGM diagnostics for `node`, plus where its evidence lives (kernel log, metrics);
    `peek` only reads the GPUs (for the evidence bundle), it runs no check."""
    data = _post(cfg, "/v1/health", {"node": node, "peek": peek}, timeout=30)
    data["kmsg"] = str(watch.kmsg_dir(cfg) / node / "kmsg")
    data["metrics_url"] = cfg.url("simulator", "/metrics")
    return data


def reset(cfg: LabConfig, node: str, gpu: int | None, timeout: float) -> dict[str, Any]:
    """Reset a GPU of `node` (all of them when `gpu` is None)."""
    return _post(cfg, "/v1/reset", {"node": node, "gpu": gpu}, timeout=timeout)


def reboot(cfg: LabConfig, node: str, timeout: float = REBOOT_TIMEOUT) -> dict[str, Any]:
    """Reboot `node` as its cloud would: slurmd goes away, the GPUs come back clean, slurmd starts
    and registers again. The Slurm state and reason the runbook set are kept (it returns the node)."""
    if cfg.pods:
        res = reboot_many(cfg, [node], timeout)[node]
        if isinstance(res, Exception):
            raise res
        return dict(res)
    t0 = time.monotonic()
    procs.stop(cfg.run_dir, slurm.slurmd_name(node))
    _post(cfg, "/v1/reboot", {"node": node}, timeout=timeout)
    slurm.start_slurmd(cfg, [node])
    left = max(5.0, timeout - (time.monotonic() - t0))
    slurm.wait_nodes_registered(cfg, [node], timeout=left)
    return {"node": node, "rebooted": True, "seconds": round(time.monotonic() - t0, 3)}


def reboot_many(cfg: LabConfig, nodes: list[str], timeout: float = REBOOT_TIMEOUT) -> dict[str, Any]:
    """Reboot a batch at once, as a cloud's API would take the calls: every slurmd stopped, the
    reboots posted side by side, the slurmds started and waited for together (one Slurm poll for
    the batch, not one per node). Returns {node: result, or the LabError that failed it}."""
    t0 = time.monotonic()
    if cfg.pods:
        return _reboot_real(cfg, nodes, timeout)
    procs.stop_many(cfg.run_dir, [slurm.slurmd_name(n) for n in nodes])
    out: dict[str, Any] = _gpu_reboots(cfg, nodes, timeout)
    back = [n for n in nodes if n not in out]
    if back:
        slurm.start_slurmd(cfg, back)
        try:
            slurm.wait_nodes_registered(cfg, back, timeout=max(5.0, timeout - (time.monotonic() - t0)))
        except LabError as exc:
            states = slurm.node_states(cfg)
            bad = {"NOT_RESPONDING", "UNKNOWN", "INVAL", "FUTURE"}
            for n in back:
                if n not in states or set(states[n]["state"]) & bad:
                    out[n] = exc
    return _rebooted(out, nodes, t0)


def _gpu_reboots(cfg: LabConfig, nodes: list[str], timeout: float) -> dict[str, Any]:
    """The simulator's reboots of the batch's GPUs, side by side: {node: the LabError} for each
    that hung or failed (that node stays down, as it would)."""
    failed: dict[str, Any] = {}
    with ThreadPoolExecutor(max(1, min(BATCH_WORKERS, len(nodes)))) as pool:
        posted = {n: pool.submit(_post, cfg, "/v1/reboot", {"node": n}, timeout) for n in nodes}
    for n, fut in posted.items():
        try:
            fut.result()
        except LabError as exc:
            failed[n] = exc
    return failed


def _rebooted(out: dict[str, Any], nodes: list[str], t0: float) -> dict[str, Any]:
    """`out` with a success record for every node it has no error for."""
    seconds = round(time.monotonic() - t0, 3)
    for n in nodes:
        out.setdefault(n, {"node": n, "rebooted": True, "seconds": seconds})
    return out


def _reboot_real(cfg: LabConfig, nodes: list[str], timeout: float) -> dict[str, Any]:
    """A pods lab: the GPUs come back clean (the simulator's reboot), then the real nodes restart
    and their slurmd pods register again (lab.nodepods.reboot)."""
    from lab import nodepods

    t0 = time.monotonic()
    out = _gpu_reboots(cfg, nodes, timeout)
    back = [n for n in nodes if n not in out]
    if back:
        left = max(5.0, timeout - (time.monotonic() - t0))
        for n, err in nodepods.reboot(cfg, back, left).items():
            if err is not None:
                out[n] = err
    return _rebooted(out, nodes, t0)


OPERATIONS = ("health", "reset", "reboot", "faults")  # what batch() runs (the pool API's /v1/ladder/<op>)


def _item(node: str, res: object, what: str) -> dict[str, Any]:
    """One node's result of a batch, shaped as one item of an Ansible loop of single calls."""
    if isinstance(res, Exception):
        return {"item": node, "rc": 1, "stdout": "", "stderr": f"{what} {node}: {res}"}
    return {"item": node, "rc": 0, "stdout": json.dumps(res), "stderr": ""}


def batch(cfg: LabConfig, what: str, nodes: list[str], **kw: Any) -> list[dict[str, Any]]:
    """Run one operation for a batch at once and return one result per node, shaped like the
    results of an Ansible loop of single calls ({item, rc, stdout, stderr}; the filter
    autoheal.cluster.batch_results reads it): a storm's batch costs one call, not one per node,
    and its reboots overlap as a cloud's would. One node failing (even a bug) hides no other."""
    if what not in OPERATIONS:
        raise LabError(f"ladder: unknown operation {what!r} (one of {', '.join(OPERATIONS)})")
    if what == "reboot":  # the batch's slurmds stop, start and register together
        done = reboot_many(cfg, nodes, **kw)
        return [_item(n, done[n], what) for n in nodes]
    op = globals()[what]

    def one(n: str) -> dict[str, Any]:
        try:
            return _item(n, op(cfg, n, **kw), what)
        except Exception as exc:
            return _item(n, exc, what)

    with ThreadPoolExecutor(max(1, min(BATCH_WORKERS, len(nodes)))) as pool:
        return list(pool.map(one, nodes))


def faults(cfg: LabConfig, node: str, **kw: Any) -> dict[str, Any]:
    """Inject faults of the ladder itself (failing health checks, a failing or hanging reset)."""
    return _post(cfg, "/v1/faults", {"node": node, **{k: v for k, v in kw.items() if v is not None}}, 10)
