"""Alertmanager's webhook payload (version "4"), as pydantic models.

The models are the first line of defence against hostile input: they bound every size (number of
alerts and labels, length of names and values), pin the version, and refuse anything that is not
the documented shape. Unknown top-level keys are ignored so a newer Alertmanager still gets through;
what the runner acts on is validated again later (node names through autoheal.names).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

MAX_ALERTS = 1000
MAX_LABELS = 64
MAX_LABEL_NAME = 128
MAX_LABEL_VALUE = 1024
MAX_TEXT = 4096

LabelName = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_LABEL_NAME, pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")
]
LabelValue = Annotated[str, StringConstraints(max_length=MAX_LABEL_VALUE)]
Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]
Fingerprint = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{1,32}$")]


def _bounded(labels: dict[str, str], what: str) -> dict[str, str]:
    if len(labels) > MAX_LABELS:
        raise ValueError(f"{what}: at most {MAX_LABELS} entries, got {len(labels)}")
    return labels


class Alert(BaseModel):
    """One alert of a notification; `labels` identify it, `fingerprint` is Alertmanager's hash."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    status: Literal["firing", "resolved"]
    labels: dict[LabelName, LabelValue]
    annotations: dict[LabelName, Text] = Field(default_factory=dict)
    startsAt: datetime
    endsAt: datetime | None = None
    generatorURL: Text = ""
    fingerprint: Fingerprint

    @field_validator("labels", "annotations")
    @classmethod
    def _few(cls, value: dict[str, str]) -> dict[str, str]:
        return _bounded(value, "labels")


class WebhookPayload(BaseModel):
    """The body Alertmanager POSTs to a webhook receiver."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    version: Literal["4"]
    status: Literal["firing", "resolved"]
    receiver: Text
    groupKey: Text = ""
    truncatedAlerts: int = Field(default=0, ge=0)
    groupLabels: dict[LabelName, LabelValue] = Field(default_factory=dict)
    commonLabels: dict[LabelName, LabelValue] = Field(default_factory=dict)
    commonAnnotations: dict[LabelName, Text] = Field(default_factory=dict)
    externalURL: Text = ""
    alerts: list[Alert] = Field(min_length=1, max_length=MAX_ALERTS)

    @field_validator("groupLabels", "commonLabels", "commonAnnotations")
    @classmethod
    def _few(cls, value: dict[str, str]) -> dict[str, str]:
        return _bounded(value, "labels")
