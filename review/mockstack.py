"""Run a Pulumi program under the SDK's mocks and record every resource it declares.

Two users: the review "previews" a stack whose cloud cannot be reached here (an EKS stack) by
running the program of both revisions under mocks and comparing what they declare; the component
tests assert on the same records. Only cloud APIs are simulated: the program, the components and
the Kubernetes objects they render are the real code. Public SDK API only (`set_mocks`, `Mocks`,
`MockMonitor`, `pulumi.runtime.test`, `set_all_config`) plus Pulumi's documented wire format for
secrets and aliases.

It also runs as a script, so the review can run another revision's program in a subprocess with
that checkout first on sys.path (the script imports nothing of this project):

    python review/mockstack.py PROJECT_DIR STACK OUT.json
"""

from __future__ import annotations

import base64
import json
import runpy
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockMonitor

# Pulumi's property wire format: a secret is {SIG_KEY: SECRET_SIG, "value": v}.
SIG_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"  # noqa: S105 (a marker, not a secret)
# Fixed stand-ins for generated values, identical for both revisions: a diff never shows them.
FAKE_SECRET = b"\x01" * 32
FAKE_HOST_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nfake\n-----END OPENSSH PRIVATE KEY-----\n"
# An EKS cluster's OIDC issuer (the cluster's name is appended) and its VPC, as EKS reports them.
FAKE_OIDC_ISSUER = "https://oidc.eks.us-east-1.amazonaws.com/id"
FAKE_VPC = {"vpcId": "vpc-0fake", "clusterSecurityGroupId": "sg-0fakecluster"}
# Resources whose ARN a program reads, and the service:region:account:kind part of it.
_ARN_TYPES = {
    "aws:iam/policy:Policy": "iam::123456789012:policy",
    "aws:efs/fileSystem:FileSystem": "elasticfilesystem:us-east-1:123456789012:file-system",
    "aws:ec2/placementGroup:PlacementGroup": "ec2:us-east-1:123456789012:placement-group",
}
DYNAMIC = "pulumi-python:dynamic:Resource"
STACK_TYPE = "pulumi:pulumi:Stack"


@dataclass
class Res:
    """One declared resource: its URN, inputs (secrets unwrapped) and where it came from."""

    urn: str
    type: str
    name: str
    inputs: dict[str, Any]
    parent: str
    custom: bool
    aliases: list[str] = field(default_factory=list)
    dependencies: list[str] = field(default_factory=list)  # URNs of its explicit depends_on

    @property
    def k8s_name(self) -> str | None:
        meta = self.inputs.get("metadata")
        return meta.get("name") if isinstance(meta, dict) else None


@dataclass
class Recorded:
    resources: list[Res] = field(default_factory=list)
    value: Any = None

    def of_type(self, typ: str) -> list[Res]:
        return [r for r in self.resources if r.type == typ]

    def one(self, typ: str, k8s_name: str) -> Res:
        found = [r for r in self.of_type(typ) if r.k8s_name == k8s_name]
        if len(found) != 1:
            raise LookupError(f"{typ} {k8s_name}: found {len(found)} of {self.types()}")
        return found[0]

    def by_urn(self, urn: str) -> Res | None:
        return next((r for r in self.resources if r.urn == urn), None)

    def types(self) -> list[str]:
        return sorted(f"{r.type} {r.k8s_name or r.name}" for r in self.resources)


def make_urn(stack: str, project: str, parent_urn: str, typ: str, name: str) -> str:
    """A resource's URN as the engine makes it: the type is qualified by the parent's qualified
    type (`parent$type`), except under the root stack."""
    parent_type = parent_urn.split("::")[2] if parent_urn else ""
    if parent_type and parent_type != STACK_TYPE:
        typ = f"{parent_type}${typ}"
    return f"urn:pulumi:{stack}::{project}::{typ}::{name}"


def unwrap_secrets(value: Any) -> Any:
    if isinstance(value, dict):
        if value.get(SIG_KEY) == SECRET_SIG and "value" in value:
            return unwrap_secrets(value["value"])
        return {k: unwrap_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap_secrets(v) for v in value]
    return value


class FakeCloud(pulumi.runtime.Mocks):
    """What the providers would answer: inputs echoed, plus the outputs our programs read."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        outs = dict(args.inputs)
        if args.typ == DYNAMIC and "comment" in outs:  # components.secrets.SshHostKey
            outs.update(private_key=FAKE_HOST_KEY, public_key="ssh-ed25519 AAAAfake " + outs["comment"])
        elif args.typ == DYNAMIC:  # components.secrets.RandomSecret
            outs.update(
                base64=base64.b64encode(FAKE_SECRET).decode(),
                hex=FAKE_SECRET.hex(),
                token=base64.urlsafe_b64encode(FAKE_SECRET).decode().rstrip("="),
            )
        elif args.typ == "aws:eks/cluster:Cluster":
            outs.update(
                name=args.name,
                endpoint="https://eks.example",
                certificateAuthority={"data": "Q0E="},
                identities=[{"oidcs": [{"issuer": f"{FAKE_OIDC_ISSUER}/{args.name}"}]}],
                vpcConfig={**outs.get("vpcConfig", {}), **FAKE_VPC},
            )
        elif args.typ == "aws:iam/role:Role":
            outs.update(name=args.name, arn=f"arn:aws:iam::123456789012:role/{args.name}")
        elif args.typ == "aws:iam/openIdConnectProvider:OpenIdConnectProvider":
            host_path = str(outs.get("url", "")).removeprefix("https://")
            outs.update(arn=f"arn:aws:iam::123456789012:oidc-provider/{host_path}")
        elif args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            outs.update(latestVersion=1)
        elif args.typ == "aws:ec2/placementGroup:PlacementGroup":
            outs.update(name=args.name, arn=f"arn:aws:{_ARN_TYPES[args.typ]}/{args.name}")
        elif args.typ in _ARN_TYPES:
            outs.update(arn=f"arn:aws:{_ARN_TYPES[args.typ]}/{args.name}")
        return f"{args.name}-id", outs

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], None]:
        return {}, None


class RecordingMonitor(MockMonitor):
    """The SDK's mock monitor, also keeping each registration's parent, inputs and aliases."""

    def __init__(self, mocks: pulumi.runtime.Mocks, recorded: Recorded, stack: str, project: str) -> None:
        super().__init__(mocks)
        self.recorded, self.stack, self.project = recorded, stack, project

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        # The SDK's mock qualifies a type by the parent's own type only; aliases and diffs
        # against engine URNs need the engine's rule.
        return make_urn(self.stack, self.project, parent, type_, name)

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)  # type: ignore[no-untyped-call]
        if request.type != STACK_TYPE:
            self.recorded.resources.append(
                Res(
                    urn=response.urn,
                    type=request.type,
                    name=request.name,
                    inputs=unwrap_secrets(rpc.deserialize_properties(request.object)),
                    parent=request.parent,
                    custom=request.custom,
                    aliases=[self._alias_urn(a, request) for a in request.aliases],
                    dependencies=sorted(request.dependencies),
                )
            )
        return response

    def _alias_urn(self, alias: Any, request: Any) -> str:
        if alias.WhichOneof("alias") == "urn":
            return str(alias.urn)
        spec = alias.spec
        parent = "" if spec.WhichOneof("parent") == "noParent" else (spec.parentUrn or request.parent)
        return make_urn(
            spec.stack or self.stack,
            spec.project or self.project,
            parent,
            spec.type or request.type,
            spec.name or request.name,
        )


def run_program(
    fn: Callable[[], Any],
    config: Mapping[str, str] | None = None,
    project: str = "autoheal",
    stack: str = "test",
) -> Recorded:
    """Run `fn` as a Pulumi program under mocks; its return value (Outputs allowed) is resolved
    into `Recorded.value`. `config` keys are full (`autoheal:pools`), values as Pulumi passes them."""
    recorded = Recorded()
    mocks = FakeCloud()
    monitor = RecordingMonitor(mocks, recorded, stack, project)
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=monitor)
    pulumi.runtime.set_all_config(dict(config or {}))

    def program() -> pulumi.Output[Any]:
        return pulumi.Output.from_input(fn()).apply(lambda v: setattr(recorded, "value", v))

    # `test` runs the program and waits for every registration and output it started.
    pulumi.runtime.test(program)()  # type: ignore[no-untyped-call]
    return recorded


def stack_config(project_dir: Path, stack: str) -> dict[str, str]:
    """The config the engine would pass: Pulumi.yaml's defaults, overridden by Pulumi.<stack>.yaml,
    objects and lists as JSON text, scalars as strings."""
    project_doc = yaml.safe_load((project_dir / "Pulumi.yaml").read_text()) or {}
    name = str(project_doc.get("name", "project"))
    out: dict[str, Any] = {
        f"{name}:{k}": spec["default"]
        for k, spec in (project_doc.get("config") or {}).items()
        if isinstance(spec, dict) and "default" in spec
    }
    stack_doc = yaml.safe_load((project_dir / f"Pulumi.{stack}.yaml").read_text()) or {}
    out.update({k if ":" in k else f"{name}:{k}": v for k, v in (stack_doc.get("config") or {}).items()})
    return {k: _config_text(v) for k, v in out.items()}


def _config_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value)


def run_project(project_dir: Path, stack: str) -> Recorded:
    """Run a project's `__main__.py` as the engine would for `stack`, under mocks."""
    project_doc = yaml.safe_load((project_dir / "Pulumi.yaml").read_text()) or {}
    config = stack_config(project_dir, stack)
    main = project_dir / "__main__.py"

    def program() -> None:
        runpy.run_path(str(main), run_name="__main__")

    return run_program(
        program,
        config=config,
        project=str(project_doc.get("name", "project")),
        stack=stack,
    )


def dump(recorded: Recorded) -> list[dict[str, Any]]:
    return [asdict(r) for r in recorded.resources]


def load(rows: Iterable[Mapping[str, Any]]) -> Recorded:
    return Recorded([Res(**dict(r)) for r in rows])


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: mockstack.py PROJECT_DIR STACK OUT.json", file=sys.stderr)
        return 2
    project_dir, stack, out = Path(argv[0]).resolve(), argv[1], Path(argv[2])
    # This file's own folder must not shadow the project's packages.
    sys.path[:] = [
        str(project_dir),
        *(p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent),
    ]
    try:
        recorded = run_project(project_dir, stack)
    except Exception as exc:  # the program's own error, reported as the review's finding
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    out.write_text(json.dumps(dump(recorded), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
