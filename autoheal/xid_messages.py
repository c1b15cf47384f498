"""NVIDIA driver lines in the kernel log: Xid, SXid, GPU announcements, fallen off the bus, and the
facts NVIDIA's decode rules need from their text.

The dcgm metric carries an XID number only. NVIDIA's own resolution rules need the message: XID 154
says which recovery action the driver now wants, XIDs 144-150 (NVLink5) carry a subcode mnemonic, a
severity and the link, XID 74 names the NVLink, and SXIDs come from NVSwitches with their own
severity (docs.nvidia.com/deploy/xid-errors, "Analyzing Xid Errors with the Xid Catalog"; the
line shapes follow what NVIDIA's NVSentinel syslog monitor parses). The XID watcher turns these
lines into alerts; the runner's classifier receives the decoded facts, never the raw text.

Formats (one kernel record each):
    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
    NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)
    NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 ...)
    NVRM: Xid (PCI:0003:00:00): 74, pid=..., NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, ...)
    NVRM: GPU at PCI:0000:3b:00: GPU-8f3c1e2a-...
    NVRM: The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:2330) installed in this system has fallen off the bus ...
    nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)

The text is untrusted (anything can write into /dev/kmsg): parsing never raises, every number is
range-checked, every string is bounded and restricted to printable ASCII before it leaves here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

MAX_TEXT = 256  # how much of a driver message may travel in an alert annotation
MAX_LINE = 512  # how much of a whole kernel record may (the evidence bundle's kernel line)

_BUS = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
_NVRM_XID = re.compile(rf"NVRM: Xid \((?:PCI:)?({_BUS})\): (\d{{1,3}})\b(.*)", re.DOTALL)
_PID = re.compile(r"^, pid=('?[^,']{0,32}'?)")
_NAME = re.compile(r"^, name=([^,]{0,64})")
_GPU_AT = re.compile(
    rf"NVRM: GPU at PCI:({_BUS}): (GPU-[0-9a-fA-F]{{8}}(?:-[0-9a-fA-F]{{4}}){{3}}-[0-9a-fA-F]{{12}})"
)
_FALLEN = re.compile(rf"NVRM: The NVIDIA GPU ({_BUS}).{{0,200}}?fallen off the bus", re.DOTALL)
_SXID = re.compile(
    rf"nvidia-nvswitch(\d{{1,3}}): SXid \(PCI:({_BUS})\): (\d{{1,6}})\b"
    r"(?:, (Fatal|Non-fatal))?(?:, Link (\d{1,3})\b)?(.*)",
    re.DOTALL,
)
# XID 154: "... changed from 0x0 (None) to 0x1 (GPU Reset Required)"
_RECOVERY = re.compile(
    r"recovery action changed from 0x[0-9a-fA-F]{1,8} \([^)]{0,40}\) to 0x([0-9a-fA-F]{1,8}) \(([^)]{0,40})\)"
)
# XIDs 144-150 (NVLink5): "<MNEMONIC> <Severity> <unit> <instance> Link <n> (<intrinfo> <errorstatus> ..."
_NVL5 = re.compile(
    r"^([A-Z][A-Z0-9_]{0,47})\s+(Fatal|Nonfatal|Non-fatal)\s+(\w{1,8})\s+(\w{1,8})\s+Link\s+(\d{1,3})\s+"
    r"\((0x[0-9a-fA-F]{1,8})\s+(0x[0-9a-fA-F]{1,8})"
)
_NVLINK_74 = re.compile(r"NVLink: (?:fatal )?error detected on link (\d{1,3})")
_NEXT_RECORD = re.compile(r"NVRM: |nvidia-nvswitch\d{1,3}: ")
NVL5_XIDS = range(144, 151)


class RecoveryAction(StrEnum):
    """The recovery action an XID 154 asks for (NVML's nvmlDeviceGpuRecoveryAction_t)."""

    NONE = "none"
    GPU_RESET = "gpu_reset"
    NODE_REBOOT = "node_reboot"
    DRAIN_P2P = "drain_p2p"
    DRAIN_AND_RESET = "drain_and_reset"


_RECOVERY_CODES = {
    0: RecoveryAction.NONE,
    1: RecoveryAction.GPU_RESET,
    2: RecoveryAction.NODE_REBOOT,
    3: RecoveryAction.DRAIN_P2P,
    4: RecoveryAction.DRAIN_AND_RESET,
}
_RECOVERY_WORDS = {
    "none": RecoveryAction.NONE,
    "gpu reset required": RecoveryAction.GPU_RESET,
    "node reboot required": RecoveryAction.NODE_REBOOT,
    "drain p2p": RecoveryAction.DRAIN_P2P,
    "drain and reset": RecoveryAction.DRAIN_AND_RESET,
}


class Severity(StrEnum):
    FATAL = "fatal"
    NONFATAL = "nonfatal"


@dataclass(frozen=True)
class XidDetail:
    """Decoded facts of one XID message: small enums and integers, safe to act on."""

    recovery_action: RecoveryAction | None = None  # XID 154
    subcode: str | None = None  # XIDs 144-150: the mnemonic, e.g. NETIR_LINK_EVT
    severity: Severity | None = None  # XIDs 144-150 (and SXIDs)
    link: int | None = None  # XIDs 74 and 144-150: the NVLink
    intrinfo: int | None = None  # XIDs 144-150: the first register (NVIDIA's decode table keys on it)
    error_status: int | None = None  # XIDs 144-150: the second register

    def to_annotations(self) -> dict[str, str]:
        """As Alertmanager annotations (only the facts that are set)."""
        out: dict[str, str] = {}
        if self.recovery_action is not None:
            out["xid_recovery_action"] = self.recovery_action.value
        if self.subcode is not None:
            out["xid_subcode"] = self.subcode
        if self.severity is not None:
            out["xid_severity"] = self.severity.value
        for key in ("link", "intrinfo", "error_status"):
            value = getattr(self, key)
            if value is not None:
                out[f"xid_{key}"] = str(value)
        return out

    @classmethod
    def from_annotations(cls, annotations: dict[str, str]) -> XidDetail:
        """Read the facts back from an alert's annotations. Anything that does not validate is
        dropped (an alert from another source may carry anything): the result holds only values
        this module could have produced."""

        def number(key: str, hi: int) -> int | None:
            raw = annotations.get(key)
            return (
                int(raw) if raw is not None and raw.isdigit() and len(raw) <= 10 and int(raw) <= hi else None
            )

        action = annotations.get("xid_recovery_action")
        subcode = annotations.get("xid_subcode")
        severity = annotations.get("xid_severity")
        return cls(
            recovery_action=RecoveryAction(action) if action in set(RecoveryAction) else None,
            subcode=subcode
            if subcode is not None and re.fullmatch(r"[A-Z][A-Z0-9_]{0,47}", subcode)
            else None,
            severity=Severity(severity) if severity in set(Severity) else None,
            link=number("xid_link", 999),
            intrinfo=number("xid_intrinfo", 0xFFFFFFFF),
            error_status=number("xid_error_status", 0xFFFFFFFF),
        )

    @property
    def empty(self) -> bool:
        return not self.to_annotations()


@dataclass(frozen=True)
class XidLine:
    """`NVRM: Xid (PCI:<bus>): <xid>, ...`"""

    bus_id: str  # normalised, see normalise_bus_id
    xid: int
    text: str  # the message after the XID number, sanitised and bounded
    pid: int | None = None
    process: str | None = None
    detail: XidDetail = field(default_factory=XidDetail)


@dataclass(frozen=True)
class SxidLine:
    """`nvidia-nvswitch<N>: SXid (PCI:<bus>): <sxid>, Fatal|Non-fatal, Link <n> ...`"""

    nvswitch: int
    bus_id: str
    sxid: int
    severity: Severity | None
    link: int | None
    text: str


@dataclass(frozen=True)
class GpuAnnounce:
    """`NVRM: GPU at PCI:<bus>: GPU-<uuid>`: the driver names a GPU's UUID once per boot."""

    bus_id: str
    uuid: str


@dataclass(frozen=True)
class FallenOffBus:
    """`NVRM: The NVIDIA GPU <bus> ... has fallen off the bus`: XID 79 without an Xid line."""

    bus_id: str


Event = XidLine | SxidLine | GpuAnnounce | FallenOffBus


def normalise_bus_id(raw: str) -> str:
    """One spelling for a PCI address: the kernel prints `0000:3b:00` (Xid lines) or
    `0000:3b:00.0`, nvidia-smi `00000000:3B:00.0`. We keep a 4-digit domain, bus and device in
    lower case and drop the function (a GPU is function 0)."""
    parts = raw.strip().lower().split(".")[0].split(":")
    if len(parts) != 3:
        return raw.strip().lower()
    domain, bus, dev = parts
    return f"{domain[-4:].rjust(4, '0')}:{bus}:{dev}"


def sanitise(text: str, limit: int = MAX_TEXT) -> str:
    """Printable ASCII only, whitespace runs collapsed, at most `limit` characters: what may travel
    in an annotation. Control characters, escapes and non-ASCII become '?'."""
    cleaned = "".join(c if " " <= c <= "~" else ("?" if not c.isspace() else " ") for c in text)
    cleaned = " ".join(cleaned.split())
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 3] + "..."


def decode(xid: int, text: str) -> XidDetail:
    """The facts NVIDIA's decode rules need from the message of XID `xid` (text after the number)."""
    if xid == 154:
        m = _RECOVERY.search(text)
        if m is not None:
            code = int(m.group(1), 16)
            action = _RECOVERY_CODES.get(code) or _RECOVERY_WORDS.get(m.group(2).strip().lower())
            return XidDetail(recovery_action=action)
        return XidDetail()
    if xid in NVL5_XIDS:
        m = _NVL5.match(text)
        if m is not None:
            mnemonic, sev, _unit, _instance, link, intrinfo, status = m.groups()
            return XidDetail(
                subcode=mnemonic,
                severity=Severity.FATAL if sev == "Fatal" else Severity.NONFATAL,
                link=int(link),
                intrinfo=int(intrinfo, 16),
                error_status=int(status, 16),
            )
        return XidDetail()
    if xid == 74:
        m = _NVLINK_74.search(text)
        return XidDetail(link=int(m.group(1))) if m is not None else XidDetail()
    return XidDetail()


def _xid_line(m: re.Match[str]) -> XidLine | None:
    bus, number, rest = m.group(1), int(m.group(2)), m.group(3)
    if not 0 < number < 1000:
        return None
    pid: int | None = None
    process: str | None = None
    if pm := _PID.match(rest):
        raw_pid = pm.group(1).strip("'")
        pid = int(raw_pid) if raw_pid.isdigit() and len(raw_pid) <= 10 else None
        rest = rest[pm.end() :]
    if nm := _NAME.match(rest):
        name = nm.group(1).strip()
        process = sanitise(name, 64) if name and name != "<unknown>" else None
        rest = rest[nm.end() :]
    text = rest[2:] if rest.startswith(", ") else rest.lstrip(", ")
    return XidLine(
        bus_id=normalise_bus_id(bus),
        xid=number,
        text=sanitise(text),
        pid=pid,
        process=process,
        detail=decode(number, text),
    )


def _one(fragment: str) -> Event | None:
    if m := _NVRM_XID.match(fragment):
        return _xid_line(m)
    if m := _GPU_AT.match(fragment):
        return GpuAnnounce(normalise_bus_id(m.group(1)), m.group(2).lower().replace("gpu-", "GPU-", 1))
    if m := _SXID.match(fragment):
        sev = m.group(4)
        return SxidLine(
            nvswitch=int(m.group(1)),
            bus_id=normalise_bus_id(m.group(2)),
            sxid=int(m.group(3)),
            severity=None if sev is None else (Severity.FATAL if sev == "Fatal" else Severity.NONFATAL),
            link=int(m.group(5)) if m.group(5) is not None else None,
            text=sanitise(m.group(6).lstrip(" ,")),
        )
    if m := _FALLEN.match(fragment):
        return FallenOffBus(normalise_bus_id(m.group(1)))
    return None


def parse_message(message: str) -> list[Event]:
    """Every driver event in one kernel message. Usually one; more when a text log interleaved two
    writers into one line (each fragment starts at an `NVRM: ` or `nvidia-nvswitchN: ` marker).
    Anything else yields nothing."""
    if "NVRM: " not in message and "nvidia-nvswitch" not in message:
        return []
    starts = [m.start() for m in _NEXT_RECORD.finditer(message)]
    events: list[Event] = []
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(message)
        fragment = message[start:end]
        if fragment.startswith("NVRM: The NVIDIA GPU"):
            # the fallen-off-the-bus notice spans several "NVRM: " lines of one record
            end = len(message)
            fragment = message[start:end]
        event = _one(fragment)
        if event is not None:
            events.append(event)
    return events
