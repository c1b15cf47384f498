"""The XID catalogue: one versioned data file that both the alert rules and the runner read.

Keeping a single source means the Prometheus rule that decides *whether* to alert and the runner
that decides *what to do* can never disagree about an XID (a test pins the rendered rule file to
this catalogue).
"""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from autoheal.errors import ConfigError


class Tier(StrEnum):
    """What autoheal does about a fault, in increasing order of force."""

    NOTIFY = "notify"
    RESET = "reset"
    REPLACE = "replace"

    @property
    def rank(self) -> int:
        return _TIER_RANK[self]


_TIER_RANK = {Tier.NOTIFY: 0, Tier.RESET: 1, Tier.REPLACE: 2}


class XidEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    xid: int = Field(gt=0, lt=1000)
    tier: Tier
    name: str = Field(min_length=1)
    meaning: str = Field(min_length=1)


class Escalation(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    repeats: int = Field(ge=1)
    window_seconds: int = Field(gt=0)


class XidCatalog(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = Field(ge=1)
    source: str
    escalation: Escalation
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
        """The action tier of an XID; an XID we do not know is only notified, never acted on."""
        entry = self.get(xid)
        return entry.tier if entry else Tier.NOTIFY

    def xids_of(self, tier: Tier) -> list[int]:
        return sorted(e.xid for e in self.xids if e.tier == tier)

    @property
    def fatal_xids(self) -> list[int]:
        """XIDs that need the node taken out of service (tiers reset and replace)."""
        return sorted(e.xid for e in self.xids if e.tier != Tier.NOTIFY)


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
