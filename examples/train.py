"""A small, checkpointing PyTorch training job: the ML researcher's side of the autoheal demo.

One rank per allocated node (srun), synchronised with torch.distributed over gloo, so it runs on
CPUs. It checkpoints every --ckpt-every steps and on SIGTERM (the grace period autoheal gives before
requeueing), and on start resumes from the newest valid checkpoint, logging the step it resumed
from. All ranks agree on stopping through an all-reduce, so a SIGTERM never leaves a rank waiting in
a collective. Progress goes to <ckpt-dir>/progress.jsonl for the demo's step-counter chart.

Time to the first step matters after a requeue (docs/operations.md, "Time to resume"): the `start`
record says where it went - `import_s` (importing torch: most of it, its CUDA libraries load even on
a CPU), `rendezvous_s` (the ranks meeting through a file on the checkpoint storage) and `load_s`
(building the model, reading and verifying the checkpoint). Nothing else is imported or read
before the first step. The update is plain SGD written out (`sgd_step`), not `torch.optim.SGD`:
constructing a torch.optim optimizer imports `torch._dynamo` (the compiler) the first time, which
took longer than importing torch itself (measured on the lab: 31.9 s vs 25.0 s on a loaded 2-core
machine), for an update this small job does not need it for.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

T_START = time.time()  # before torch: its import is most of a restart's start-up

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoint  # noqa: E402

T_IMPORTED = time.time()

log = logging.getLogger("train")
STOP = False


def _on_term(signum: int, frame: FrameType | None) -> None:
    global STOP
    STOP = True


def model_and_data(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 32, generator=g)
    true_w = torch.randn(32, 1, generator=g)
    y = x @ true_w + 0.01 * torch.randn(512, 1, generator=g)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    return model, x, y


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt-dir", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=10_000, help="Stop after this many steps.")
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--step-time", type=float, default=0.1, help="Seconds per step (pacing).")
    a = ap.parse_args(argv)

    rank = int(os.environ.get("SLURM_PROCID", "0"))
    world = int(os.environ.get("SLURM_NTASKS", "1"))
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    node = os.environ.get("SLURMD_NODENAME", "local")
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{rank}@{node} %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _on_term)
    if world > 1:
        dist.init_process_group(
            "gloo", init_method=_rendezvous(a.ckpt_dir, restart), rank=rank, world_size=world
        )
    t_met = time.time()

    model, x, y = model_and_data()
    lr = 0.01
    step = 0
    found = checkpoint.load_latest(a.ckpt_dir)
    if found:
        step, state = found
        model.load_state_dict(state["model"])
        # "optim" (plain SGD has no state) is kept in the checkpoint for the format's sake
        log.info("resumed from step %d (restart %d)", step, restart)
    else:
        log.info("no checkpoint: starting from step 0")
    progress = a.ckpt_dir / "progress.jsonl"
    a.ckpt_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        took = {
            "import_s": round(T_IMPORTED - T_START, 3),
            "rendezvous_s": round(t_met - T_IMPORTED, 3),
            "load_s": round(time.time() - t_met, 3),
        }
        _record(progress, {"event": "start", "step": step, "restart": restart, "node": node, **took})

    def save(reason: str) -> None:
        if rank == 0:
            checkpoint.save(a.ckpt_dir, step, {"model": model.state_dict(), "optim": {"lr": lr}})
            _record(progress, {"event": "checkpoint", "step": step, "reason": reason})
            log.info("checkpoint at step %d (%s)", step, reason)

    shard = slice(rank, None, world)
    while step < a.steps:
        t0 = time.monotonic()
        loss = nn.functional.mse_loss(model(x[shard]), y[shard])
        model.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        stop = torch.tensor([1.0 if STOP else 0.0])
        if world > 1:
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
                p.grad /= world
            dist.all_reduce(stop)  # everyone stops at the same step, or nobody does
        sgd_step(model, lr)
        step += 1
        if rank == 0 and found and step == found[0] + 1:
            _record(progress, {"event": "first_step", "step": step, "restart": restart})
        if rank == 0 and step % 10 == 0:
            _record(progress, {"event": "step", "step": step, "loss": round(loss.item(), 6)})
        if stop.item() > 0:
            save("sigterm")
            if world > 1:
                dist.barrier()
            log.info("stopping at step %d after SIGTERM", step)
            return 143  # ended by a signal, checkpoint safe: requeue me
        if step % a.ckpt_every == 0:
            save("periodic")
        time.sleep(max(0.0, a.step_time - (time.monotonic() - t0)))
    save("done")
    return 0


def sgd_step(model: nn.Module, lr: float) -> None:
    """p <- p - lr * grad: what torch.optim.SGD does without momentum, without its start-up."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)


def _rendezvous(ckpt_dir: Path, restart: int) -> str:
    """Where the ranks meet. MASTER_ADDR/MASTER_PORT win if set; otherwise a file on the shared
    checkpoint storage, unique per job and restart: no TCP port to collide with another job."""
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return "env://"
    cluster = os.environ.get("SLURM_CLUSTER_NAME", "local")
    job = os.environ.get("SLURM_JOB_ID", "0")
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    return f"file://{ckpt_dir / f'.rendezvous-{cluster}-{job}-{restart}'}"


def _record(path: Path, event: dict[str, object]) -> None:
    with path.open("a") as f:
        f.write(json.dumps({"ts": time.time(), **event}) + "\n")


if __name__ == "__main__":
    sys.exit(main())
