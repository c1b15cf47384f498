"""The shell blocks of the project's Markdown and the mark each carries (issue 21).

Every ```sh / ```bash / ```shell / ```console block in README.md and docs/*.md is preceded by an
HTML comment saying how the docs test treats it (invisible when the Markdown is rendered):

    <!-- run: lab -->            run as written, from the checkout's root, against the test's lab
    <!-- run: yes -->            run as written, from the checkout's root (needs no lab)
    <!-- run: synopsis -->       a command summary with placeholders: each command's --help runs
    <!-- run: no (why) -->       not run here; why (e.g. "needs an AWS account", "tested by tests/x.py")

A block without a mark fails the test, so a new one cannot slip through untested.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SHELL_LANGS = ("sh", "bash", "shell", "console")
KINDS = ("lab", "yes", "synopsis", "no")
_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_MARK = re.compile(r"^<!--\s*run:\s*(lab|yes|synopsis|no)\b\s*(?:\((.*)\))?\s*-->$")
_TESTED_BY = re.compile(r"tested by (tests/[\w/.-]+\.py)")


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    kind: str | None  # None: no mark
    reason: str

    @property
    def where(self) -> str:
        return f"{self.doc.name}:{self.line}"

    @property
    def tested_by(self) -> list[str]:
        return _TESTED_BY.findall(self.reason)


def documents(repo: Path) -> list[Path]:
    """README.md first, then docs/*.md: the order a newcomer reads them."""
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def shell_blocks(doc: Path) -> list[Block]:
    text = doc.read_text()
    out = []
    for m in _FENCE.finditer(text):
        lang = m.group(1).lower()
        if lang not in SHELL_LANGS:
            continue
        before = text[: m.start()].rstrip("\n").splitlines()
        mark = _MARK.match(before[-1].strip()) if before else None
        out.append(
            Block(
                doc=doc,
                line=text.count("\n", 0, m.start()) + 1,
                lang=lang,
                code=m.group(2),
                kind=mark.group(1) if mark else None,
                reason=(mark.group(2) or "").strip() if mark else "",
            )
        )
    return out


def synopsis_commands(code: str) -> list[list[str]]:
    """The command words of each line of a synopsis, up to the first placeholder or option
    (`autoheal incident show ID` -> [autoheal, incident, show]); `a b | c` gives `a b` and `a c`."""
    commands: list[list[str]] = []
    for raw in code.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        alternatives = [part.split() for part in line.split(" | ")]
        first = _words(alternatives[0])
        commands.append(first)
        for alt in alternatives[1:]:
            commands.append([*first[:-1], *_words(alt)])
    return commands


def _words(tokens: list[str]) -> list[str]:
    words = []
    for tok in tokens:
        if not re.fullmatch(r"[a-z][a-z0-9_./-]*", tok) or tok.startswith("-"):
            break
        words.append(tok)
    return words
