"""Run a Pulumi program under mocks and keep what it registered, with parents and inputs.

Every component test builds resources through `run_program`, then asserts on the recorded inputs
(the Kubernetes objects exactly as the provider would receive them, camelCase keys).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.settings import SETTINGS
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

ROOT = Path(__file__).resolve().parents[2]
FAKE_SECRET = b"\x01" * 32
FAKE_HOST_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nfake\n-----END OPENSSH PRIVATE KEY-----\n"
DYNAMIC = "pulumi-python:dynamic:Resource"


@dataclass
class Res:
    urn: str
    type: str
    name: str
    inputs: dict[str, Any]
    parent: str
    custom: bool

    @property
    def k8s_name(self) -> str | None:
        return (self.inputs.get("metadata") or {}).get("name")


@dataclass
class Recorded:
    resources: list[Res] = field(default_factory=list)
    value: Any = None

    def of_type(self, typ: str) -> list[Res]:
        return [r for r in self.resources if r.type == typ]

    def one(self, typ: str, k8s_name: str) -> Res:
        found = [r for r in self.of_type(typ) if r.k8s_name == k8s_name]
        assert len(found) == 1, f"{typ} {k8s_name}: found {len(found)} of {self.types()}"
        return found[0]

    def by_urn(self, urn: str) -> Res | None:
        return next((r for r in self.resources if r.urn == urn), None)

    def types(self) -> list[str]:
        return sorted(f"{r.type} {r.k8s_name or r.name}" for r in self.resources)


class _Mocks(pulumi.runtime.Mocks):
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        outs = dict(args.inputs)
        if args.typ == DYNAMIC and "comment" in outs:  # SshHostKey
            outs.update(private_key=FAKE_HOST_KEY, public_key="ssh-ed25519 AAAAfake " + outs["comment"])
        elif args.typ == DYNAMIC:  # RandomSecret
            outs.update(
                base64=base64.b64encode(FAKE_SECRET).decode(),
                hex=FAKE_SECRET.hex(),
                token=base64.urlsafe_b64encode(FAKE_SECRET).decode().rstrip("="),
            )
        if args.typ == "aws:eks/cluster:Cluster":
            outs.update(
                name=args.name,
                endpoint="https://eks.example",
                certificateAuthority={"data": "Q0E="},
            )
        if args.typ == "aws:iam/role:Role":
            outs.update(name=args.name, arn=f"arn:aws:iam::123456789012:role/{args.name}")
        return f"{args.name}-id", outs

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], None]:
        return {}, None


class _Monitor(MockMonitor):
    def __init__(self, mocks: pulumi.runtime.Mocks, recorded: Recorded) -> None:
        super().__init__(mocks)
        self.recorded = recorded

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            inputs = rpc.deserialize_properties(request.object)
            self.recorded.resources.append(
                Res(
                    urn=response.urn,
                    type=request.type,
                    name=request.name,
                    inputs=_plain(inputs),
                    parent=request.parent,
                    custom=request.custom,
                )
            )
        return response


def _plain(value: Any) -> Any:
    """Secrets arrive wrapped ({'4dabf18193072939515e22adb298388d': ..., 'value': v}); unwrap."""
    if isinstance(value, dict):
        if rpc._special_sig_key in value and "value" in value:
            return _plain(value["value"])
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def run_program(fn: Callable[[], Any], config: dict[str, str] | None = None) -> Recorded:
    """Run `fn` as a Pulumi program under mocks; `fn`'s return value (Outputs allowed) is resolved
    into `Recorded.value`."""
    recorded = Recorded()
    mocks = _Mocks()
    pulumi.runtime.set_mocks(
        mocks, project="autoheal", stack="test", preview=False, monitor=_Monitor(mocks, recorded)
    )
    pulumi.runtime.set_all_config({f"autoheal:{k}": v for k, v in (config or {}).items()})
    SETTINGS.rpc_manager.clear()
    SETTINGS.outputs.clear()

    def program() -> None:
        out = pulumi.Output.from_input(fn())
        recorded.value = _sync_await(out.future())

    _sync_await(run_pulumi_func(program))
    return recorded


def lab_stack_raw() -> dict[str, Any]:
    """Pulumi.lab.yaml's config, keys without the project prefix."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "Pulumi.lab.yaml").read_text())
    return {k.split(":", 1)[1]: v for k, v in doc["config"].items() if k.startswith("autoheal:")}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in container.get("env", [])}


def pod_spec(res: Res) -> dict[str, Any]:
    spec: dict[str, Any] = res.inputs["spec"]["template"]["spec"]
    return spec
