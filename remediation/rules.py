"""Routing rules: which alert runs which playbook, shaped like an Event-Driven Ansible rulebook.

A rules file is a list of rulesets, each with `rules`; a rule has a `condition`, an
`action.run_playbook` (playbook name + static extra vars) and an optional `throttle`
(`once_within`, `group_by_attributes`), so ansible-rulebook accepts the same file (its schema
refuses any other key in a rule; tests/packaging runs its validation on every shipped file).
autoheal-specific keys therefore live in the action's extra vars, under `autoheal_routing` (which
labels name the node, GPU and XID, the fault class used for dedup, a per-rule dry run): the runner
reads them and never passes them to the play.

Conditions are a strict subset of the rulebook language - label comparisons joined by `and`:
    event.alert.labels.alertname == "GpuXidFatal" and event.alert.labels.severity != "info"
Everything is validated at load time; an error names the file, the rule and the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autoheal.xid import Tier
from autoheal.yamlfile import read_yaml
from remediation.errors import RulesError

CONTRACT_VARS = frozenset(
    {
        "autoheal_nodes",
        "autoheal_incident_ids",
        "autoheal_xid",
        "autoheal_gpu",
        "autoheal_tier",
        "autoheal_opt_out",
        "autoheal_dry_run",
        "autoheal_journal_events",
        "autoheal_signal_ledger",
        "autoheal_done_phases",
        "autoheal_stop_after",
    }
)
# The extra var holding a rule's autoheal settings (docs/operations.md, "Routing rules").
ROUTING_VAR = "autoheal_routing"
ROUTING_PATH = f"action.run_playbook.extra_vars.{ROUTING_VAR}"
_VAR_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")
_PLAYBOOK = re.compile(r"^(?:playbooks/)?([a-z0-9_][a-z0-9_-]{0,63}\.ya?ml)$")
_LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
_TERM = re.compile(rf'^event\.alert\.labels\.({_LABEL})\s*(==|!=)\s*"([^"\\{{}}]*)"$')
_DURATION = re.compile(r"^(\d+)\s*(second|minute|hour|day)s?$")
_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
_TEMPLATE_MARKS = ("{{", "{%", "{#")


@dataclass(frozen=True)
class LabelMatch:
    """One term of a rule's condition: `event.alert.labels.<label> == "<value>"` (or `!=`)."""

    label: str
    op: str
    value: str

    def matches(self, labels: dict[str, str]) -> bool:
        actual = labels.get(self.label)
        return (actual == self.value) if self.op == "==" else (actual != self.value)


def parse_condition(text: str) -> tuple[LabelMatch, ...]:
    """Parse `event.alert.labels.X == "v" and ...`; raise ValueError on anything else."""
    parts = [p.strip() for p in re.split(r"\s+and\s+", text.strip())]
    terms: list[LabelMatch] = []
    for part in parts:
        m = _TERM.fullmatch(part)
        if m is None:
            raise ValueError(
                f'unsupported condition term {part!r}: use event.alert.labels.<name> == "<value>"'
                " (or !=), joined by 'and'"
            )
        terms.append(LabelMatch(m.group(1), m.group(2), m.group(3)))
    if not any(t.op == "==" and t.label == "alertname" for t in terms):
        raise ValueError("the condition must pin event.alert.labels.alertname with ==")
    return tuple(terms)


def parse_duration(text: str) -> int:
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not a duration like '10 minutes'")
    return int(m.group(1)) * _UNITS[m.group(2)]


def check_extra_var(name: str, value: Any) -> Any:
    """Rule extra vars are static and typed: ints, floats, bools and plain strings only."""
    if not _VAR_NAME.fullmatch(name):
        raise ValueError(f"extra var name {name!r} must match {_VAR_NAME.pattern}")
    if name in CONTRACT_VARS:
        raise ValueError(f"extra var {name!r} is set by the runner and cannot be set by a rule")
    if isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        if len(value) > 256 or any(m in value for m in _TEMPLATE_MARKS) or "\n" in value:
            raise ValueError(
                f"extra var {name!r}: strings must be one line, <= 256 characters, without Jinja delimiters"
            )
        return value
    raise ValueError(f"extra var {name!r}: only int, float, bool and string values are allowed")


class _RunPlaybook(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    extra_vars: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        m = _PLAYBOOK.fullmatch(v)
        if m is None:
            raise ValueError(f"{v!r}: a playbook is named like playbooks/<name>.yml (no paths)")
        return m.group(1)

    @field_validator("extra_vars")
    @classmethod
    def _vars(cls, v: dict[str, Any]) -> dict[str, Any]:
        # the routing settings are a mapping read by parse_rules, not a play input
        return {k: x if k == ROUTING_VAR else check_extra_var(k, x) for k, x in v.items()}


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    run_playbook: _RunPlaybook


class _Throttle(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    once_within: str | None = None
    group_by_attributes: list[str] = Field(default_factory=list)

    @field_validator("once_within")
    @classmethod
    def _dur(cls, v: str | None) -> str | None:
        if v is not None:
            parse_duration(v)
        return v

    @field_validator("group_by_attributes")
    @classmethod
    def _attrs(cls, v: list[str]) -> list[str]:
        for a in v:
            if not re.fullmatch(rf"event\.alert\.labels\.{_LABEL}", a):
                raise ValueError(f"{a!r}: group_by_attributes entries are event.alert.labels.<name>")
        return v


class _AutohealOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    node_labels: list[str] = Field(default_factory=lambda: ["node", "Hostname", "hostname"], min_length=1)
    gpu_label: str = "gpu"
    xid_label: str = "xid"
    tier: Tier | None = None
    fault_class: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")
    # the label naming a degraded fault class (autoheal/faults.py): an alert whose value the fault
    # catalogue does not list is refused, and the rung comes from the catalogue
    fault_label: str | None = Field(default=None, pattern=r"^[a-zA-Z_][a-zA-Z0-9_]{0,63}$")
    dry_run: bool = False


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, max_length=200)
    condition: str
    action: _Action
    throttle: _Throttle = _Throttle()
    enabled: bool = True

    @field_validator("condition")
    @classmethod
    def _cond(cls, v: str) -> str:
        parse_condition(v)
        return v


class _Ruleset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    hosts: str = "all"
    sources: list[dict[str, Any]] = Field(default_factory=list)
    rules: list[dict[str, Any]] = Field(min_length=1)


@dataclass(frozen=True)
class Rule:
    """A validated routing rule."""

    name: str
    terms: tuple[LabelMatch, ...]
    playbook: str
    extra_vars: dict[str, Any]
    dedup_window_seconds: int | None
    group_by: tuple[str, ...]
    node_labels: tuple[str, ...]
    gpu_label: str
    xid_label: str
    tier: Tier | None
    fault_class: str
    dry_run: bool
    fault_label: str | None = None

    def matches(self, labels: dict[str, str]) -> bool:
        return all(t.matches(labels) for t in self.terms)


@dataclass(frozen=True)
class Rules:
    rules: tuple[Rule, ...]
    origin: str

    def route(self, labels: dict[str, str]) -> Rule | None:
        """The first enabled rule whose condition matches, or None."""
        return next((r for r in self.rules if r.matches(labels)), None)


def _fmt(exc: ValidationError, prefix: str = "") -> str:
    def where(loc: tuple[int | str, ...]) -> str:
        return ".".join(p for p in (prefix, *(str(x) for x in loc)) if p) or "<rule>"

    return "; ".join(f"{where(e['loc'])}: {e['msg']}" for e in exc.errors())


def _routing(r: _Rule, where: str) -> _AutohealOptions:
    raw = r.action.run_playbook.extra_vars.get(ROUTING_VAR)
    if raw is None:
        return _AutohealOptions()
    if not isinstance(raw, dict):
        raise RulesError(f"{where}: {ROUTING_PATH}: must be a mapping (node_labels, gpu_label, ...)")
    try:
        return _AutohealOptions.model_validate(raw)
    except ValidationError as exc:
        raise RulesError(f"{where}: {_fmt(exc, ROUTING_PATH)}") from exc


def parse_rules(data: Any, origin: str) -> Rules:
    if not isinstance(data, list) or not data:
        raise RulesError(f"{origin}: a rules file is a non-empty list of rulesets")
    out: list[Rule] = []
    names: set[str] = set()
    for si, raw_set in enumerate(data):
        try:
            ruleset = _Ruleset.model_validate(raw_set)
        except ValidationError as exc:
            raise RulesError(f"{origin}: ruleset #{si + 1}: {_fmt(exc)}") from exc
        for ri, raw in enumerate(ruleset.rules):
            label = raw.get("name") if isinstance(raw, dict) else None
            where = f"{origin}: ruleset {ruleset.name!r}, rule {label or '#' + str(ri + 1)!r}"
            if isinstance(raw, dict) and "autoheal" in raw:
                raise RulesError(
                    f"{where}: autoheal: move this block to {ROUTING_PATH} "
                    "(ansible-rulebook refuses keys a rulebook rule does not have)"
                )
            try:
                r = _Rule.model_validate(raw)
            except ValidationError as exc:
                raise RulesError(f"{where}: {_fmt(exc)}") from exc
            if not r.enabled:
                continue
            opts = _routing(r, where)
            if r.name in names:
                raise RulesError(f"{where}: name: another rule has the same name")
            names.add(r.name)
            out.append(
                Rule(
                    name=r.name,
                    terms=parse_condition(r.condition),
                    playbook=r.action.run_playbook.name,
                    extra_vars={
                        k: v for k, v in r.action.run_playbook.extra_vars.items() if k != ROUTING_VAR
                    },
                    dedup_window_seconds=(
                        parse_duration(r.throttle.once_within) if r.throttle.once_within else None
                    ),
                    group_by=tuple(a.rsplit(".", 1)[1] for a in r.throttle.group_by_attributes),
                    node_labels=tuple(opts.node_labels),
                    gpu_label=opts.gpu_label,
                    xid_label=opts.xid_label,
                    tier=opts.tier,
                    fault_class=opts.fault_class or re.sub(r"[^a-z0-9_.-]+", "-", r.name.lower()),
                    dry_run=opts.dry_run,
                    fault_label=opts.fault_label,
                )
            )
    if not out:
        raise RulesError(f"{origin}: no enabled rule")
    return Rules(tuple(out), origin)


def load_rules(path: Path) -> Rules:
    return parse_rules(read_yaml(path, "the rules file", RulesError), str(path))
