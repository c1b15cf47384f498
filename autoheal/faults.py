"""The degraded-fault catalogue: faults that slow a job instead of killing it (issue 36).

One versioned data file (autoheal/data/fault_catalog.yaml), loaded and validated like the XID
catalogue: the node watcher reads its thresholds (watcher/links.py), the Prometheus rules are
rendered from it (autoheal.monitoring.render_degraded_rules) and the runner refuses an alert that
names a class it does not list. A bad entry is refused at load time with the field named
(``faults.2.threshold: ...``).

The classes themselves are fixed here (each needs its detector's code); the file sets their rung,
thresholds, windows and the metric a rule reads.
"""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autoheal.errors import ConfigError, field_errors
from autoheal.xid import Escalation, Tier

DEGRADED_ALERT = "NodeDegraded"  # the alertname of every degraded fault (label `fault` names the class)
FAULT_LABEL = "fault"


class FaultClass(StrEnum):
    LINK_FLAP = "link_flap"
    NIC_ERRORS = "nic_errors"
    PCIE_DOWNTRAINED = "pcie_downtrained"
    GPU_THROTTLE = "gpu_throttle"
    ROW_REMAP_PENDING = "row_remap_pending"
    STRAGGLER = "straggler"


class Detector(StrEnum):
    WATCHER = "watcher"  # the node watcher, from sysfs
    PROMETHEUS = "prometheus"  # a rule rendered from the catalogue


DETECTOR_OF: dict[FaultClass, Detector] = {
    FaultClass.LINK_FLAP: Detector.WATCHER,
    FaultClass.NIC_ERRORS: Detector.WATCHER,
    FaultClass.PCIE_DOWNTRAINED: Detector.WATCHER,
    FaultClass.GPU_THROTTLE: Detector.PROMETHEUS,
    FaultClass.ROW_REMAP_PENDING: Detector.PROMETHEUS,
    FaultClass.STRAGGLER: Detector.PROMETHEUS,
}
# NVML's clocksThrottleReasons bits (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS is their OR)
THROTTLE_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clock_setting": 0x100,
}
# the rungs a degraded fault may take: the degraded play drains for each of them (quarantine also
# pages a human); notify only tells one
DEGRADED_TIERS = frozenset({Tier.NOTIFY, Tier.DRAIN, Tier.QUARANTINE})
_METRIC = r"^[a-zA-Z_:][a-zA-Z0-9_:]{0,127}$"


class FaultEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: FaultClass
    detector: Detector
    tier: Tier
    threshold: int = Field(ge=1, le=1_000_000, description="events (or counter growth) within the window")
    window_seconds: int = Field(gt=0, le=7 * 86400)
    sustain_seconds: int = Field(default=0, ge=0, le=86400, description="how long the condition must hold")
    meaning: str = Field(min_length=1, max_length=300)
    metric: str | None = Field(default=None, pattern=_METRIC)
    reasons: tuple[str, ...] = ()
    margin_percent: float | None = Field(default=None, gt=0, le=1000)
    min_ranks: int = Field(default=3, ge=2, le=100_000)

    @field_validator("tier")
    @classmethod
    def _tier(cls, v: Tier) -> Tier:
        if v not in DEGRADED_TIERS:
            raise ValueError(f"{v.value!r}: a degraded fault takes drain, notify or quarantine")
        return v

    @field_validator("reasons")
    @classmethod
    def _reasons(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [r for r in v if r not in THROTTLE_BITS]
        if bad:
            raise ValueError(f"unknown throttle reason(s) {bad}: use {sorted(THROTTLE_BITS)}")
        return v

    @model_validator(mode="after")
    def _shape(self) -> FaultEntry:
        want = DETECTOR_OF[self.name]
        if self.detector is not want:
            raise ValueError(f"detector: {self.name.value} is detected by {want.value}")
        if self.detector is Detector.PROMETHEUS and self.metric is None:
            raise ValueError(f"metric: {self.name.value} needs the metric its rule reads")
        if self.name is FaultClass.GPU_THROTTLE and not self.reasons:
            raise ValueError("reasons: gpu_throttle needs at least one throttle reason")
        if self.name is FaultClass.STRAGGLER and self.margin_percent is None:
            raise ValueError("margin_percent: straggler needs the margin over its peers")
        return self

    @property
    def throttle_mask(self) -> int:
        mask = 0
        for r in self.reasons:
            mask |= THROTTLE_BITS[r]
        return mask


class FaultCatalog(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = Field(ge=1)
    escalation: Escalation
    faults: tuple[FaultEntry, ...] = Field(min_length=1)

    @field_validator("faults")
    @classmethod
    def _unique(cls, faults: tuple[FaultEntry, ...]) -> tuple[FaultEntry, ...]:
        seen: set[FaultClass] = set()
        for f in faults:
            if f.name in seen:
                raise ValueError(f"fault class {f.name.value} is listed twice")
            seen.add(f.name)
        return faults

    def get(self, name: str) -> FaultEntry | None:
        """The entry of a class by its name (alert text: anything not listed is None)."""
        return next((f for f in self.faults if f.name.value == name), None)

    def require(self, name: FaultClass) -> FaultEntry:
        entry = self.get(name.value)
        if entry is None:
            raise ConfigError(f"fault catalogue v{self.version} has no {name.value} entry")
        return entry

    def by_detector(self, detector: Detector) -> list[FaultEntry]:
        return [f for f in self.faults if f.detector is detector]


def parse_fault_catalog(data: Any, origin: str = "<fault catalogue>") -> FaultCatalog:
    try:
        return FaultCatalog.model_validate(data)
    except ValidationError as exc:
        problems = field_errors(exc.errors(), "<catalogue>")
        raise ConfigError(f"{origin}: invalid fault catalogue: {problems}") from exc


@lru_cache(maxsize=1)
def load_fault_catalog() -> FaultCatalog:
    """The catalogue shipped with autoheal (autoheal/data/fault_catalog.yaml)."""
    text = resources.files("autoheal.data").joinpath("fault_catalog.yaml").read_text()
    return parse_fault_catalog(yaml.safe_load(text), "autoheal/data/fault_catalog.yaml")
