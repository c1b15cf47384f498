"""The runner's Grafana dashboard, as code (the Grafana Foundation SDK's builders), rendered to
JSON by `autoheal dashboard --out FILE`.

Every panel reads the runner's own metrics (remediation/metrics.py): incidents by state and fault
class and by phase reached, receipt -> fenced and fault -> job resumed, hot spares per pool, the
circuit breaker and the budget, GPU-hours lost and effective training time, and the job owners'
notices. The queries are plain PromQL without Grafana's own variables, so a test evaluates each
one against a real Prometheus (tests/e2e/test_demo.py). The data source is the dashboard's
`datasource` variable (any Prometheus that scrapes the runner's /metrics).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

UID = "autoheal-runner"
TITLE = "autoheal: faults, remediation and what they cost"


@dataclass(frozen=True)
class PanelSpec:
    title: str
    kind: str  # stat | timeseries | bargauge
    unit: str
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    description: str
    buckets: bool = False  # a histogram's cumulative buckets, shown per bucket (format heatmap)
    needs: str = ""  # a runner feature the panel's data needs, if not every runner has it on


FENCED = 'autoheal_incident_phase_duration_seconds_bucket{phase="fenced"}'
PANELS: tuple[PanelSpec, ...] = (
    PanelSpec(
        "Incidents by state and fault class",
        "bargauge",
        "short",
        (("sum by (state, fault_class) (autoheal_incidents_recent)", "{{state}} {{fault_class}}"),),
        "The journal's recent incidents (newest 1000) by state and fault class.",
    ),
    PanelSpec(
        "Incidents by phase reached",
        "timeseries",
        "short",
        (("sum by (phase) (autoheal_incident_phase_duration_seconds_count)", "{{phase}}"),),
        "How many incidents reached each phase of the runbook (fenced, requeued, drained, ...).",
    ),
    PanelSpec(
        "Receipt -> fenced",
        "bargauge",
        "short",
        ((f"sum by (le) ({FENCED})", "<= {{le}} s"),),
        "Incidents fenced within each bound (seconds from the alert's receipt).",
        buckets=True,
    ),
    PanelSpec(
        "Receipt -> fenced, median and p95",
        "stat",
        "s",
        (
            (f"histogram_quantile(0.5, sum by (le) ({FENCED}))", "median"),
            (f"histogram_quantile(0.95, sum by (le) ({FENCED}))", "p95"),
        ),
        "Quantiles of the time from an alert's receipt to its node fenced.",
    ),
    PanelSpec(
        "Fault -> job resumed",
        "bargauge",
        "short",
        (("sum by (le) (autoheal_job_resume_seconds_bucket)", "<= {{le}} s"),),
        "Jobs back at their first training step within each bound (seconds from the fault).",
        buckets=True,
    ),
    PanelSpec(
        "Fault -> job resumed, median and p95",
        "stat",
        "s",
        (
            ("histogram_quantile(0.5, sum by (le) (autoheal_job_resume_seconds_bucket))", "median"),
            ("histogram_quantile(0.95, sum by (le) (autoheal_job_resume_seconds_bucket))", "p95"),
        ),
        "Quantiles of the time from a fault to its job's first step after the resume.",
    ),
    PanelSpec(
        "Hot spares per pool",
        "timeseries",
        "short",
        (
            ("sum by (pool) (autoheal_pool_spares)", "{{pool}} spares"),
            ("sum by (pool) (autoheal_pool_spares_declared)", "{{pool}} declared"),
        ),
        "Hot spares each pool has (the spare keeper's count) against what it declares.",
        needs="spare_keeper",
    ),
    PanelSpec(
        "Circuit breaker, pause and node budget",
        "timeseries",
        "short",
        (
            ("max(autoheal_circuit_breaker_open)", "breaker open"),
            ("max(autoheal_paused)", "paused"),
            ("max(autoheal_budget_nodes_in_use)", "nodes in remediation"),
            ("max(autoheal_budget_nodes_limit)", "node budget"),
        ),
        "1 while the breaker is open or the runner paused; nodes in remediation against the budget.",
    ),
    PanelSpec(
        "GPU-hours lost",
        "stat",
        "short",
        (("sum by (pool, fault_class) (autoheal_gpu_hours_lost_total)", "{{pool}} {{fault_class}}"),),
        "GPUs x (fault -> first step after resume) + the work recomputed since the checkpoint,"
        " summed over the jobs faults hit (since the runner started).",
    ),
    PanelSpec(
        "Effective training time",
        "stat",
        "percentunit",
        (("min by (pool) (autoheal_effective_training_ratio)", "{{pool}}"),),
        "Per pool over the runner's cost window: 1 - GPU-hours lost / (the pool's GPUs x window).",
    ),
    PanelSpec(
        "Job owners told",
        "bargauge",
        "short",
        (("sum by (kind, outcome) (autoheal_owner_notices_total)", "{{kind}} {{outcome}}"),),
        "Notices to the owners of jobs a fault hit: hit, resumed, waiting; sent, on_call, failed.",
    ),
)


def queries() -> list[tuple[str, str, str]]:
    """(panel title, PromQL, what the panel needs) for every query of the dashboard."""
    return [(p.title, q, p.needs) for p in PANELS for q, _legend in p.queries]


def build() -> dict[str, Any]:
    """The dashboard model, as Grafana imports it."""
    from grafana_foundation_sdk.builders import bargauge, dashboard, prometheus, stat, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import DataSourceRef
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

    source = DataSourceRef(type_val="prometheus", uid="${datasource}")
    board = (
        dashboard.Dashboard(TITLE)
        .uid(UID)
        .tags(["autoheal", "gpu", "slurm"])
        .refresh("30s")
        .time("now-6h", "now")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    )
    makers: dict[str, Callable[[], Any]] = {
        "stat": stat.Panel,
        "timeseries": timeseries.Panel,
        "bargauge": bargauge.Panel,
    }
    for spec in PANELS:
        panel = makers[spec.kind]().title(spec.title).description(spec.description).unit(spec.unit)
        panel = panel.datasource(source).height(8).span(8)
        for n, (expr, legend) in enumerate(spec.queries):
            q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + n))
            if spec.buckets:
                q = q.format(PromQueryFormat.HEATMAP).instant()
            panel = panel.with_target(q.datasource(source))
        board = board.with_panel(panel)
    return dict(json.loads(JSONEncoder(sort_keys=True, indent=2).encode(board.build())))


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"
