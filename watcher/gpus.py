"""PCI bus id -> GPU index and UUID, so a kernel line names the GPU the way dcgm-exporter does.

dcgm-exporter's `gpu` label is the GPU's index in NVML's order (nvidia-smi's `index`, PCI bus
order by default) and its `UUID` label the GPU's UUID; the kernel names a GPU by its bus id only.
What is read, in order of preference (`--gpu-map`):

- `nvidia-smi`: ``nvidia-smi --query-gpu=index,pci.bus_id,uuid,name --format=csv,noheader``.
- `procfs`: ``/proc/driver/nvidia/gpus/<bus id>/information`` (``Model:``, ``GPU UUID:``,
  ``Bus Location:``, ``Device Minor:``), the driver's own view, readable without NVML; the index is the GPU's
  position in PCI bus order, which is NVML's default enumeration.
- `file:PATH`: a file in nvidia-smi's CSV form (the lab's simulator writes one per node).
- the kernel log itself: ``NVRM: GPU at PCI:<bus>: GPU-<uuid>`` lines fill in UUIDs.

A GPU the driver announces that the map does not know yet (the watcher started before the GPU
was up) makes the map read its source again, in the background and at most every few seconds.

The map never forgets a GPU: the GPU that fell off the bus is exactly the one nvidia-smi no longer
lists (and nvidia-smi may hang on a node in that state), so a refresh only adds and updates. It is
read at start, then every `gpu_refresh_seconds` in the background.
"""

from __future__ import annotations

import csv
import io
import logging
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from autoheal.xid_messages import normalise_bus_id

log = logging.getLogger(__name__)
PROCFS = Path("/proc/driver/nvidia/gpus")
NVIDIA_SMI_TIMEOUT_S = 10.0
REFRESH_SOON_MIN_S = 5.0
_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")


@dataclass(frozen=True)
class Gpu:
    index: int | None
    uuid: str | None
    minor: int | None = None  # /dev/nvidia<minor>: dcgm-exporter's `device` label
    name: str | None = None  # the model: dcgm-exporter's `modelName` label


def parse_smi_csv(text: str) -> dict[str, Gpu]:
    """nvidia-smi's `index, pci.bus_id, uuid[, name]` CSV (no header). Bad rows are skipped."""
    out: dict[str, Gpu] = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) < 3:
            continue
        index, bus, uuid = (c.strip() for c in row[:3])
        if not index.isdigit() or int(index) > 255 or not re.fullmatch(r"[0-9a-fA-F:.]{7,16}", bus):
            continue
        name = _model(row[3]) if len(row) > 3 else None
        out[normalise_bus_id(bus)] = Gpu(int(index), uuid if _UUID.match(uuid) else None, None, name)
    return out


def _model(raw: str) -> str | None:
    name = raw.strip()
    return name if re.fullmatch(r"[A-Za-z0-9 ._()/-]{1,64}", name) else None


def read_procfs(root: Path = PROCFS) -> dict[str, Gpu]:
    """The driver's per-GPU `information` files; index = position in bus order."""
    found: list[tuple[str, str | None, int | None, str | None]] = []
    for info in sorted(root.glob("*/information")):
        fields: dict[str, str] = {}
        try:
            for line in info.read_text(errors="replace").splitlines():
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
        except OSError:
            continue
        bus = normalise_bus_id(fields.get("Bus Location", info.parent.name))
        uuid = fields.get("GPU UUID")
        minor = fields.get("Device Minor", "")
        found.append(
            (
                bus,
                uuid if uuid and _UUID.match(uuid) else None,
                int(minor) if minor.isdigit() else None,
                _model(fields.get("Model", "")),
            )
        )
    return {bus: Gpu(i, uuid, minor, name) for i, (bus, uuid, minor, name) in enumerate(sorted(found))}


def run_nvidia_smi(binary: str = "nvidia-smi") -> dict[str, Gpu]:
    res = subprocess.run(
        [binary, "--query-gpu=index,pci.bus_id,uuid,name", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=NVIDIA_SMI_TIMEOUT_S,
        check=False,
    )
    if res.returncode != 0:
        raise OSError(f"nvidia-smi exited {res.returncode}: {res.stderr.strip()[:200]}")
    return parse_smi_csv(res.stdout)


class GpuMap:
    """The node's GPUs by normalised bus id; thread-safe, additive."""

    def __init__(self, how: str) -> None:
        if how == "auto":
            how = "nvidia-smi" if shutil.which("nvidia-smi") else ("procfs" if PROCFS.is_dir() else "none")
        self.how = how
        self._gpus: dict[str, Gpu] = {}
        self._lock = threading.Lock()
        self.last_error = ""
        self._soon_at = 0.0

    def refresh(self) -> int:
        """Read the configured source again; returns how many GPUs are known. Never raises: a
        node whose GPU fell off the bus may make nvidia-smi fail or hang (it times out)."""
        try:
            if self.how == "nvidia-smi":
                found = run_nvidia_smi()
            elif self.how == "procfs":
                found = read_procfs()
            elif self.how.startswith("file:"):
                found = parse_smi_csv(Path(self.how[5:]).read_text())
            else:
                found = {}
            self.last_error = ""
        except (OSError, subprocess.SubprocessError, UnicodeDecodeError) as exc:
            self.last_error = str(exc)[:200]
            log.warning("GPU map (%s): %s; keeping what is known", self.how, self.last_error)
            found = {}
        with self._lock:
            for bus, gpu in found.items():
                old = self._gpus.get(bus)
                self._gpus[bus] = Gpu(
                    gpu.index if gpu.index is not None else (old.index if old else None),
                    gpu.uuid or (old.uuid if old else None),
                    gpu.minor if gpu.minor is not None else (old.minor if old else None),
                    gpu.name or (old.name if old else None),
                )
            return len(self._gpus)

    def refresh_soon(self) -> bool:
        """Refresh in a background thread unless one ran in the last few seconds (nvidia-smi can
        take seconds; the reader must not wait for it). True when a refresh was started."""
        now = time.monotonic()
        with self._lock:
            if now - self._soon_at < REFRESH_SOON_MIN_S:
                return False
            self._soon_at = now
        threading.Thread(target=self.refresh, name="gpu-map-refresh", daemon=True).start()
        return True

    def learn_uuid(self, bus_id: str, uuid: str) -> None:
        """From an `NVRM: GPU at PCI:...` line; a GPU the map does not know yet refreshes it."""
        with self._lock:
            unknown = bus_id not in self._gpus or self._gpus[bus_id].index is None
        if unknown and self.how != "none":
            self.refresh_soon()
        with self._lock:
            old = self._gpus.get(bus_id)
            self._gpus[bus_id] = Gpu(old.index, uuid, old.minor, old.name) if old else Gpu(None, uuid)

    def get(self, bus_id: str) -> Gpu | None:
        with self._lock:
            return self._gpus.get(bus_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._gpus)
