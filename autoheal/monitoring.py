"""Prometheus rules and Alertmanager routing, rendered from the XID and degraded-fault catalogues.

The lab, the shipped files under monitoring/ and the Pulumi GpuMonitoring component all call these
functions, so the rule that fires and the route that delivers are the same everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from autoheal.faults import (
    DEGRADED_ALERT,
    FAULT_LABEL,
    THROTTLE_BITS,
    Detector,
    FaultCatalog,
    FaultClass,
    FaultEntry,
    load_fault_catalog,
)
from autoheal.xid import Tier, XidCatalog, load_catalog

XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
FATAL_ALERT = "GpuXidFatal"
NVSWITCH_ALERT = "NvSwitchSxidFatal"  # the XID watcher's fatal SXIDs (routed to humans, not the runner)
WEBHOOK_RECEIVER = "autoheal-runner"
# Who saw the fault: every GpuXidFatal carries one. Same alertname and node, so Alertmanager groups
# the sources of one fault into one notification and the runner makes them one incident.
SOURCE_LABEL = "source"
SOURCE_METRIC = "dcgm"  # the XID gauge of dcgm-exporter
SOURCE_LOST = "lost-gpu"  # the GPU stopped reporting (lost_gpu_expr)
SOURCE_WATCHER = "watcher"  # the node-local kernel log watcher (watcher/)
SOURCE_JOB = "job"  # the training job's own metrics (a straggler's step time)
# the watcher's alerts carry the driver's kernel record as logged (sanitised, autoheal.xid_messages
# MAX_LINE), which the runner keeps with the incident for the vendor's evidence bundle
KERNEL_LINE_ANNOTATION = "kernel_line"
LOST_GPU_XID = 79  # a GPU that stops reporting has, for remediation, fallen off the bus
LOST_GPU_WINDOW = "10m"  # how long a vanished GPU series is remembered (and its alert fires)


def xid_expr(xids: Iterable[int], metric: str = XID_METRIC) -> str:
    """A PromQL selector matching any of `xids` (a regex matcher would need label values; the
    gauge holds the XID as its value, so value comparisons are what works). Consecutive XIDs are
    one range: every `or` selects the gauge's series again, and one `==` per XID made the rule
    group cost ~360 ms of a core per 1 s evaluation with 5 nodes (the lab's busiest process),
    which grows with every GPU of a fleet."""
    return " or ".join(
        f"{metric} == {lo}" if lo == hi else f"({metric} >= {lo} <= {hi})" for lo, hi in xid_ranges(xids)
    )


def xid_ranges(xids: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted XIDs as runs of consecutive integers: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    runs: list[tuple[int, int]] = []
    for x in sorted(set(xids)):
        if runs and x == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], x)
        else:
            runs.append((x, x))
    return runs


def lost_gpu_expr(metric: str = XID_METRIC, window: str = LOST_GPU_WINDOW) -> str:
    """A GPU series seen within `window` that is gone now, on a node that still reports GPUs.

    dcgm-exporter drops the series of a GPU that fell off the bus (DCGM lost it), often before the
    XID 79 sample is ever scraped. The second clause keeps the rule quiet when the whole node is
    gone: a retired or deleted node (its exporter is gone), or a failed scrape (every series of the
    target goes stale at once). Limit: a node whose GPUs all vanish while it lives looks the same
    as a node that is gone; the kernel-log watcher covers that case."""
    return (
        f"(last_over_time({metric}[{window}]) unless {metric})"
        f" and on (Hostname) group by (Hostname) ({metric})"
    )


def render_xid_rules(catalog: XidCatalog | None = None, for_: str = "0s") -> dict[str, Any]:
    """Two rule groups: one GpuXidFatal rule per acting rung (an unknown XID: quarantine), labelled
    with tier and the XID (source dcgm), and the lost-GPU rule (source lost-gpu), a fatal fault on
    the GPU that stopped reporting, named XID 79 because that is what a GPU vanishing from the bus is."""
    cat = catalog or load_catalog()
    rules: list[dict[str, Any]] = []
    acting = [t for t in reversed(Tier) if t is not Tier.NOTIFY]
    exprs = {t: xid_expr(cat.xids_of(t)) for t in acting if cat.xids_of(t)}
    # an XID the catalogue does not know fails safe (quarantine), never silence
    known = xid_expr(e.xid for e in cat.xids)
    unknown = f"{XID_METRIC} > 0 unless ({known})"
    listed = exprs.get(Tier.QUARANTINE)
    exprs[Tier.QUARANTINE] = f"{listed} or ({unknown})" if listed else unknown
    for tier, expr in exprs.items():
        rules.append(
            {
                "alert": FATAL_ALERT,
                "expr": expr,
                "for": for_,
                "labels": {
                    "severity": "critical",
                    "tier": tier.value,
                    # the gauge's value is the XID; alert labels are templated, so it becomes a label
                    "xid": "{{ $value }}",
                    SOURCE_LABEL: SOURCE_METRIC,
                },
                "annotations": {
                    "summary": "Fatal XID {{ $value }} on {{ $labels.Hostname }} GPU {{ $labels.gpu }}",
                    "catalog_version": str(cat.version),
                },
            }
        )
    lost = {
        "alert": FATAL_ALERT,
        "expr": lost_gpu_expr(),
        "for": for_,
        "labels": {
            "severity": "critical",
            "tier": cat.tier_of(LOST_GPU_XID).value,
            "xid": str(LOST_GPU_XID),
            SOURCE_LABEL: SOURCE_LOST,
        },
        "annotations": {
            "summary": (
                "GPU {{ $labels.gpu }} of {{ $labels.Hostname }} stopped reporting (treated as XID 79)"
            ),
            "catalog_version": str(cat.version),
        },
    }
    return {
        "groups": [
            {"name": "autoheal-xid", "rules": rules},
            {"name": "autoheal-lost-gpu", "rules": [lost]},
        ]
    }


def throttle_expr(metric: str, reasons: Iterable[str]) -> str:
    """Series of `metric` (a bitmask: NVML's clock throttle reasons) with any of `reasons` set.
    PromQL has no bitwise and: bit b is set when floor(x / b) is odd."""
    bits = sorted({THROTTLE_BITS[r] for r in reasons})
    return " or ".join(f"(floor({metric} / {b}) % 2 == 1)" for b in bits)


def straggler_expr(metric: str, margin_percent: float, min_ranks: int) -> str:
    """Ranks whose step time is above their job's median by the margin, in jobs of at least
    `min_ranks` ranks (with two, the median is their mean and says little about who is slow)."""
    factor = f"{1 + margin_percent / 100:g}"
    return (
        f"({metric} > on (slurm_job) group_left () ({factor} * quantile by (slurm_job) (0.5, {metric})))"
        f" and on (slurm_job) (count by (slurm_job) ({metric}) >= {min_ranks})"
    )


def _degraded_expr(f: FaultEntry) -> str:
    assert f.metric is not None  # the catalogue refuses a prometheus fault without one
    if f.name is FaultClass.GPU_THROTTLE:
        return throttle_expr(f.metric, f.reasons)
    if f.name is FaultClass.STRAGGLER:
        assert f.margin_percent is not None
        return straggler_expr(f.metric, f.margin_percent, f.min_ranks)
    return f"{f.metric} >= {f.threshold}"


def render_degraded_rules(catalog: FaultCatalog | None = None) -> dict[str, Any]:
    """One NodeDegraded rule per fault class the catalogue detects from metrics (DCGM's throttle
    reasons and row remapping, the training job's step time), held for its `sustain_seconds`,
    labelled with the class, its rung and who saw it. The classes the watcher reads from sysfs
    arrive from the watcher with the same alertname and labels."""
    cat = catalog or load_fault_catalog()
    rules = []
    for f in cat.by_detector(Detector.PROMETHEUS):
        source = SOURCE_JOB if f.name is FaultClass.STRAGGLER else SOURCE_METRIC
        rules.append(
            {
                "alert": DEGRADED_ALERT,
                "expr": _degraded_expr(f),
                "for": f"{f.sustain_seconds}s",
                "labels": {
                    "severity": "warning",
                    "tier": f.tier.value,
                    FAULT_LABEL: f.name.value,
                    SOURCE_LABEL: source,
                },
                "annotations": {
                    "summary": f"{f.name.value} on {{{{ $labels.Hostname }}}}: {f.meaning}",
                    "fault_catalog_version": str(cat.version),
                },
            }
        )
    return {"groups": [{"name": "autoheal-degraded", "rules": rules}]}


def render_alertmanager_config(
    webhook_url: str,
    token_file: str,
    group_wait: str = "0s",
    group_interval: str = "1s",
    repeat_interval: str = "1h",
) -> dict[str, Any]:
    """Route GPU XID and degraded-node alerts to the runner, grouped per node (and alertname) so a
    storm becomes per-node webhooks."""
    return {
        "route": {
            "receiver": "null",
            "group_by": ["alertname", "Hostname"],
            "routes": [
                {
                    "receiver": WEBHOOK_RECEIVER,
                    "matchers": [f'alertname=~"{FATAL_ALERT}|{DEGRADED_ALERT}"'],
                    "group_by": ["alertname", "Hostname"],
                    "group_wait": group_wait,
                    "group_interval": group_interval,
                    "repeat_interval": repeat_interval,
                }
            ],
        },
        "receivers": [
            {"name": "null"},
            {
                "name": WEBHOOK_RECEIVER,
                "webhook_configs": [
                    {
                        "url": webhook_url,
                        "send_resolved": True,
                        "max_alerts": 0,
                        "http_config": {"authorization": {"type": "Bearer", "credentials_file": token_file}},
                    }
                ],
            },
        ],
    }


def render_prometheus_config(
    rule_files: list[str],
    scrape_targets: list[str],
    alertmanager: str,
    interval: str = "1s",
) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": rule_files,
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [
            {"job_name": "dcgm", "static_configs": [{"targets": scrape_targets}]},
        ],
    }


# What the project ships under monitoring/ (for users who run their own Prometheus/Alertmanager).
SHIPPED_RUNNER_URL = "http://autoheal-runner.autoheal.svc:8080/webhook"
SHIPPED_TOKEN_FILE = "/etc/alertmanager/secrets/autoheal-runner-token/token"  # noqa: S105 - a path


def shipped_files() -> dict[str, dict[str, Any]]:
    """monitoring/<file> -> content; tests/unit/test_monitoring.py fails if the files drift."""
    return {
        "xid.rules.yml": render_xid_rules(),
        "degraded.rules.yml": render_degraded_rules(),
        "alertmanager.yml": render_alertmanager_config(
            SHIPPED_RUNNER_URL, SHIPPED_TOKEN_FILE, group_wait="0s", group_interval="5s"
        ),
        "prometheus.yml": render_prometheus_config(
            ["xid.rules.yml", "degraded.rules.yml"],
            ["dcgm-exporter.gpu-monitoring.svc:9400"],
            "alertmanager:9093",
            interval="5s",
        ),
    }


def render_shipped(out_dir: str) -> list[str]:
    import pathlib

    import yaml

    d = pathlib.Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in shipped_files().items():
        source = "fault_catalog.yaml" if name == "degraded.rules.yml" else "xid_catalog.yaml"
        header = f"# Generated from autoheal/data/{source} by `autoheal monitoring render`.\n"
        (d / name).write_text(header + yaml.safe_dump(content, sort_keys=False))
        written.append(str(d / name))
    return written
