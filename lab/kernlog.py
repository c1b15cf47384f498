"""The simulated GPU nodes' kernel logs and nvidia-smi views, as files the XID watcher reads.

A real node has /dev/kmsg and nvidia-smi; a simulated one has, under `<dir>/<node>/`:
  kmsg      kmsg records (autoheal.kmsg's format), appended as the NVIDIA driver would print them:
            the driver's GPU announcements at "boot", then every injected XID's line
  gpus.csv  what ``nvidia-smi --query-gpu=index,pci.bus_id,uuid,name --format=csv,noheader`` prints
  sys/      the sysfs files the watcher's link checks read (lab.sysfs): one InfiniBand port
            (mlx5_0/1, ACTIVE) and each GPU's PCIe link at x16 gen5; a flapped link writes there

Each GPU gets a PCI bus id (an HGX H100 board's, for the first eight) and a UUID derived from the
node's name, so identities are stable across simulator restarts and fleet changes.
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

from autoheal.kmsg import format_record, parse_record
from lab.sysfs import FakeSysfs

# HGX H100 8-GPU boards enumerate their GPUs on these buses; GPUs 8-15 get made-up ones
HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
DRIVER = "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  (simulated)"

# what the driver prints after "NVRM: Xid (PCI:<bus>): <xid>, pid=..., name=..., "
XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address",
    31: "Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_12340000",
    43: "Ch 00000008",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to mark a row for remapping",
    74: "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL)",
    149: "NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000)",
    154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
}


def bus_id(gpu: int) -> str:
    """The kernel's spelling (domain:bus:device) of GPU `gpu`'s PCI address."""
    bus = HGX_BUSES[gpu] if gpu < len(HGX_BUSES) else 0xC0 + gpu
    return f"0000:{bus:02x}:00"


def gpu_uuid(node: str, gpu: int) -> str:
    h = hashlib.sha256(node.encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{gpu:012x}"


def xid_message(gpu: int, xid: int, text: str | None = None) -> str:
    body = text if text is not None else XID_TEXT.get(xid, f"Xid {xid} (simulated)")
    return f"NVRM: Xid (PCI:{bus_id(gpu)}): {xid}, pid=31337, name=python3, {body}"


def fallen_message(gpu: int) -> str:
    return (
        f"NVRM: The NVIDIA GPU {bus_id(gpu)}.0\nNVRM: (PCI ID: 10de:2330) installed in this system has\n"
        "NVRM: fallen off the bus and is not responding to commands."
    )


class KernelLogs:
    """One kmsg file and one nvidia-smi CSV per simulated node; thread-safe appends."""

    def __init__(self, root: Path, gpus_per_node: int) -> None:
        self.root = root
        self.gpus = gpus_per_node
        self._seq: dict[str, int] = {}
        self._lock = threading.Lock()

    def kmsg_path(self, node: str) -> Path:
        return self.root / node / "kmsg"

    def csv_path(self, node: str) -> Path:
        return self.root / node / "gpus.csv"

    def sysfs(self, node: str) -> FakeSysfs:
        return FakeSysfs(self.root / node / "sys")

    def _ensure_sysfs(self, node: str) -> None:
        if (self.root / node / "sys").exists():
            return
        tree = self.sysfs(node)
        tree.add_ib_port("mlx5_0", 1)
        for g in range(self.gpus):
            tree.add_pci(f"{bus_id(g)}.0")

    def ensure(self, node: str, model: str) -> None:
        """Create a node's files once ("boot": the driver announces each GPU)."""
        self._ensure_sysfs(node)
        if self.kmsg_path(node).exists():
            return
        d = self.root / node
        d.mkdir(parents=True, exist_ok=True)
        rows = [f"{g}, 0000{bus_id(g).upper()}.0, {gpu_uuid(node, g)}, {model}" for g in range(self.gpus)]
        (d / "gpus.csv").write_text("\n".join(rows) + "\n")
        announce = [f"NVRM: GPU at PCI:{bus_id(g)}: {gpu_uuid(node, g)}" for g in range(self.gpus)]
        self.write(node, [DRIVER, *announce])

    def _next_seq(self, node: str) -> int:
        if node not in self._seq:
            last = -1
            path = self.kmsg_path(node)
            if path.exists():  # a restarted simulator continues the sequence
                for line in path.read_text(errors="replace").splitlines()[-1:]:
                    rec = parse_record(line)
                    last = rec.seq if rec else -1
            self._seq[node] = last + 1
        seq = self._seq[node]
        self._seq[node] = seq + 1
        return seq

    def write(self, node: str, messages: list[str], level: int = 3) -> None:
        """Append records, as the kernel would, stamped with CLOCK_MONOTONIC like /dev/kmsg."""
        with self._lock:
            self.kmsg_path(node).parent.mkdir(parents=True, exist_ok=True)
            with self.kmsg_path(node).open("a") as fh:
                for m in messages:
                    fh.write(format_record(self._next_seq(node), int(time.monotonic() * 1e6), m, level))
