"""RandomSecret and SshHostKey: secrets generated once, kept in Pulumi state as secrets.

The munge key and the runner's webhook token must be random, stable across `pulumi up`s, and never
typed into stack config. `pulumi_random` would do, but its provider is a plugin that offline
machines (the lab, CI) cannot download or build; this small dynamic provider runs inside the
Python language host instead, so the real engine can deploy the stack with no plugin but
Kubernetes. The value is made by `secrets.token_bytes` on create and only changes when `length`
does; every output carrying it is marked secret. The login node's SSH host key is made the same way
(with `cryptography`), so users' known_hosts entries survive a restart of the login pod.
"""

from __future__ import annotations

import base64
import secrets
import uuid
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider

SECRET_OUTPUTS = ["base64", "hex", "token"]


class _RandomSecretProvider(ResourceProvider):
    serialize_as_secret_always = False  # the provider captures nothing secret

    def create(self, props: dict[str, Any]) -> CreateResult:
        raw = secrets.token_bytes(int(props["length"]))
        return CreateResult(
            id_=uuid.uuid4().hex,
            outs={
                "length": int(props["length"]),
                "base64": base64.b64encode(raw).decode(),
                "hex": raw.hex(),
                # A token for HTTP headers and files: URL-safe, no padding, no newline.
                "token": base64.urlsafe_b64encode(raw).decode().rstrip("="),
            },
        )

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = int(olds.get("length", -1)) != int(news["length"])
        return DiffResult(changes=changed, replaces=["length"] if changed else [])


class RandomSecret(Resource):
    """`length` random bytes; outputs `base64`, `hex` and `token` (URL-safe base64), all secret."""

    base64: pulumi.Output[str]
    hex: pulumi.Output[str]
    token: pulumi.Output[str]

    def __init__(self, name: str, length: int, opts: pulumi.ResourceOptions | None = None) -> None:
        if length < 16:
            raise ValueError(f"RandomSecret {name}: length must be at least 16 bytes")
        secret_opts = pulumi.ResourceOptions(additional_secret_outputs=SECRET_OUTPUTS)
        super().__init__(
            _RandomSecretProvider(),
            name,
            {"length": length, "base64": None, "hex": None, "token": None},
            pulumi.ResourceOptions.merge(opts, secret_opts),
        )


class _SshHostKeyProvider(ResourceProvider):
    serialize_as_secret_always = False

    def create(self, props: dict[str, Any]) -> CreateResult:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        key = Ed25519PrivateKey.generate()
        private = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ).decode()
        public = (
            key.public_key()
            .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
            .decode()
        )
        return CreateResult(
            id_=uuid.uuid4().hex,
            outs={"comment": props["comment"], "private_key": private, "public_key": public},
        )

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = olds.get("comment") != news.get("comment")
        return DiffResult(changes=changed, replaces=["comment"] if changed else [])


class SshHostKey(Resource):
    """An ed25519 SSH host key made once, so a login node keeps its identity across restarts
    (users' known_hosts stay valid). `private_key` is secret; `public_key` is for known_hosts."""

    private_key: pulumi.Output[str]
    public_key: pulumi.Output[str]

    def __init__(self, name: str, comment: str, opts: pulumi.ResourceOptions | None = None) -> None:
        secret_opts = pulumi.ResourceOptions(additional_secret_outputs=["private_key"])
        super().__init__(
            _SshHostKeyProvider(),
            name,
            {"comment": comment, "private_key": None, "public_key": None},
            pulumi.ResourceOptions.merge(opts, secret_opts),
        )
