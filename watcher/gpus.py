"""PCI bus id -> GPU index and UUID, so a kernel line names the GPU the way dcgm-exporter does.

dcgm-exporter's `gpu` label is the GPU's index in NVML's order (nvidia-smi's `index`, PCI bus
order by default) and its `UUID` label the GPU's UUID; the kernel names a GPU by its bus id only.
What is read, in order of preference (`--gpu-map`):

- `nvidia-smi`: ``nvidia-smi --query-gpu=index,pci.bus_id,uuid --format=csv,noheader``.
- `procfs`: ``/proc/driver/nvidia/gpus/<bus id>/information`` (``GPU UUID:``, ``Bus Location:``,
  ``Device Minor:``), the driver's own view, readable without NVML; the index is the GPU's
  position in PCI bus order, which is NVML's default enumeration.
- `file:PATH`: a file in nvidia-smi's CSV form (the lab's simulator writes one per node).
- the kernel log itself: ``NVRM: GPU at PCI:<bus>: GPU-<uuid>`` lines fill in UUIDs.

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
from dataclasses import dataclass
from pathlib import Path

from autoheal.xid_messages import normalise_bus_id

log = logging.getLogger(__name__)
PROCFS = Path("/proc/driver/nvidia/gpus")
NVIDIA_SMI_TIMEOUT_S = 10.0
_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")


@dataclass(frozen=True)
class Gpu:
    index: int | None
    uuid: str | None
    minor: int | None = None  # /dev/nvidia<minor>: dcgm-exporter's `device` label


def parse_smi_csv(text: str) -> dict[str, Gpu]:
    """nvidia-smi's `index, pci.bus_id, uuid` CSV (no header). Bad rows are skipped."""
    out: dict[str, Gpu] = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) < 3:
            continue
        index, bus, uuid = (c.strip() for c in row[:3])
        if not index.isdigit() or int(index) > 255 or not re.fullmatch(r"[0-9a-fA-F:.]{7,16}", bus):
            continue
        out[normalise_bus_id(bus)] = Gpu(int(index), uuid if _UUID.match(uuid) else None)
    return out


def read_procfs(root: Path = PROCFS) -> dict[str, Gpu]:
    """The driver's per-GPU `information` files; index = position in bus order."""
    found: list[tuple[str, str | None, int | None]] = []
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
            (bus, uuid if uuid and _UUID.match(uuid) else None, int(minor) if minor.isdigit() else None)
        )
    return {bus: Gpu(i, uuid, minor) for i, (bus, uuid, minor) in enumerate(sorted(found))}


def run_nvidia_smi(binary: str = "nvidia-smi") -> dict[str, Gpu]:
    res = subprocess.run(
        [binary, "--query-gpu=index,pci.bus_id,uuid", "--format=csv,noheader"],
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
                )
            return len(self._gpus)

    def learn_uuid(self, bus_id: str, uuid: str) -> None:
        """From an `NVRM: GPU at PCI:...` line."""
        with self._lock:
            old = self._gpus.get(bus_id)
            self._gpus[bus_id] = Gpu(old.index if old else None, uuid, old.minor if old else None)

    def get(self, bus_id: str) -> Gpu | None:
        with self._lock:
            return self._gpus.get(bus_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._gpus)
