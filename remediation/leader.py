"""Leader election on a Kubernetes Lease, so two or more runner replicas act as one.

Every replica answers the webhook and journals alerts (the journal is shared: PostgreSQL), so
Alertmanager never sees an error while the leader changes; only the leader's worker runs plays.

The algorithm is client-go's `leaderelection` (controller-runtime uses the same), on a
`coordination.k8s.io/v1` Lease:

    follower --(lease free, or not renewed for lease_duration by our clock)--> leader
    leader   --(renewed every retry_period)--> leader
    leader   --(no successful renewal for renew_deadline, or stop())--> follower (its plays cancelled)

- Expiry is judged by *our* clock, from when we last saw the Lease change (its resourceVersion),
  never from the holder's renewTime: clocks of two machines need not agree.
- Every write is a replace with the resourceVersion we read (optimistic concurrency): of two
  replicas that both see an expired Lease, one gets 409 Conflict and stays a follower.
- renew_deadline < lease_duration: a leader that cannot renew gives up before anyone else may
  take over, so two leaders never act at once unless a clock runs more than that gap fast.
- A leader that is stopped releases the Lease (holder cleared), so a rolling update hands over at
  once instead of after lease_duration.
- `leaseTransitions` counts the changes of holder; the leader's term (its fencing token in the
  journal, remediation/fencing.py) is derived from it, so a deposed leader cannot write.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from remediation.errors import KubeError

log = logging.getLogger(__name__)


def default_identity() -> str:
    """The pod's name where the Downward API gives it, else host and PID (two runners on one host)."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def _micro_time(ts: float) -> str:
    """A Lease MicroTime (RFC 3339 with microseconds, UTC)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseAPI(Protocol):
    """The three Lease calls the elector makes; `None` from get() means there is no Lease yet.
    create() and replace() return False when another replica won the race (409 Conflict)."""

    name: str

    def get(self) -> dict[str, Any] | None: ...

    def create(self, body: dict[str, Any]) -> bool: ...

    def replace(self, body: dict[str, Any]) -> bool: ...


class KubeLeaseAPI:
    """One named Lease through the official client, as plain JSON (no model classes)."""

    def __init__(self, kubeconfig: Path, namespace: str, name: str, timeout: float = 5.0) -> None:
        from kubernetes import client, config

        try:
            api_client = config.new_client_from_config(config_file=str(kubeconfig))
        except Exception as exc:
            raise KubeError(f"kubeconfig {kubeconfig}: cannot load: {exc}") from exc
        self._api: Any = client.CoordinationV1Api(api_client)
        self._exc: Any = client.ApiException
        self.namespace, self.name, self._timeout = namespace, name, timeout

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, ok: tuple[int, ...] = ()) -> Any:
        try:
            return fn(*args, _preload_content=False, _request_timeout=self._timeout)
        except self._exc as exc:
            if exc.status in ok:
                return exc.status
            raise KubeError(f"Lease {self.namespace}/{self.name}: {what}: {exc.status} {exc.reason}") from exc
        except Exception as exc:  # connection refused, timeout: the API server is unreachable
            raise KubeError(f"Lease {self.namespace}/{self.name}: {what}: {exc}") from exc

    def get(self) -> dict[str, Any] | None:
        resp = self._call("get", self._api.read_namespaced_lease, self.name, self.namespace, ok=(404,))
        return None if resp == 404 else dict(json.loads(resp.data))

    def create(self, body: dict[str, Any]) -> bool:
        resp = self._call("create", self._api.create_namespaced_lease, self.namespace, body, ok=(409,))
        return bool(resp != 409)

    def replace(self, body: dict[str, Any]) -> bool:
        resp = self._call(
            "replace", self._api.replace_namespaced_lease, self.name, self.namespace, body, ok=(409,)
        )
        return bool(resp != 409)


@dataclass(frozen=True)
class Term:
    """One leadership: who holds it, and the Lease's transition count when it was won."""

    holder: str
    transitions: int


class LeaseElector:
    """Campaigns for one Lease in a thread; `on_started(term)` / `on_stopped()` are called on the
    changes. `on_stopped` is also called when stop() releases a held Lease."""

    def __init__(
        self,
        api: LeaseAPI,
        identity: str,
        *,
        lease_seconds: float,
        renew_deadline_seconds: float,
        retry_seconds: float,
        on_started: Callable[[Term], None],
        on_stopped: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if not retry_seconds < renew_deadline_seconds < lease_seconds:
            raise ValueError("leader election needs retry < renew deadline < lease duration")
        self.api, self.identity = api, identity
        self.lease_seconds = lease_seconds
        self.renew_deadline = renew_deadline_seconds
        self.retry = retry_seconds
        self._on_started, self._on_stopped = on_started, on_stopped
        self._clock, self._wall = clock, wall
        self._observed_version: str | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0
        self._term: Term | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str = ""

    # state ------------------------------------------------------------------------------------
    @property
    def term(self) -> Term | None:
        """The term we hold, or None while a follower."""
        return self._term

    @property
    def is_leader(self) -> bool:
        return self._term is not None

    @property
    def renewed_at(self) -> float:
        """When this replica last won or renewed the Lease, by its own clock (0: never)."""
        return self._renewed_at

    # one round --------------------------------------------------------------------------------
    def _spec(self, transitions: int, acquired: float | None, renewed: float) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_seconds)),
            "leaseTransitions": transitions,
            "renewTime": _micro_time(renewed),
        }
        if acquired is not None:
            spec["acquireTime"] = _micro_time(acquired)
        return spec

    def try_acquire_or_renew(self) -> bool:
        """One round; True while we hold the Lease afterwards. KubeError: the API failed."""
        now, wall = self._clock(), self._wall()
        lease = self.api.get()
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.api.name},
                "spec": self._spec(0, wall, wall),
            }
            if not self.api.create(body):
                return False
            return self._won(Term(self.identity, 0), now)
        meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
        version = str(meta.get("resourceVersion", ""))
        if version != self._observed_version:
            self._observed_version, self._observed_at = version, now
        holder = spec.get("holderIdentity") or ""
        transitions = int(spec.get("leaseTransitions") or 0)
        duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
        if holder and holder != self.identity and now < self._observed_at + duration:
            return False  # someone else holds a live Lease
        mine = holder == self.identity and self._term is not None
        if mine:
            new_spec = {**spec, **self._spec(transitions, None, wall)}
        else:  # free, expired, or ours from a former life of this identity: a new term
            transitions += 1
            new_spec = self._spec(transitions, wall, wall)
        if not self.api.replace({**lease, "spec": new_spec}):
            return False
        if mine:
            self._renewed_at = now
            return True
        return self._won(Term(self.identity, transitions), now)

    def _won(self, term: Term, now: float) -> bool:
        self._renewed_at = now
        self._term = term
        log.info("leader election: %s leads (term %d)", term.holder, term.transitions)
        self._on_started(term)
        return True

    def _lose(self, why: str) -> None:
        if self._term is None:
            return
        log.error("leader election: %s no longer leads: %s", self.identity, why)
        self._term = None
        self._on_stopped()

    def round(self) -> None:
        """One round plus its consequences: a leader that has not renewed within the deadline is
        deposed, whatever the reason (API down, a conflict, a slow machine)."""
        try:
            held = self.try_acquire_or_renew()
            self.last_error = ""
        except KubeError as exc:
            held = False
            if exc.args and str(exc) != self.last_error:
                log.warning("leader election: %s", exc)
            self.last_error = str(exc)
        if self._term is not None and not held and self._clock() - self._renewed_at >= self.renew_deadline:
            self._lose(f"no renewal for {self.renew_deadline:.0f}s ({self.last_error or 'lost the Lease'})")

    # the thread -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="autoheal-leader", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.round()
            self._stop.wait(self.retry)

    def stop(self, release: bool = True) -> None:
        """Stop campaigning; a held Lease is released so a follower takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.retry + 10)
        if self._term is not None and release:
            try:
                lease = self.api.get()
                spec = (lease or {}).get("spec") or {}
                if lease is not None and spec.get("holderIdentity") == self.identity:
                    # client-go's release: no holder, a 1 s duration, the renew time of now
                    now = _micro_time(self._wall())
                    released = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": now}
                    self.api.replace({**lease, "spec": released})
            except KubeError as exc:
                log.warning("leader election: could not release the Lease: %s", exc)
        self._lose("stopped")
