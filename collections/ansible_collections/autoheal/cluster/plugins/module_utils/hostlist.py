# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""Slurm hostlists (``gpu-[1-3,7],cpu-01``), in pure Python: a batch of nodes goes to scontrol as
one hostlist, and the node lists Slurm prints come back as hostlists."""

from __future__ import annotations

import re
from typing import Iterable

_RANGE_RE = re.compile(r"(\d+)(?:-(\d+))?")
_BRACKET_RE = re.compile(r"\[([^\]]*)\]")
_TRAILING_NUMBER_RE = re.compile(r"(.*?)(\d+)")


def _split_top(text: str) -> list[str]:
    """Split on the commas that are not inside brackets."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p]


def _width(digits: str) -> int:
    """Zero-padded numbers keep their width (``n08``); others have none."""
    return len(digits) if digits.startswith("0") and len(digits) > 1 else 0


def _number(n: int, width: int) -> str:
    return str(n).zfill(width) if width else str(n)


def _expand_one(expr: str) -> list[str]:
    m = _BRACKET_RE.search(expr)
    if not m:
        return [expr]
    head, body, tail = expr[: m.start()], m.group(1), expr[m.end() :]
    out: list[str] = []
    for item in body.split(","):
        r = _RANGE_RE.fullmatch(item.strip())
        if not r:
            raise ValueError(f"bad hostlist range {item!r} in {expr!r}")
        lo, hi = r.group(1), r.group(2) or r.group(1)
        for i in range(int(lo), int(hi) + 1):
            out.extend(_expand_one(head + _number(i, _width(lo)) + tail))
    return out


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm hostlist such as ``gpu-[1-3,7],cpu-01`` into node names (order kept)."""
    out: dict[str, None] = {}
    for part in _split_top((text or "").strip()):
        for name in _expand_one(part):
            out.setdefault(name, None)
    return list(out)


def _ranges(nums: list[int]) -> list[tuple[int, int]]:
    """Sorted runs of consecutive numbers: [1, 2, 3, 5] -> [(1, 3), (5, 5)]."""
    nums = sorted(nums)
    runs = [(nums[0], nums[0])]
    for n in nums[1:]:
        start, prev = runs[-1]
        runs[-1:] = [(start, n)] if n == prev + 1 else [(start, prev), (n, n)]
    return runs


def compress_hostlist(names: Iterable[str]) -> str:
    """Compress node names into a Slurm hostlist (``gpu-1,gpu-2,gpu-3`` -> ``gpu-[1-3]``).

    Only a trailing number is ranged; prefixes keep their order of first appearance, names
    without a number come first. Zero-padded numbers are ranged only with numbers of the same
    width.
    """
    plain: list[str] = []
    groups: dict[tuple[str, int], list[int]] = {}
    for name in names:
        m = _TRAILING_NUMBER_RE.fullmatch(name)
        if not m:
            plain.append(name)
            continue
        nums = groups.setdefault((m.group(1), _width(m.group(2))), [])
        if int(m.group(2)) not in nums:
            nums.append(int(m.group(2)))
    parts = list(plain)
    for (prefix, width), nums in groups.items():
        if len(nums) == 1:
            parts.append(prefix + _number(nums[0], width))
            continue
        body = ",".join(
            _number(a, width) if a == b else f"{_number(a, width)}-{_number(b, width)}"
            for a, b in _ranges(nums)
        )
        parts.append(f"{prefix}[{body}]")
    return ",".join(parts)
