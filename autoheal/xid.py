"""The XID catalogue: one versioned data file that the alert rules, the watcher and the runner read.

Keeping a single source means the Prometheus rule that decides *whether* to alert and the runner
that decides *what to do* can never disagree about an XID (a test pins the rendered rule file to
this catalogue). Each entry keeps NVIDIA's own resolution bucket; the rung of autoheal's recovery
ladder is derived from it here, so the mapping is written once and a drift test against NVIDIA's
table (tests/data/nvidia_xid_buckets.yaml) covers every entry (docs/architecture.md, "Fault classes
and the recovery ladder").
"""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from autoheal.errors import ConfigError
from autoheal.xid_messages import RecoveryAction, Severity, XidDetail


class Tier(StrEnum):
    """A rung of the recovery ladder, in increasing order of force. `quarantine` (fence, collect
    evidence, page a human) ranks highest: it is what the ladder ends in when nothing automatic may
    be trusted (an unknown XID, a mechanical fault, a node that keeps coming back)."""

    NOTIFY = "notify"
    RESTART_APP = "restart_app"
    # the gentle rung for faults that slow a job instead of killing it (autoheal/faults.py): Slurm
    # DRAIN, not DOWN - the running job keeps running and finishes - and a Kubernetes cordon
    DRAIN = "drain"
    RESET = "reset"
    REBOOT = "reboot"
    REPLACE = "replace"
    QUARANTINE = "quarantine"

    @property
    def rank(self) -> int:
        return _TIER_RANK[self]

    @property
    def fences(self) -> bool:
        """Whether this rung takes the node out of service (restart_app leaves it in)."""
        return self not in (Tier.NOTIFY, Tier.RESTART_APP)

    def next_rung(self) -> Tier:
        """The rung a repeat or a failure climbs to (replace and quarantine are the top)."""
        return _NEXT.get(self, self)


_TIER_RANK = {t: i for i, t in enumerate(Tier)}
_NEXT = {
    Tier.RESTART_APP: Tier.RESET,
    Tier.RESET: Tier.REBOOT,
    Tier.REBOOT: Tier.REPLACE,
    # a node that keeps degrading is a human's: it stays drained and is paged, never returned
    Tier.DRAIN: Tier.QUARANTINE,
}


class Bucket(StrEnum):
    """NVIDIA's resolution buckets (its XID catalog's "immediate action")."""

    IGNORE = "IGNORE"
    RESTART_APP = "RESTART_APP"
    RESET_GPU = "RESET_GPU"
    RESTART_BM = "RESTART_BM"
    RESTART_VM = "RESTART_VM"
    CHECK_MECHANICALS = "CHECK_MECHANICALS"
    CHECK_UVM = "CHECK_UVM"
    UPDATE_SWFW = "UPDATE_SWFW"
    CONTACT_SUPPORT = "CONTACT_SUPPORT"
    WORKFLOW_XID_45 = "WORKFLOW_XID_45"
    WORKFLOW_XID_48 = "WORKFLOW_XID_48"
    WORKFLOW_NVLINK_ERR = "WORKFLOW_NVLINK_ERR"
    WORKFLOW_NVLINK5_ERR = "WORKFLOW_NVLINK5_ERR"
    WORKFLOW_XID_154 = "WORKFLOW_XID_154"


BUCKET_TIER: dict[Bucket, Tier] = {
    Bucket.IGNORE: Tier.NOTIFY,
    Bucket.CHECK_UVM: Tier.NOTIFY,
    Bucket.RESTART_APP: Tier.RESTART_APP,
    Bucket.RESET_GPU: Tier.RESET,
    Bucket.RESTART_BM: Tier.REBOOT,
    Bucket.RESTART_VM: Tier.REBOOT,
    Bucket.CHECK_MECHANICALS: Tier.QUARANTINE,
    Bucket.UPDATE_SWFW: Tier.QUARANTINE,
    Bucket.CONTACT_SUPPORT: Tier.QUARANTINE,
}
# A WORKFLOW_* rule decides from the message; when it cannot be decoded (the metric path carries no
# text, or the text is mangled) the rule's most cautious outcome applies.
WORKFLOW_FALLBACK: dict[Bucket, Tier] = {
    Bucket.WORKFLOW_XID_45: Tier.NOTIFY,  # only ever follows another XID, which is acted on itself
    Bucket.WORKFLOW_XID_48: Tier.RESET,  # DBE: reset (with 63/64: drain and reset, the same rung)
    Bucket.WORKFLOW_NVLINK_ERR: Tier.RESET,  # reset the GPUs on the link
    Bucket.WORKFLOW_NVLINK5_ERR: Tier.RESET,  # fatal subcodes reset; non-fatal ones only notify
    Bucket.WORKFLOW_XID_154: Tier.REBOOT,  # the strongest action 154 can ask for
}
_RECOVERY_TIER = {
    RecoveryAction.NONE: Tier.NOTIFY,
    RecoveryAction.DRAIN_P2P: Tier.RESET,
    RecoveryAction.DRAIN_AND_RESET: Tier.RESET,
    RecoveryAction.GPU_RESET: Tier.RESET,
    RecoveryAction.NODE_REBOOT: Tier.REBOOT,
}


class XidEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    xid: int = Field(gt=0, lt=1000)
    bucket: Bucket
    name: str = Field(min_length=1)
    meaning: str = Field(min_length=1)

    @property
    def tier(self) -> Tier:
        """The rung without the message: the bucket's, or a workflow's most cautious outcome."""
        return BUCKET_TIER.get(self.bucket) or WORKFLOW_FALLBACK[self.bucket]


class Resolution(BaseModel):
    """The rung for one fault and why (the why goes to the incident's timeline)."""

    model_config = ConfigDict(frozen=True)

    tier: Tier
    why: str


class RepeatRule(BaseModel):
    """Application XIDs that, repeating on one GPU, mean the GPU needs diagnostics."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    xids: tuple[int, ...]
    repeats: int = Field(ge=2)
    window_seconds: int = Field(gt=0)


class Escalation(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    repeats: int = Field(ge=1)
    window_seconds: int = Field(gt=0)


class XidCatalog(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = Field(ge=1)
    source: str
    escalation: Escalation
    diagnose_on_repeat: RepeatRule
    xids: tuple[XidEntry, ...]

    @field_validator("xids")
    @classmethod
    def _unique(cls, xids: tuple[XidEntry, ...]) -> tuple[XidEntry, ...]:
        seen: set[int] = set()
        for e in xids:
            if e.xid in seen:
                raise ValueError(f"XID {e.xid} is listed twice")
            seen.add(e.xid)
        return xids

    def get(self, xid: int) -> XidEntry | None:
        return next((e for e in self.xids if e.xid == xid), None)

    def tier_of(self, xid: int) -> Tier:
        """The rung of an XID without its message. An XID we do not know fails safe: quarantine
        (fence and page a human), never a silent notify."""
        entry = self.get(xid)
        return entry.tier if entry else Tier.QUARANTINE

    def resolve(self, xid: int, detail: XidDetail) -> Resolution:
        """The rung of an XID given the decoded facts of its message (NVIDIA's WORKFLOW_* rules):
        154 follows the recovery action it names, 144-150 reset on a fatal subcode and only notify
        on a non-fatal one. Facts that are missing fall back to the XID's most cautious rung."""
        entry = self.get(xid)
        if entry is None:
            return Resolution(tier=Tier.QUARANTINE, why=f"XID {xid} is not in catalogue v{self.version}")
        if entry.bucket is Bucket.WORKFLOW_XID_154 and detail.recovery_action is not None:
            action = detail.recovery_action
            return Resolution(tier=_RECOVERY_TIER[action], why=f"XID 154 recovery action {action.value}")
        if entry.bucket is Bucket.WORKFLOW_NVLINK5_ERR and detail.severity is not None:
            tier = Tier.RESET if detail.severity is Severity.FATAL else Tier.NOTIFY
            sub = detail.subcode or "?"
            return Resolution(tier=tier, why=f"XID {xid} subcode {sub} {detail.severity.value}")
        if entry.bucket in WORKFLOW_FALLBACK:
            return Resolution(tier=entry.tier, why=f"XID {xid} {entry.bucket.value}: most cautious rung")
        return Resolution(tier=entry.tier, why=f"XID {xid} {entry.bucket.value}")

    def xids_of(self, tier: Tier) -> list[int]:
        return sorted(e.xid for e in self.xids if e.tier == tier)

    @property
    def fatal_xids(self) -> list[int]:
        """XIDs that need the node taken out of service (every rung that fences)."""
        return sorted(e.xid for e in self.xids if e.tier.fences)

    @property
    def acting_xids(self) -> list[int]:
        """XIDs that open an incident (every rung but notify)."""
        return sorted(e.xid for e in self.xids if e.tier is not Tier.NOTIFY)


def parse_catalog(data: Any, origin: str = "<catalog>") -> XidCatalog:
    try:
        return XidCatalog.model_validate(data)
    except ValueError as exc:
        raise ConfigError(f"{origin}: invalid XID catalogue: {exc}") from exc


@lru_cache(maxsize=1)
def load_catalog() -> XidCatalog:
    """The catalogue shipped with autoheal (autoheal/data/xid_catalog.yaml)."""
    text = resources.files("autoheal.data").joinpath("xid_catalog.yaml").read_text()
    return parse_catalog(yaml.safe_load(text), "autoheal/data/xid_catalog.yaml")
