"""Hostile input at volume (issue 17, Deliver 5): N generated webhook payloads (default 10,000),
each carrying at least one hostile value where the runner reads a fact (node name, XID, GPU,
fingerprint) or a hostile shape, POSTed to the runner's real app (in-process, journal on disk,
worker running with the stub-free shipped playbooks dir so that any admitted incident would be
visible as a run). Pass: no 5xx, no incident opened, no run started. Prints the counts by status.

    python -m bench.hostile [--count 10000] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from starlette.testclient import TestClient

from autoheal.paths import data_root
from remediation.app import create_app
from remediation.config import parse_config
from remediation.kubeview import FakeKube
from remediation.runtime import build

TOKEN = "bench-hostile-token-0123456789abcdef"
HOSTILE = [
    "gpu-1\n",
    "gpu-1\r\n",
    " gpu-1",
    "gpu-1 ",
    "GPU-1",
    "gpu_1",
    "-gpu",
    "gpu-",
    "",
    "a" * 254,
    "{{ lookup('pipe','id') }}",
    "$(id)",
    "`id`",
    "'; DROP TABLE incidents; --",
    "../../etc/shadow",
    "gpu-1;reboot",
    "gpu-1\x00",
    "\uff47\uff50\uff55-1",
    "gpu-1\u200b",
    "gpu\u20131",
    "{% raw %}",
    "gpu-1\nX-Injected: 1",
    "*",
    "gpu-[1-9]",
    "localhost,gpu-2",
]
HOSTILE_INT = ["79\n", " 79", "\u0667\u0669", "-1", "1e3", "0x4f", "79.0", "", "9" * 400, "NaN"]
RULES = [
    {
        "name": "bench",
        "hosts": "all",
        "rules": [
            {
                "name": "GPU fatal XID",
                "condition": 'event.alert.labels.alertname == "GpuXidFatal"',
                "action": {
                    "run_playbook": {
                        "name": "playbooks/gpu_fatal_xid.yml",
                        "extra_vars": {"autoheal_routing": {"node_labels": ["Hostname"]}},
                    }
                },
            }
        ],
    }
]


def hostile_alert(rng: random.Random) -> dict[str, Any]:
    labels = {"alertname": "GpuXidFatal", "Hostname": "gpu-1", "xid": "79", "gpu": "0"}
    which = rng.choice(["node", "xid", "node+xid", "shape"])
    if "node" in which:
        labels["Hostname"] = rng.choice(HOSTILE)
    if "xid" in which:
        labels["xid"] = rng.choice(HOSTILE_INT)
    alert: dict[str, Any] = {
        "status": "firing",
        "labels": labels,
        "annotations": {"summary": rng.choice(HOSTILE)},
        "startsAt": "2026-11-30T03:46:01.103Z",
        "fingerprint": format(rng.getrandbits(60), "x"),
    }
    if which == "shape":  # a hostile shape: the node label is the wrong type or the body lies
        labels["Hostname"] = "gpu-1"
        broken = rng.choice(["labels", "fingerprint", "startsAt", "status", "extra"])
        if broken == "labels":
            alert["labels"] = {**labels, "Hostname": rng.choice([1, None, ["gpu-1"], {"a": "b"}])}
        elif broken == "fingerprint":
            alert["fingerprint"] = rng.choice(["", "zz", "f" * 33, "0a\n"])
        elif broken == "startsAt":
            alert["startsAt"] = rng.choice(["yesterday", "", "2026-13-45T00:00:00Z"])
        elif broken == "status":
            alert["status"] = rng.choice(["FIRING", "firing\n", None])
        else:
            alert["labels"] = {**labels, **{f"l{i}": "x" for i in range(80)}}  # over MAX_LABELS
    return alert


def payload(rng: random.Random) -> dict[str, Any]:
    return {
        "version": "4",
        "status": "firing",
        "receiver": "autoheal",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager",
        "alerts": [hostile_alert(rng) for _ in range(rng.randint(1, 3))],
    }


def run(count: int, seed: int, work: Path) -> dict[str, Any]:
    (work / "token").write_text(TOKEN + "\n")
    (work / "rules.yaml").write_text(yaml.safe_dump(RULES))
    data = {
        "listen_port": 0,
        "token_file": "token",
        "journal_path": "journal.sqlite",
        "rules_file": "rules.yaml",
        "state_dir": "state",
        "playbook_dir": str(data_root() / "playbooks"),
        "batch_window_seconds": 0.05,
        "poll_seconds": 0.1,
    }
    cfg = parse_config(data, str(work / "runner.yaml"), work, env={})
    rt = build(cfg, kube=FakeKube({"gpu-1": {"autoheal.io/pool": "h100"}}), with_worker=True)
    assert rt.worker is not None  # the app's lifespan starts it
    rng = random.Random(seed)
    codes: Counter[int] = Counter()
    started = time.monotonic()
    try:
        with TestClient(create_app(rt)) as client:
            for _ in range(count):
                body = payload(rng)
                r = client.post(
                    "/webhook", content=json.dumps(body), headers={"Authorization": f"Bearer {TOKEN}"}
                )
                codes[r.status_code] += 1
        time.sleep(1.0)  # a tick or ten for the worker to act on anything that got through
        incidents = len(rt.journal.incidents())
        runs = len(rt.journal.runs())
    finally:
        rt.journal.close()
    return {
        "payloads": count,
        "seconds": round(time.monotonic() - started, 1),
        "codes": dict(sorted(codes.items())),
        "5xx": sum(n for c, n in codes.items() if c >= 500),
        "incidents": incidents,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--count", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="autoheal-hostile-") as tmp:
        result = run(args.count, args.seed, Path(tmp))
    print(json.dumps(result, indent=2))
    ok = result["5xx"] == 0 and result["incidents"] == 0 and result["runs"] == 0
    print("PASS" if ok else "FAIL: a hostile payload got a 5xx, opened an incident or started a run")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
