"""Driver events -> Alertmanager alerts with the labels the Prometheus rules give theirs.

A fatal XID becomes `GpuXidFatal` with `severity`, `tier` and `xid` as the rule sets them and the
GPU's `gpu`, `UUID` and `Hostname` as dcgm-exporter labels its series, plus `source="watcher"`.
Alertmanager's route, grouping (alertname, Hostname), silences and inhibitions therefore treat it
like the rule's alert, and the runner's rules (config/rules.yaml) route both to one incident.
The kernel record itself travels as the `kernel_line` annotation (sanitised, at most MAX_LINE
characters): the runner keeps it with the incident for the vendor's evidence bundle.

Only what the catalogue puts in an acting tier is posted (what the rules would fire on); the rest
is counted in the metrics. The message text travels only as a sanitised, length-limited
annotation; decoded facts travel as `xid_*` annotations of small enums and integers.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoheal.monitoring import (
    FATAL_ALERT,
    KERNEL_LINE_ANNOTATION,
    NVSWITCH_ALERT,
    SOURCE_LABEL,
    SOURCE_WATCHER,
)
from autoheal.xid import Tier, XidCatalog
from autoheal.xid_messages import MAX_LINE, FallenOffBus, Severity, SxidLine, XidDetail, XidLine, sanitise
from watcher.gpus import Gpu, GpuMap

FALLEN_XID = 79  # "fallen off the bus" without an Xid line is XID 79 by another name


@dataclass(frozen=True)
class WatchAlert:
    labels: dict[str, str]
    annotations: dict[str, str]
    at: float  # when the kernel logged it (epoch seconds)
    # a secondary notice (fallen off the bus, after the Xid 79 line): counts as an occurrence of
    # the same alert but does not replace the annotations of the line that named the fault
    secondary: bool = False

    @property
    def key(self) -> tuple[tuple[str, str], ...]:
        """The alert's identity in Alertmanager: its label set."""
        return tuple(sorted(self.labels.items()))


def _gpu_labels(node: str, bus_id: str, gpu: Gpu | None) -> dict[str, str]:
    labels = {"Hostname": node, "pci_bus_id": bus_id}
    if gpu is not None and gpu.index is not None:
        labels["gpu"] = str(gpu.index)
    if gpu is not None and gpu.uuid:
        labels["UUID"] = gpu.uuid
    if gpu is not None and gpu.minor is not None:
        labels["device"] = f"nvidia{gpu.minor}"
    if gpu is not None and gpu.name:
        labels["modelName"] = gpu.name
    return labels


def xid_alert(
    node: str,
    bus_id: str,
    xid: int,
    text: str,
    detail: XidDetail,
    gpus: GpuMap,
    catalog: XidCatalog,
    at: float,
    secondary: bool = False,
    record: str = "",
) -> WatchAlert | None:
    """The alert for an XID on the GPU at `bus_id`, or None when its tier only notifies."""
    tier = catalog.tier_of(xid)
    if tier is Tier.NOTIFY:
        return None
    gpu = gpus.get(bus_id)
    labels = {
        "alertname": FATAL_ALERT,
        "severity": "critical",
        "tier": tier.value,
        "xid": str(xid),
        SOURCE_LABEL: SOURCE_WATCHER,
        **_gpu_labels(node, bus_id, gpu),
    }
    where = f"GPU {labels['gpu']}" if "gpu" in labels else f"the GPU at {bus_id} (not in this node's GPU map)"
    annotations = {
        "summary": f"Fatal XID {xid} on {node} {where}",
        "message": sanitise(text),
        "catalog_version": str(catalog.version),
        **detail.to_annotations(),
        **_kernel_line(record),
    }
    return WatchAlert(labels, annotations, at, secondary)


def _kernel_line(record: str) -> dict[str, str]:
    """The kernel record as an annotation (none for an empty one)."""
    line = sanitise(record, MAX_LINE)
    return {KERNEL_LINE_ANNOTATION: line} if line else {}


def alert_for(
    event: XidLine | FallenOffBus | SxidLine,
    node: str,
    gpus: GpuMap,
    catalog: XidCatalog,
    at: float,
    record: str = "",
) -> WatchAlert | None:
    """The alert for one driver event; `record` is the kernel record it came from, as logged."""
    if isinstance(event, XidLine):
        return xid_alert(
            node, event.bus_id, event.xid, event.text, event.detail, gpus, catalog, at, record=record
        )
    if isinstance(event, FallenOffBus):
        text = "GPU has fallen off the bus and is not responding to commands (driver notice)"
        return xid_alert(
            node,
            event.bus_id,
            FALLEN_XID,
            text,
            XidDetail(),
            gpus,
            catalog,
            at,
            secondary=True,
            record=record,
        )
    if event.severity is not Severity.FATAL:
        return None
    labels = {
        "alertname": NVSWITCH_ALERT,
        "severity": "critical",
        "sxid": str(event.sxid),
        "nvswitch": str(event.nvswitch),
        "Hostname": node,
        "pci_bus_id": event.bus_id,
        SOURCE_LABEL: SOURCE_WATCHER,
    }
    annotations = {
        "summary": f"Fatal SXID {event.sxid} on {node} NVSwitch {event.nvswitch}",
        "message": sanitise(event.text),
        "xid_severity": Severity.FATAL.value,
        **_kernel_line(record),
    }
    if event.link is not None:
        annotations["xid_link"] = str(event.link)
    return WatchAlert(labels, annotations, at)
