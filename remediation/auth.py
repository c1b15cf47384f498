"""Bearer-token authentication of the webhook, compared in constant time.

The token lives in a file (a mounted Kubernetes secret) rather than in the config, so it never
appears in a config dump or a process listing.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from remediation.errors import AuthError, RunnerConfigError

MIN_TOKEN_LENGTH = 16


def load_token(path: Path) -> bytes:
    """Read the shared bearer token; refuse a missing, empty or short one."""
    try:
        token = path.read_bytes().strip()
    except OSError as exc:
        raise RunnerConfigError(f"token_file {path}: cannot read the bearer token: {exc}") from exc
    if len(token) < MIN_TOKEN_LENGTH:
        raise RunnerConfigError(
            f"token_file {path}: the bearer token must be at least {MIN_TOKEN_LENGTH} bytes"
        )
    return token


def check_bearer(header: str | None, token: bytes) -> None:
    """Raise AuthError unless `header` is exactly `Bearer <token>` (constant-time compare)."""
    if not header:
        raise AuthError("missing Authorization header")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        raise AuthError("Authorization must use the Bearer scheme")
    if not hmac.compare_digest(presented.strip().encode("utf-8", "replace"), token):
        raise AuthError("invalid bearer token")
