"""Slurm through slurmrestd: the way to a Slurm autoheal did not deploy (issue 34's `existing` backend).

SchedMD's Slinky operator reaches Slurm only through slurmrestd with a JWT it signs; a Slurm on
Kubernetes run that way has no slurm.conf or munge key to hand to the runner. This client speaks
slurmrestd's OpenAPI (data_parser v0.0.44, served by Slurm 25.11 and 26.05; v0.0.45 where served,
Slurm 26.05, which adds job requeue) with the headers X-SLURM-USER-NAME and X-SLURM-USER-TOKEN.

The token comes from one of two sources:

- `TokenFile`: a file (a mounted Secret), read again whenever it changes on disk, so a rotated
  Secret is picked up without a restart; a token it holds that Slurm refuses is an error naming
  `slurm.rest.token_file`, never retried (nothing here can mint a better one).
- `SignedToken`: signed here with the key slurmctld's auth/jwt checks (AuthAltParameters=jwt_key,
  HS256, the claim `sun` naming the user), re-signed `refresh_margin` before it expires; a token
  Slurm refuses is re-signed once and the call tried once more.

What slurmrestd answers, measured against Slurm 26.05.5 (tests/slurmrest): no token headers is
401 `Authentication failure` (text); an expired or badly signed token reaches slurmctld, which
refuses it, and slurmrestd answers 511 with error 1007 `Protocol authentication error` in its JSON
errors. `/ping/` is answered without checking the token at all, so authorisation is proven with
`/nodes/` (what `check()` does).

Every failure is a `SlurmRestError` subclass naming the setting to fix: unreachable (after the
project's Backoff, connects only: a request that may have reached Slurm is not sent twice), not
authorised, a Slurm older than MIN_SLURM, or an error Slurm returned for the request.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from autoheal.backoff import Backoff
from autoheal.errors import AutohealError

MIN_SLURM = (25, 11)  # what Slinky's operator requires; the oldest Slurm that serves v0.0.44
API_VERSIONS = ("v0.0.45", "v0.0.44")  # the data parsers this client reads, preferred first
REQUEUE_SINCE = "v0.0.45"  # /job/{id}/requeue: Slurm 26.05; v0.0.44 has no way to requeue
AUTH_FAILED = 1007  # ESLURM_PROTOCOL_AUTHENTICATION_ERROR: slurmctld refused the token
# ESLURM_ACCESS_DENIED, ESLURM_USER_ID_MISSING ("Invalid user id": 26.05's answer to a node update
# by a user who is not an operator): the token is good, the user may not do this
DENIED = (2002, 2010)
# slurmrestd answered but could not reach slurmctld: "Unable to contact slurm controller (connect
# failure)", after its own MessageTimeout (10 s by default): hence the client's longer timeout
CTLD_UNREACHABLE = 1800
# the runner config's keys, named in errors so the message says what to change
SETTING_URL = "slurm.rest.url"
SETTING_USER = "slurm.rest.user"
SETTING_TOKEN_FILE = "slurm.rest.token_file"  # noqa: S105 - a setting's name
SETTING_JWT_KEY = "slurm.rest.jwt_key_file"
SETTING_API = "slurm.rest.api_version"


class SlurmRestError(AutohealError):
    """slurmrestd or Slurm behind it failed a call; `setting` names the configuration to check."""

    def __init__(self, message: str, setting: str = "") -> None:
        super().__init__(message)
        self.setting = setting


class SlurmRestUnreachable(SlurmRestError):
    """No answer from slurmrestd (connection refused, DNS, timeout before a reply)."""


class SlurmRestAuthError(SlurmRestError):
    """slurmrestd or slurmctld refused the token (expired, badly signed, unknown user, no right)."""


class SlurmRestVersionError(SlurmRestError):
    """The Slurm behind slurmrestd is older than MIN_SLURM, or serves none of API_VERSIONS."""


class SlurmRestRequestError(SlurmRestError):
    """Slurm answered the request with an error (an unknown node, a refused update)."""


# --- tokens -----------------------------------------------------------------------------------


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def sign_hs256(key: bytes, claims: Mapping[str, Any]) -> str:
    """A compact JWS (RFC 7515) over `claims` with HMAC-SHA256: what slurmctld's auth/jwt checks.
    The standard library suffices for HS256, so no JWT package is a runtime dependency."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    payload = _b64(json.dumps(dict(claims), separators=(",", ":"), sort_keys=True).encode())
    signing_input = f"{header}.{payload}".encode()
    return f"{header}.{payload}.{_b64(hmac.new(key, signing_input, hashlib.sha256).digest())}"


def token_claims(token: str) -> dict[str, Any]:
    """The claims of a compact JWT, unverified (to tell when a token expires); {} if unreadable."""
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    try:
        data = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


class TokenSource(Protocol):
    setting: str  # the setting that names where tokens come from

    def token(self) -> str: ...

    def refresh(self) -> bool:
        """A token Slurm refused: make a new one; False when this source cannot."""
        ...


class TokenFile:
    """A token in a file (a mounted Secret), read again when the file changes (stat per call)."""

    setting = SETTING_TOKEN_FILE

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None  # (inode, size, mtime_ns)
        self._token = ""
        self._lock = threading.Lock()

    def token(self) -> str:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise SlurmRestAuthError(
                f"slurmrestd token: cannot read {self.path} ({exc.strerror}); "
                f"set {SETTING_TOKEN_FILE} to the mounted Secret's file",
                SETTING_TOKEN_FILE,
            ) from exc
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            if key != self._seen:
                text = self.path.read_text().strip()
                if not text:
                    raise SlurmRestAuthError(
                        f"slurmrestd token: {self.path} is empty; {SETTING_TOKEN_FILE} must hold a JWT",
                        SETTING_TOKEN_FILE,
                    )
                self._token, self._seen = text, key
            return self._token

    def refresh(self) -> bool:
        return False  # a refused token is the Secret's to replace


class SignedToken:
    """Tokens signed here with slurmctld's jwt key, re-signed `refresh_margin` s before expiry."""

    setting = SETTING_JWT_KEY

    def __init__(
        self,
        key_file: Path,
        user: str,
        lifespan: float = 1800.0,
        refresh_margin: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if lifespan <= 0:
            raise ValueError(f"slurm.rest.token_lifespan_s: a positive number of seconds (got {lifespan})")
        self.key_file, self.user, self.lifespan = key_file, user, lifespan
        # a fifth of the lifespan, at most a minute: a token is never used in its last seconds
        self.refresh_margin = min(60.0, lifespan / 5) if refresh_margin is None else refresh_margin
        self.clock = clock
        self._token = ""
        self._expires = 0.0
        self.signed = 0  # tokens signed so far (tests and metrics read it)
        self._lock = threading.Lock()

    def _key(self) -> bytes:
        try:
            key = self.key_file.read_bytes()
        except OSError as exc:
            raise SlurmRestAuthError(
                f"slurmrestd token: cannot read the jwt key {self.key_file} ({exc.strerror}); "
                f"set {SETTING_JWT_KEY} to slurmctld's AuthAltParameters jwt_key file",
                SETTING_JWT_KEY,
            ) from exc
        if len(key) < 16:
            raise SlurmRestAuthError(
                f"slurmrestd token: the jwt key {self.key_file} has {len(key)} bytes; "
                f"{SETTING_JWT_KEY} must name slurmctld's jwt key (32 random bytes or more)",
                SETTING_JWT_KEY,
            )
        return key

    def token(self) -> str:
        with self._lock:
            now = self.clock()
            if not self._token or now >= self._expires - self.refresh_margin:
                self._sign(now)
            return self._token

    def _sign(self, now: float) -> None:
        iat = int(now)
        exp = iat + max(1, int(self.lifespan))
        self._token = sign_hs256(self._key(), {"iat": iat, "exp": exp, "sun": self.user})
        self._expires = float(exp)
        self.signed += 1

    def refresh(self) -> bool:
        with self._lock:
            self._sign(self.clock())  # the key may have been rotated: it is read again
        return True


# --- what Slurm returns -----------------------------------------------------------------------


@dataclass(frozen=True)
class RestNode:
    """A node record as slurmrestd returns it (base state and flags in one list)."""

    name: str
    state: frozenset[str]
    reason: str = ""
    comment: str = ""
    alloc_cpus: int = 0

    @property
    def drained(self) -> bool:
        """DRAIN, or DOWN: no new job lands either way (cordon_sync.SlurmNode's meaning)."""
        return bool(self.state & {"DRAIN", "DOWN"})

    @property
    def dynamic(self) -> bool:
        return "DYNAMIC_NORM" in self.state

    @property
    def busy(self) -> bool:
        return bool(self.state & {"ALLOCATED", "MIXED", "COMPLETING"}) or self.alloc_cpus > 0


@dataclass(frozen=True)
class RestJob:
    job_id: str
    state: str  # the base state (RUNNING, PENDING, ...)
    nodes: tuple[str, ...]
    priority: int = 0
    comment: str = ""


def _number(value: Any) -> int:
    """v0.0.4x wraps numbers as {"set", "infinite", "number"}; unset or infinite is 0."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return 0
        value = value.get("number")
    return value if isinstance(value, int) else 0


def parse_nodes(data: Mapping[str, Any]) -> dict[str, RestNode]:
    out = {}
    for n in data.get("nodes") or []:
        state = frozenset(str(s).upper() for s in n.get("state") or [])
        name = str(n["name"])
        out[name] = RestNode(
            name, state, str(n.get("reason") or ""), str(n.get("comment") or ""), _number(n.get("alloc_cpus"))
        )
    return out


_RANGE = re.compile(r"^(.*?)\[([^\]]+)\](.*)$")


def expand_hostlist(text: str) -> list[str]:
    """`gpu-[1-3,5],cpu-1` -> names; one bracket per name is all Slurm prints for our nodes."""
    names: list[str] = []
    for part in re.split(r",(?![^\[]*\])", text):
        m = _RANGE.match(part)
        if not m:
            if part:
                names.append(part)
            continue
        head, body, tail = m.groups()
        for piece in body.split(","):
            lo, _, hi = piece.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                names.append(f"{head}{str(i).zfill(len(lo))}{tail}")
    return names


def parse_jobs(data: Mapping[str, Any]) -> list[RestJob]:
    jobs = []
    for j in data.get("jobs") or []:
        alloc = ((j.get("job_resources") or {}).get("nodes") or {}).get("allocation") or []
        names = [str(a["name"]) for a in alloc if isinstance(a, dict) and a.get("name")]
        if not names and j.get("nodes"):
            names = expand_hostlist(str(j["nodes"]))
        states = [str(s).upper() for s in j.get("job_state") or []]
        jobs.append(
            RestJob(
                str(_number(j.get("job_id"))),
                states[0] if states else "",
                tuple(names),
                _number(j.get("priority")),
                str(j.get("comment") or ""),
            )
        )
    return jobs


def parse_release(text: str) -> tuple[int, int, int]:
    """`26.05.5` -> (26, 5, 5); a release that is not one is a SlurmRestVersionError."""
    m = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not m:
        raise SlurmRestVersionError(f"slurmrestd reports no Slurm release we can read ({text!r})")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


@dataclass(frozen=True)
class Served:
    release: str
    version: tuple[int, int, int]
    api_versions: tuple[str, ...]  # the data parsers slurmrestd serves


def parse_openapi(doc: Mapping[str, Any]) -> Served:
    """What slurmrestd's /openapi/v3 says of itself. 25.x and 26.05 say it in `info.x-slurm`
    (release, data_parsers); 24.11 has no x-slurm (measured: trixie's 24.11.5): there the release
    is in `info.version` ("Slurm-24.11.5&openapi/slurmctld") and the versions in the paths."""
    info = doc.get("info") or {}
    xs = info.get("x-slurm") or {}
    release = str(xs.get("release") or "")
    if not release:
        m = re.match(r"^Slurm-(\d+\.\d+(?:\.\d+)?)", str(info.get("version") or ""))
        release = m.group(1) if m else ""
    parsers = {str(p.get("plugin")) for p in xs.get("data_parsers") or [] if isinstance(p, dict)}
    if not parsers:
        parsers = {m.group(1) for p in doc.get("paths") or {} if (m := re.match(r"^/slurm/(v[\d.]+)/", p))}
    return Served(release, parse_release(release), tuple(sorted(parsers, key=_api_tuple, reverse=True)))


def _errors(data: Any) -> list[Mapping[str, Any]]:
    errs = data.get("errors") if isinstance(data, dict) else None
    return [e for e in errs or [] if isinstance(e, dict)]


def _describe(errs: Iterable[Mapping[str, Any]]) -> str:
    """Slurm's errors in one line; error 0 ("No error") carries its meaning in the description."""
    return "; ".join(
        str(e.get("description") or "")
        if not e.get("error_number")
        else f"{e.get('error') or 'error'} ({e['error_number']}): {e.get('description') or ''}".strip()
        for e in errs
    )


# --- the client -------------------------------------------------------------------------------


class SlurmRest:
    """Slurm through slurmrestd. One httpx client, thread-safe; `close()` when done."""

    def __init__(
        self,
        url: str,
        user: str,
        tokens: TokenSource,
        *,
        api_version: str | None = None,
        timeout: float = 30.0,
        retry: Backoff | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not re.match(r"^https?://[^/]+", url):
            raise ValueError(
                f"{SETTING_URL}: an http(s) URL of slurmrestd, e.g. http://slurmrestd:6820 (got {url!r})"
            )
        if api_version is not None and api_version not in API_VERSIONS:
            raise ValueError(f"{SETTING_API}: one of {', '.join(API_VERSIONS)} (got {api_version!r})")
        self.url = url.rstrip("/")
        self.user = user
        self.tokens = tokens
        self._api = api_version
        self.refreshed = 0  # refused tokens refreshed and their call sent again
        # connects only, a few seconds in all: a refused connection sent nothing, so it is safe
        # to try again; a timeout after the request went out is never repeated (it may have acted)
        self._retry = retry if retry is not None else Backoff(base=0.2, cap=2.0, tries=4, within=8.0)
        self._http = httpx.Client(base_url=self.url, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    # -- transport ------------------------------------------------------------------------------
    def _send(
        self, method: str, path: str, body: Mapping[str, Any] | None, params: Mapping[str, str] | None
    ) -> httpx.Response:
        def once() -> httpx.Response:
            headers = {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self.tokens.token()}
            return self._http.request(method, path, json=body, params=params, headers=headers)

        try:
            return self._retry.call(once, (httpx.ConnectError, httpx.ConnectTimeout))
        except httpx.TransportError as exc:
            raise SlurmRestUnreachable(
                f"slurmrestd at {self.url} did not answer {method} {path}: {type(exc).__name__}: {exc}; "
                f"is it running and is {SETTING_URL} right?",
                SETTING_URL,
            ) from exc

    def _refused(self, resp: httpx.Response, data: Any) -> bool:
        return resp.status_code in (401, 403) or any(
            e.get("error_number") == AUTH_FAILED for e in _errors(data)
        )

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """One call; a refused token is refreshed and the call sent once more where the source
        can refresh (a signed token). Returns the JSON document."""
        resp = self._send(method, path, body, params)
        data = _json(resp)
        if self._refused(resp, data) and self.tokens.refresh():
            self.refreshed += 1
            resp = self._send(method, path, body, params)
            data = _json(resp)
        if self._refused(resp, data):
            raise SlurmRestAuthError(self._auth_message(method, path, resp, data), self.tokens.setting)
        errs = _errors(data)
        if any(e.get("error_number") == CTLD_UNREACHABLE for e in errs):
            raise SlurmRestUnreachable(
                f"slurmrestd at {self.url} could not reach slurmctld for {method} {path} "
                f"({_describe(errs)}): is slurmctld up, and reachable from slurmrestd?",
                SETTING_URL,
            )
        if any(e.get("error_number") in DENIED for e in errs):
            raise SlurmRestAuthError(
                f"slurmrestd {method} {path}: Slurm does not allow user {self.user!r} this "
                f"({_describe(errs)}); "
                f"set {SETTING_USER} to SlurmUser, root or an operator (sacctmgr modify user {self.user} "
                "set adminlevel=operator)",
                SETTING_USER,
            )
        if resp.status_code >= 400 or errs:
            detail = _describe(errs) or resp.text.strip()[:200]
            raise SlurmRestRequestError(f"slurmrestd {method} {path}: HTTP {resp.status_code}: {detail}")
        return data if isinstance(data, dict) else {}

    def _auth_message(self, method: str, path: str, resp: httpx.Response, data: Any) -> str:
        why = _describe(_errors(data)) or resp.text.strip()[:200] or f"HTTP {resp.status_code}"
        if isinstance(self.tokens, TokenFile):
            exp = token_claims(self.tokens.token()).get("exp")
            left = (
                f"; the token in it expired {time.time() - exp:.0f} s ago"
                if isinstance(exp, int) and exp < time.time()
                else ""
            )
            fix = (
                f"put a valid token for user {self.user!r} in {self.tokens.path} ({SETTING_TOKEN_FILE}{left})"
            )
        else:
            fix = (
                f"check that {SETTING_JWT_KEY} is slurmctld's jwt key (AuthAltParameters jwt_key) and that "
                f"{SETTING_USER}={self.user!r} is a Slurm user allowed to do this "
                "(an operator or admin to drain)"
            )
        status = f"HTTP {resp.status_code}: {why}"
        return f"slurmrestd refused {method} {path} for user {self.user!r} ({status}): {fix}"

    # -- discovery ------------------------------------------------------------------------------
    def served(self) -> Served:
        """The Slurm release and the data parsers slurmrestd serves (its OpenAPI document)."""
        return parse_openapi(self.request("GET", "/openapi/v3"))

    def check(self) -> Served:
        """What preflight asks: reachable, a Slurm >= MIN_SLURM serving one of API_VERSIONS, and
        the token accepted by slurmctld (a node list: /ping/ does not check the token)."""
        served = self.served()
        if served.version[:2] < MIN_SLURM:
            raise SlurmRestVersionError(
                f"slurmrestd at {self.url} runs Slurm {served.release}; the existing backend needs "
                f"Slurm {MIN_SLURM[0]}.{MIN_SLURM[1]:02d} or newer",
                SETTING_URL,
            )
        self._api = self._pick(served)
        self.nodes()
        return served

    def _pick(self, served: Served) -> str:
        if self._api is not None:
            if self._api not in served.api_versions:
                raise SlurmRestVersionError(
                    f"slurmrestd at {self.url} (Slurm {served.release}) does not serve {self._api}; "
                    f"it serves {', '.join(served.api_versions)}: change {SETTING_API}",
                    SETTING_API,
                )
            return self._api
        for v in API_VERSIONS:
            if v in served.api_versions:
                return v
        raise SlurmRestVersionError(
            f"slurmrestd at {self.url} (Slurm {served.release}) serves "
            f"{', '.join(served.api_versions) or 'no data parser'}; "
            f"this client reads {', '.join(API_VERSIONS)}",
            SETTING_API,
        )

    @property
    def api_version(self) -> str:
        if self._api is None:
            self._api = self._pick(self.served())
        return self._api

    def _path(self, tail: str) -> str:
        return f"/slurm/{self.api_version}/{tail}"

    # -- operations -----------------------------------------------------------------------------
    def version(self) -> tuple[int, int, int]:
        return self.served().version

    def nodes(self) -> dict[str, RestNode]:
        return parse_nodes(self.request("GET", self._path("nodes/")))

    def node(self, name: str) -> RestNode:
        found = parse_nodes(self.request("GET", self._path(f"node/{name}")))
        if name not in found:
            raise SlurmRestRequestError(f"slurmrestd: no node {name!r} in Slurm")
        return found[name]

    def drain(self, names: Sequence[str], reason: str) -> None:
        if not reason:
            raise ValueError("a drain needs a reason (Slurm refuses one without)")
        for name in names:
            self.request("POST", self._path(f"node/{name}"), {"state": ["DRAIN"], "reason": reason})

    def resume(self, names: Sequence[str]) -> None:
        for name in names:
            self.request("POST", self._path(f"node/{name}"), {"state": ["RESUME"]})

    def delete(self, name: str) -> None:
        self.request("DELETE", self._path(f"node/{name}"))

    def jobs(self) -> list[RestJob]:
        return parse_jobs(self.request("GET", self._path("jobs/")))

    def jobs_on(self, node: str, states: Iterable[str] = ("RUNNING", "COMPLETING")) -> list[RestJob]:
        want = set(states)
        return [j for j in self.jobs() if node in j.nodes and j.state in want]

    def requeue(self, job_ids: Sequence[str]) -> None:
        if _api_tuple(self.api_version) < _api_tuple(REQUEUE_SINCE):
            raise SlurmRestVersionError(
                f"slurmrestd {self.api_version} has no job requeue "
                f"(it came with {REQUEUE_SINCE}, Slurm 26.05); "
                f"upgrade Slurm or set {SETTING_API}: {REQUEUE_SINCE}",
                SETTING_API,
            )
        for job_id in job_ids:
            self.request("GET", self._path(f"job/{job_id}/requeue"))


def _api_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None  # slurmrestd answers some failures in plain text (401 "Authentication failure")
