"""The watcher's settings: one validated model, filled from the command line (and the environment
variables a DaemonSet sets), so a bad value stops the daemon at start with the field named."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator, model_validator

from autoheal.errors import ValidationError
from autoheal.names import validate_node_name

SourceKind = Literal["kmsg", "journald", "file"]


class WatcherConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str = Field(description="this node's name: the alerts' Hostname label")
    source: SourceKind = "kmsg"
    path: Path | None = Field(
        default=None, description="kmsg: the device or a file of kmsg records; file: a text log"
    )
    alertmanagers: tuple[HttpUrl, ...] = Field(min_length=1, description="Alertmanager base URLs")
    token_file: Path | None = Field(
        default=None, description="bearer token for Alertmanager, if it wants one"
    )
    state_file: Path
    gpu_map: str = Field(default="auto", description="auto | nvidia-smi | procfs | none | file:PATH")
    listen: str = Field(default="", description="HOST:PORT for /metrics and /healthz ('' = off)")
    boot_id_file: Path = Path("/proc/sys/kernel/random/boot_id")
    journalctl: str = "journalctl"
    replay_seconds: float = Field(
        default=300.0, ge=0, description="first start with no state: replay this much of the log"
    )
    # A kernel line is an event, not a state: its alert ends `alert_hold_seconds` after the last
    # line, so a fault that recurs after that (a GPU reset, then the same XID) notifies again.
    alert_hold_seconds: float = Field(default=300.0, gt=0, description="endsAt = last seen + this")
    resend_seconds: float = Field(default=60.0, gt=0, description="re-post a still-active alert this often")
    rate_per_second: float = Field(default=5.0, gt=0, description="Alertmanager POSTs per second, at most")
    burst: int = Field(default=10, ge=1)
    max_batch: int = Field(default=64, ge=1, le=1000)
    max_pending: int = Field(default=4096, ge=16)
    retry_min_seconds: float = Field(default=0.2, gt=0)
    retry_max_seconds: float = Field(default=10.0, gt=0)
    poll_seconds: float = Field(default=0.02, gt=0, le=5, description="file sources: how often to look")
    gpu_refresh_seconds: float = Field(default=300.0, gt=0)
    post_timeout_seconds: float = Field(default=2.0, gt=0)
    # degraded links (watcher/links.py): sysfs read under this root (/sys on a node; a fake tree in
    # tests and the lab); None: not watched
    sysfs_root: Path | None = Field(default=None, description="sysfs root for link/PCIe checks")
    link_poll_seconds: float = Field(default=1.0, gt=0, le=300, description="how often sysfs is read")

    @field_validator("node")
    @classmethod
    def _node(cls, v: str) -> str:
        try:
            return validate_node_name(v, field="node")
        except ValidationError as exc:  # pydantic reports ValueErrors with the field's name
            raise ValueError(str(exc).removeprefix("node: ")) from None

    @field_validator("gpu_map")
    @classmethod
    def _gpu_map(cls, v: str) -> str:
        if v in ("auto", "nvidia-smi", "procfs", "none") or (v.startswith("file:") and len(v) > 5):
            return v
        raise ValueError(f"{v!r}: use auto, nvidia-smi, procfs, none or file:PATH")

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        if v:
            host, _, port = v.rpartition(":")
            if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
                raise ValueError(f"{v!r}: use HOST:PORT, e.g. 0.0.0.0:9402")
        return v

    @model_validator(mode="after")
    def _path_for_file(self) -> WatcherConfig:
        if self.source == "file" and self.path is None:
            raise ValueError("path: source file needs --path (the text log to follow)")
        return self
