"""How long the lab's control plane takes to bring N KWOK GPU nodes to Ready, and what it costs.

Starts etcd, kube-apiserver, controller manager, scheduler and KWOK in a temporary dir, adds N
GPU nodes (default 2000), and prints: time to every service healthy, time to create the nodes,
time until all are Ready, then the resident memory (RSS) of each process after a short settle.
Everything is stopped at the end, also on error or Ctrl-C.

    .venv/bin/python bench/kube_scale.py [--nodes 2000] [--port-base 28600] [--settle 10]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from autoheal.labels import GPU_PRODUCT_LABEL, POOL_LABEL
from lab import controlplane


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--port-base", type=int, default=28600)
    ap.add_argument("--settle", type=float, default=10.0, help="seconds before measuring RSS")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", action="store_true", help="also print one JSON line of figures")
    args = ap.parse_args()

    specs = [
        controlplane.KubeNodeSpec(
            f"gpu-{i:05d}",
            labels={POOL_LABEL: f"pool-{i % 8}", GPU_PRODUCT_LABEL: "H100"},
            taints=[],
        )
        for i in range(args.nodes)
    ]
    with tempfile.TemporaryDirectory(prefix="kube-scale-") as tmp:
        run_dir = Path(tmp)
        try:
            t0 = time.monotonic()
            handle = controlplane.start_control_plane(run_dir, [], args.port_base, timeout=args.timeout)
            t_services = time.monotonic() - t0

            t1 = time.monotonic()
            # Creation and readiness are timed apart.
            controlplane.create_nodes(handle.kubeconfig, specs, workers=16)
            t_create = time.monotonic() - t1
            controlplane.wait_nodes_ready(handle.kubeconfig, [s.name for s in specs], timeout=args.timeout)
            t_ready = time.monotonic() - t1
            total = time.monotonic() - t0

            time.sleep(args.settle)
            rss = {svc: round(rss_mib(pid), 1) for svc, pid in handle.pids.items()}
            status = controlplane.control_plane_status(run_dir)

            print(f"nodes:                        {args.nodes}")
            print(f"services healthy:             {t_services:6.1f} s")
            print(f"nodes created:                {t_create:6.1f} s")
            print(f"nodes Ready (from creation):  {t_ready:6.1f} s")
            print(f"total start to all Ready:     {total:6.1f} s")
            print(f"RSS after {args.settle:.0f} s settle (MiB):")
            for svc, mib in rss.items():
                print(f"  {svc:26s} {mib:8.1f}")
            print(f"  {'total':26s} {sum(rss.values()):8.1f}")
            print(f"all healthy:                  {all(status.values())}")
            if args.json:
                print(
                    json.dumps(
                        {
                            "nodes": args.nodes,
                            "services_s": round(t_services, 2),
                            "create_s": round(t_create, 2),
                            "ready_s": round(t_ready, 2),
                            "total_s": round(total, 2),
                            "rss_mib": rss,
                        }
                    )
                )
        finally:
            t_stop = time.monotonic()
            controlplane.stop_control_plane(run_dir)
            print(f"stopped in {time.monotonic() - t_stop:.1f} s")


if __name__ == "__main__":
    main()
