"""The real Pulumi engine, offline: deploy a revision, preview another with the policy pack.

The caller gives the environment (the CLI on PATH, the state backend, the passphrase, no plugin
downloads: scripts/review.sh builds it with lab.pulumi_env), so this module never decides where
state lives. Each revision runs from its own copy of the project, with the project's virtualenv
linked in, so nothing in the checkout is written. The preview streams the engine's events,
from which the review reads every step (review.plan) and every policy violation.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from review.model import CannotRun, Violation

FLAGS = ("--non-interactive", "--color", "never")
NO_RUN_PLUGIN = "RunPlugin not implemented"  # a language host that cannot start policy packs
# `preview --json` streams engine events as JSON lines instead of printing one digest, which
# carries no policy events.
STREAM_ENV = "PULUMI_ENABLE_STREAMING_JSON_PREVIEW"
# Set by scripts/review.sh when it could not make the engine's environment (a tool not built).
MISSING_ENV = "AUTOHEAL_REVIEW_ENGINE_MISSING"


@dataclass(frozen=True)
class Engine:
    env: Mapping[str, str]
    venv: Path  # the project's virtualenv (Pulumi.yaml: virtualenv .venv)
    timeout: float = 900

    def binary(self) -> str:
        missing = self.env.get(MISSING_ENV)
        if missing:
            raise CannotRun(missing)
        found = shutil.which("pulumi", path=self.env.get("PATH", ""))
        if found is None:
            raise CannotRun(
                "no pulumi CLI on PATH (scripts/build-tools.sh builds it into ~/.cache/autoheal/bin)"
            )
        return found

    def run(
        self, project: Path, *args: str, extra_env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        link = project / ".venv"
        if not link.exists():
            link.symlink_to(self.venv)
        return subprocess.run(
            [self.binary(), *args, *FLAGS],
            cwd=project,
            env={**self.env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=self.timeout,
            check=False,
        )

    def select(self, project: Path, stack: str) -> None:
        res = self.run(project, "stack", "select", "--create", stack)
        if res.returncode != 0:
            raise CannotRun(f"pulumi stack select {stack}: {_tail(res)}")


def kube_unreachable(kubeconfig: Path) -> str | None:
    """Why the Kubernetes API of `kubeconfig` cannot be used, or None when it answers."""
    if not kubeconfig.is_file():
        return f"no kubeconfig at {kubeconfig}"
    try:
        from kubernetes import client, config

        api = config.new_client_from_config(str(kubeconfig))
        try:
            client.VersionApi(api).get_code(_request_timeout=5)
        finally:
            api.close()
    except Exception as exc:  # any failure to talk to the API means the same to the review
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return None


def write_stack_config(project: Path, stack: str, out: Path, kubeconfig: Path | None) -> Path:
    """The stack's config file, pointed at `kubeconfig` when given (the lab the review uses)."""
    doc: dict[str, Any] = yaml.safe_load((project / f"Pulumi.{stack}.yaml").read_text()) or {}
    if kubeconfig is not None:
        cluster = doc.setdefault("config", {}).setdefault("autoheal:cluster", {})
        cluster.update({"backend": "kubeconfig", "kubeconfig": str(kubeconfig)})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def deploy(engine: Engine, project: Path, stack: str, config: Path) -> None:
    """`pulumi up` of the revision in `project` (the baseline a change is previewed against)."""
    engine.select(project, stack)
    res = engine.run(project, "up", "--yes", "--skip-preview", "--stack", stack, "--config-file", str(config))
    if res.returncode != 0:
        raise RuntimeError(f"pulumi up of the baseline failed: {_tail(res)}")


def preview(
    engine: Engine,
    project: Path,
    stack: str,
    config: Path,
    policy: Path | None,
    event_log: Path,
    exclude: Iterable[str] = (),
) -> subprocess.CompletedProcess[str]:
    """`pulumi preview` with the policy pack, its engine events (JSON lines: every step, every
    policy violation, every diagnostic) streamed to stdout and kept in `event_log`."""
    engine.select(project, stack)
    args = ["preview", "--json", "--stack", stack, "--config-file", str(config)]
    if policy is not None:
        args += ["--policy-pack", str(policy)]
    for urn in exclude:
        args += ["--exclude", urn]
    res = engine.run(project, *args, extra_env={STREAM_ENV: "true"})
    event_log.write_text(res.stdout)
    return res


def violations_from_events(events: Iterable[Mapping[str, Any]]) -> list[Violation]:
    out = []
    for event in events:
        pe = event.get("policyEvent")
        if pe and not pe.get("exceptions"):
            out.append(
                Violation(
                    rule=str(pe.get("policyName", "?")),
                    resource=str(pe.get("resourceUrn", "")),
                    message=str(pe.get("message", "")).strip(),
                    level=str(pe.get("enforcementLevel", "mandatory")),
                )
            )
    return out


def pack_loaded(events: Iterable[Mapping[str, Any]]) -> bool:
    return any("policyLoadEvent" in e or "policyAnalyzeSummaryEvent" in e for e in events)


def errors_from_events(events: Iterable[Mapping[str, Any]]) -> list[str]:
    """The engine's and the program's error messages (a failed preview says why here)."""
    out = []
    for event in events:
        diag = event.get("diagnosticEvent") or {}
        if diag.get("severity") == "error" and str(diag.get("message", "")).strip():
            out.append(str(diag["message"]).strip())
        err = (event.get("errorEvent") or {}).get("error")
        if err:
            out.append(str(err).strip())
    return out


def _tail(res: subprocess.CompletedProcess[str], lines: int = 15) -> str:
    text = (res.stdout + "\n" + res.stderr).strip().splitlines()
    return "\n".join(text[-lines:])
