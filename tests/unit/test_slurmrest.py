"""The slurmrestd client's own logic (autoheal/slurmrest.py): tokens, parsing, and how each answer
maps to a typed error. slurmrestd's answers here are the shapes measured on Slurm 26.05.5
(tests/slurmrest/test_slurmrest_real.py runs the same client against the real daemons)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from autoheal.backoff import Backoff
from autoheal.slurmrest import (
    SETTING_API,
    SETTING_JWT_KEY,
    SETTING_TOKEN_FILE,
    SETTING_URL,
    SETTING_USER,
    SignedToken,
    SlurmRest,
    SlurmRestAuthError,
    SlurmRestRequestError,
    SlurmRestUnreachable,
    SlurmRestVersionError,
    TokenFile,
    expand_hostlist,
    parse_jobs,
    parse_nodes,
    parse_openapi,
    parse_release,
    sign_hs256,
    token_claims,
)
from components.preflight.slurmrest import check_slurmrest
from tests.support import port_base

KEY = b"k" * 32
NOWHERE = port_base(29499)  # nothing listens here (this module's port)


def openapi(release: str = "26.05.5", parsers: tuple[str, ...] = ("v0.0.44", "v0.0.45")) -> dict[str, Any]:
    return {"info": {"x-slurm": {"release": release, "data_parsers": [{"plugin": p} for p in parsers]}}}


AUTH_511 = {"errors": [{"error_number": 1007, "error": "Protocol authentication error", "description": "x"}]}


class Fixed:
    """A token that never changes (the answers, not the token, are under test here)."""

    setting = SETTING_TOKEN_FILE

    def token(self) -> str:
        return "fixed"

    def refresh(self) -> bool:
        return False


def client(handler: Callable[[httpx.Request], httpx.Response], tokens: Any = None, **kw: Any) -> SlurmRest:
    tokens = tokens if tokens is not None else Fixed()
    return SlurmRest("http://slurmrestd:6820", "root", tokens, transport=httpx.MockTransport(handler), **kw)


def test_sign_hs256_is_a_jwt_slurm_can_verify() -> None:
    token = sign_hs256(KEY, {"exp": 20, "iat": 10, "sun": "root"})
    header, payload, sig = token.split(".")
    want = hmac.new(KEY, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    assert base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4)) == want
    assert json.loads(base64.urlsafe_b64decode(header + "==")) == {"alg": "HS256", "typ": "JWT"}
    assert token_claims(token) == {"exp": 20, "iat": 10, "sun": "root"}
    assert token_claims("not-a-jwt") == {}


def test_signed_token_is_reused_then_resigned_before_expiry(tmp_path: Path) -> None:
    (tmp_path / "key").write_bytes(KEY)
    now = [1000.0]
    src = SignedToken(tmp_path / "key", "root", lifespan=100, refresh_margin=10, clock=lambda: now[0])
    first = src.token()
    assert token_claims(first) == {"iat": 1000, "exp": 1100, "sun": "root"}
    now[0] = 1089.0
    assert src.token() == first and src.signed == 1
    now[0] = 1090.0  # within the margin: a new one
    assert token_claims(src.token())["exp"] == 1190 and src.signed == 2


def test_signed_token_key_problems_name_the_key_setting(tmp_path: Path) -> None:
    with pytest.raises(SlurmRestAuthError, match=rf"set {SETTING_JWT_KEY}") as err:
        SignedToken(tmp_path / "missing", "root").token()
    assert err.value.setting == SETTING_JWT_KEY
    (tmp_path / "short").write_bytes(b"abc")
    with pytest.raises(SlurmRestAuthError, match="has 3 bytes"):
        SignedToken(tmp_path / "short", "root").token()


def test_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("one\n")
    src = TokenFile(f)
    assert src.token() == "one"
    f.write_text("second")
    os.utime(f, ns=(time.time_ns(), time.time_ns() + 10**9))  # a new mtime even on a coarse clock
    assert src.token() == "second"
    assert src.refresh() is False
    f.write_text("")
    os.utime(f, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    with pytest.raises(SlurmRestAuthError, match=f"empty; {SETTING_TOKEN_FILE} must hold a JWT"):
        src.token()


def test_parse_nodes_jobs_and_release() -> None:
    nodes = parse_nodes(
        {
            "nodes": [
                {"name": "a", "state": ["IDLE", "DRAIN"], "reason": "x", "alloc_cpus": 0},
                {"name": "b", "state": ["MIXED", "DYNAMIC_NORM"], "alloc_cpus": {"set": True, "number": 2}},
                {"name": "c", "state": ["DOWN", "NOT_RESPONDING"]},
            ]
        }
    )
    assert (nodes["a"].drained, nodes["a"].busy, nodes["a"].reason) == (True, False, "x")
    assert (nodes["b"].drained, nodes["b"].busy, nodes["b"].dynamic, nodes["b"].alloc_cpus) == (
        False,
        True,
        True,
        2,
    )
    assert nodes["c"].drained
    jobs = parse_jobs(
        {
            "jobs": [
                {
                    "job_id": 7,
                    "job_state": ["RUNNING"],
                    "nodes": "gpu-[1-2]",
                    "priority": {"set": True, "infinite": False, "number": 5},
                    "comment": "checkpoint=12",
                    "job_resources": {"nodes": {"allocation": [{"name": "gpu-1"}, {"name": "gpu-2"}]}},
                },
                {"job_id": 8, "job_state": ["RUNNING", "REQUEUED"], "nodes": "gpu-[09-10],cpu-1"},
                {"job_id": 9, "job_state": ["PENDING"], "nodes": ""},
            ]
        }
    )
    assert [(j.job_id, j.state, j.nodes, j.priority) for j in jobs] == [
        ("7", "RUNNING", ("gpu-1", "gpu-2"), 5),
        ("8", "RUNNING", ("gpu-09", "gpu-10", "cpu-1"), 0),
        ("9", "PENDING", (), 0),
    ]
    assert expand_hostlist("n[1,3-4]x,m") == ["n1x", "n3x", "n4x", "m"]
    assert parse_release("26.05.5") == (26, 5, 5)
    with pytest.raises(SlurmRestVersionError):
        parse_release("unknown")


def test_an_older_slurm_is_refused_naming_its_version() -> None:
    c = client(lambda r: httpx.Response(200, json=openapi("24.11.5", ("v0.0.40", "v0.0.41", "v0.0.42"))))
    with pytest.raises(
        SlurmRestVersionError, match=r"runs Slurm 24\.11\.5; the existing backend needs Slurm 25\.11"
    ):
        c.check()
    rows = check_slurmrest(c)
    assert [(r.name, r.status) for r in rows] == [("slurmrestd reachable", "pass"), ("slurm version", "fail")]
    assert "24.11.5" in rows[1].detail


def test_api_version_is_the_newest_served_or_the_one_set() -> None:
    def handler(r: httpx.Request) -> httpx.Response:
        if r.url.path == "/openapi/v3":
            return httpx.Response(200, json=openapi("25.11.2", ("v0.0.42", "v0.0.43", "v0.0.44")))
        return httpx.Response(200, json={"nodes": [], "errors": []})

    c = client(handler)
    c.check()
    assert c.api_version == "v0.0.44"  # 25.11: no v0.0.45
    with pytest.raises(SlurmRestVersionError, match=rf"no job requeue .* set {SETTING_API}: v0.0.45"):
        c.requeue(["1"])
    pinned = client(handler, api_version="v0.0.45")
    with pytest.raises(
        SlurmRestVersionError, match=rf"does not serve v0.0.45; it serves v0.0.44, .*change {SETTING_API}"
    ):
        pinned.check()
    with pytest.raises(ValueError, match=SETTING_API):
        client(handler, api_version="v0.0.40")
    with pytest.raises(ValueError, match=SETTING_URL):
        SlurmRest("slurmrestd:6820", "root", Fixed())


def test_a_refused_signed_token_is_resigned_and_sent_once_more(tmp_path: Path) -> None:
    (tmp_path / "key").write_bytes(KEY)
    seen: list[str] = []

    def handler(r: httpx.Request) -> httpx.Response:
        seen.append(r.headers["X-SLURM-USER-TOKEN"])
        return httpx.Response(
            511 if len(seen) == 1 else 200, json=AUTH_511 if len(seen) == 1 else {"nodes": []}
        )

    now = [1000.0]
    src = SignedToken(
        tmp_path / "key", "root", lifespan=60, clock=lambda: now.__setitem__(0, now[0] + 1) or now[0]
    )
    c = client(handler, src, api_version="v0.0.44")
    assert c.nodes() == {}
    assert len(seen) == 2 and seen[0] != seen[1] and c.refreshed == 1


def test_a_token_slurm_keeps_refusing_is_an_error_naming_the_setting(tmp_path: Path) -> None:
    (tmp_path / "key").write_bytes(KEY)
    calls = []

    def handler(r: httpx.Request) -> httpx.Response:
        calls.append(r)
        return httpx.Response(511, json=AUTH_511)

    c = client(handler, SignedToken(tmp_path / "key", "root"), api_version="v0.0.44")
    with pytest.raises(SlurmRestAuthError, match=rf"{SETTING_JWT_KEY} is slurmctld's jwt key") as err:
        c.nodes()
    assert err.value.setting == SETTING_JWT_KEY and len(calls) == 2  # one refresh, one retry, no more

    # a token from a file is never retried: the error says it expired and names the file's setting
    f = tmp_path / "token"
    f.write_text(sign_hs256(KEY, {"iat": 1, "exp": int(time.time()) - 30, "sun": "root"}))
    calls.clear()
    c = client(handler, TokenFile(f), api_version="v0.0.44")
    with pytest.raises(
        SlurmRestAuthError, match=rf"{SETTING_TOKEN_FILE}; the token in it expired \d+ s ago"
    ) as err:
        c.nodes()
    assert err.value.setting == SETTING_TOKEN_FILE and len(calls) == 1


def test_a_user_slurm_does_not_allow_names_the_user_setting() -> None:
    body = {
        "errors": [
            {"error_number": 2010, "error": "Invalid user id", "description": "Failure to update node"}
        ]
    }
    c = client(lambda r: httpx.Response(422, json=body), api_version="v0.0.44")
    with pytest.raises(
        SlurmRestAuthError, match=rf"set {SETTING_USER} to SlurmUser, root or an operator"
    ) as err:
        c.drain(["gpu-1"], "autoheal: test")
    assert err.value.setting == SETTING_USER


def test_slurm_errors_are_request_errors() -> None:
    body = {
        "nodes": [],
        "errors": [{"error_number": 0, "error": "No error", "description": "Failure to query node x"}],
    }
    c = client(lambda r: httpx.Response(200, json=body), api_version="v0.0.44")
    with pytest.raises(SlurmRestRequestError, match=r"HTTP 200: Failure to query node x$"):
        c.node("x")
    with pytest.raises(ValueError, match="needs a reason"):
        c.drain(["x"], "")


def test_unreachable_is_retried_briefly_then_names_the_url_setting() -> None:
    c = SlurmRest(
        f"http://127.0.0.1:{NOWHERE}",
        "root",
        Fixed(),
        retry=Backoff(base=0.05, cap=0.1, tries=3, jitter=0.0),
    )
    t0 = time.monotonic()
    with pytest.raises(
        SlurmRestUnreachable, match=rf"did not answer GET /openapi/v3: ConnectError.*{SETTING_URL}"
    ):
        c.served()
    assert time.monotonic() - t0 < 5
    rows = check_slurmrest(c)
    assert [(r.name, r.status) for r in rows] == [("slurmrestd reachable", "fail")]
    assert SETTING_URL in rows[0].fix


def test_what_slurmrestd_says_of_itself_in_both_shapes() -> None:
    """26.05: info.x-slurm; 24.11 (measured on trixie's 24.11.5): only info.version and the paths."""
    new = parse_openapi(openapi("26.05.5", ("v0.0.43", "v0.0.42", "v0.0.45", "v0.0.44")))
    assert (new.release, new.version) == ("26.05.5", (26, 5, 5))
    assert new.api_versions == ("v0.0.45", "v0.0.44", "v0.0.43", "v0.0.42")
    old = parse_openapi(
        {
            "info": {"version": "Slurm-24.11.5&openapi/slurmctld"},
            "paths": {"/slurm/v0.0.40/ping/": {}, "/slurm/v0.0.42/nodes/": {}, "/openapi/v3": {}},
        }
    )
    assert (old.release, old.version, old.api_versions) == ("24.11.5", (24, 11, 5), ("v0.0.42", "v0.0.40"))


def test_slurmctld_down_behind_slurmrestd_is_unreachable() -> None:
    """slurmrestd answers, but after its MessageTimeout says it could not reach slurmctld (1800)."""
    err = {"error_number": 1800, "error": "Unable to contact slurm controller (connect failure)"}
    c = client(lambda r: httpx.Response(500, json={"nodes": [], "errors": [err]}), api_version="v0.0.44")
    with pytest.raises(SlurmRestUnreachable, match=r"could not reach slurmctld .*\(1800\)") as caught:
        c.nodes()
    assert caught.value.setting == SETTING_URL
