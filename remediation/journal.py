"""The journal: the runner's memory and its queue.

Everything the runner knows is here, written before it is acknowledged: the alerts received, the
incidents they opened or joined, the policy decisions, each ansible-runner run and step, and each
incident's timeline (received -> fenced -> jobs_signalled -> requeued -> drained ->
replacement_ready -> resolved). Because the queue *is* the incidents table, a runner that is killed
loses nothing: on start it reads back what was admitted or running and resumes it. WAL mode lets the
CLI read (and pause, cancel, reset the breaker) from another process while the server writes.

The journal is an embedded SQLite file by default (Journal(path)), or a PostgreSQL database that
runner replicas share (Journal.postgres(dsn)): the same schema, SQL and tests on both; what differs
between the two engines lives in remediation/journal_db.py.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoheal import __version__
from remediation.errors import IllegalTransition, JournalError
from remediation.journal_db import Database, PostgresDatabase, Row, SqliteDatabase
from remediation.states import (
    CANCELLABLE_NOW,
    CLOSED_STATES,
    INITIAL_STATES,
    OPEN_STATES,
    IncidentState,
    RunStatus,
    allowed,
)

log = logging.getLogger(__name__)
# Called with (incident id, current state, refused state) when a transition is refused; the
# runtime points it at the autoheal_illegal_transitions_total counter.
IllegalHook = Callable[[str, IncidentState, IncidentState], None]
TIMELINE_PHASES = (
    "received",
    "fenced",
    "jobs_signalled",
    "requeued",
    "drained",
    "replacement_ready",
    "resolved",
)
RECENT_INCIDENTS = 1000  # `incidents()` of every state: the newest this many (the CLI's listing)

# Recorded by the database (SQLite: PRAGMA user_version); 0 = a file from before versioning (the
# v1 schema). The schema and migrations are written in SQLite's types; PostgreSQL gets them in its
# own (journal_db).
SCHEMA_VERSION = 3
_SCHEMA = """
CREATE TABLE IF NOT EXISTS alerts (
    id INTEGER PRIMARY KEY,
    received_at REAL NOT NULL,
    fingerprint TEXT NOT NULL,
    starts_at REAL NOT NULL,
    status TEXT NOT NULL,
    alertname TEXT NOT NULL,
    labels TEXT NOT NULL,
    outcome TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    incident_id TEXT
);
CREATE INDEX IF NOT EXISTS alerts_identity ON alerts (fingerprint, starts_at);
CREATE INDEX IF NOT EXISTS alerts_received ON alerts (received_at);
CREATE TABLE IF NOT EXISTS incidents (
    id TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    gpu INTEGER,
    xid INTEGER NOT NULL,
    fault_class TEXT NOT NULL,
    tier TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    rule TEXT NOT NULL,
    playbook TEXT NOT NULL,
    extra_vars TEXT NOT NULL DEFAULT '{}',
    rule_dry_run INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    opt_out INTEGER NOT NULL DEFAULT 0,
    dry_run INTEGER NOT NULL DEFAULT 0,
    alert_count INTEGER NOT NULL DEFAULT 1,
    resolved_alerts INTEGER NOT NULL DEFAULT 0,
    opened_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    closed_at REAL,
    run_id INTEGER,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    source TEXT NOT NULL DEFAULT 'alertmanager'
);
CREATE INDEX IF NOT EXISTS incidents_key ON incidents (node, fault_class, state);
CREATE INDEX IF NOT EXISTS incidents_state ON incidents (state, opened_at);
CREATE INDEX IF NOT EXISTS incidents_closed ON incidents (closed_at);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    playbook TEXT NOT NULL,
    incident_ids TEXT NOT NULL,
    nodes TEXT NOT NULL,
    check_mode INTEGER NOT NULL,
    status TEXT NOT NULL,
    rc INTEGER,
    started_at REAL NOT NULL,
    finished_at REAL,
    owner_pid INTEGER NOT NULL,
    play_pid INTEGER,
    private_dir TEXT NOT NULL DEFAULT '',
    events_path TEXT NOT NULL DEFAULT '',
    events_offset INTEGER NOT NULL DEFAULT 0,
    source TEXT NOT NULL DEFAULT 'worker',
    detail TEXT NOT NULL DEFAULT '',
    autoheal_version TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS steps (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL,
    task TEXT NOT NULL,
    host TEXT NOT NULL,
    status TEXT NOT NULL,
    changed INTEGER NOT NULL DEFAULT 0,
    started_at REAL,
    finished_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS steps_run ON steps (run_id);
CREATE TABLE IF NOT EXISTS timeline (
    id INTEGER PRIMARY KEY,
    incident_id TEXT NOT NULL,
    phase TEXT NOT NULL,
    status TEXT NOT NULL,
    ts REAL NOT NULL,
    run_id INTEGER,
    source TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS timeline_incident ON timeline (incident_id, ts);
CREATE TABLE IF NOT EXISTS settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    updated_at REAL NOT NULL,
    actor TEXT NOT NULL DEFAULT ''
);
"""
# Migrations from version N to N+1, applied in order inside one transaction on open. Never edit
# one that shipped: add the next.
_MIGRATIONS: dict[int, str] = {
    # v1 -> v2: one spelling of a cancelled run (ansible-runner says "canceled"); an index for
    # pruning closed incidents by age
    1: """
UPDATE runs SET status='cancelled' WHERE status='canceled';
CREATE INDEX IF NOT EXISTS incidents_closed ON incidents (closed_at);
CREATE INDEX IF NOT EXISTS alerts_received ON alerts (received_at);
""",
    # v2 -> v3: the autoheal release that started each run (runs from before it: '')
    2: """
ALTER TABLE runs ADD COLUMN autoheal_version TEXT NOT NULL DEFAULT '';
""",
}


@dataclass(frozen=True)
class IncidentRecord:
    """One row of the incidents table."""

    id: str
    node: str
    gpu: int | None
    xid: int
    fault_class: str
    tier: str
    fingerprint: str
    rule: str
    playbook: str
    extra_vars: dict[str, Any]
    rule_dry_run: bool
    state: IncidentState
    reason: str
    opt_out: bool
    dry_run: bool
    alert_count: int
    resolved_alerts: int
    opened_at: float
    updated_at: float
    closed_at: float | None
    run_id: int | None
    cancel_requested: bool
    source: str

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass(frozen=True)
class RunRecord:
    """One ansible-runner invocation (a batch of incidents, or a play run by hand)."""

    id: int
    playbook: str
    incident_ids: list[str]
    nodes: list[str]
    check_mode: bool
    status: RunStatus
    rc: int | None
    started_at: float
    finished_at: float | None
    owner_pid: int
    play_pid: int | None
    private_dir: str
    events_path: str
    events_offset: int
    source: str
    detail: str
    autoheal_version: str  # the release that started the run ('' before schema v3)

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass(frozen=True)
class TimelineEntry:
    incident_id: str
    phase: str
    status: str
    ts: float
    run_id: int | None
    source: str
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


def _incident(row: Row) -> IncidentRecord:
    d = dict(row)
    d["extra_vars"] = json.loads(d["extra_vars"])
    for key in ("rule_dry_run", "opt_out", "dry_run", "cancel_requested"):
        d[key] = bool(d[key])
    d["state"] = IncidentState(d["state"])
    return IncidentRecord(**d)


def _run(row: Row) -> RunRecord:
    d = dict(row)
    d["incident_ids"] = json.loads(d["incident_ids"])
    d["nodes"] = json.loads(d["nodes"])
    d["check_mode"] = bool(d["check_mode"])
    d["status"] = RunStatus(d["status"])
    return RunRecord(**d)


def new_incident_id() -> str:
    """A short random id, safe to pass to a play and to type on a command line."""
    return "inc-" + uuid.uuid4().hex[:12]


class Tx:
    """Operations inside one journal transaction (see Journal.transaction)."""

    def __init__(self, conn: Database, now: float, on_illegal: IllegalHook | None = None) -> None:
        self.conn = conn
        self.now = now
        self._on_illegal = on_illegal

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A nested all-or-nothing part of the transaction (one delivery of a group commit)."""
        self.conn.execute("SAVEPOINT part")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK TO part")
            self.conn.execute("RELEASE part")
            raise
        self.conn.execute("RELEASE part")

    # alerts -----------------------------------------------------------------------------------
    def add_alert(
        self,
        *,
        fingerprint: str,
        starts_at: float,
        status: str,
        alertname: str,
        labels: dict[str, str],
        outcome: str,
        reason: str = "",
        incident_id: str | None = None,
    ) -> None:
        self.conn.execute(
            "INSERT INTO alerts (received_at, fingerprint, starts_at, status, alertname, labels,"
            " outcome, reason, incident_id) VALUES (?,?,?,?,?,?,?,?,?)",
            (
                self.now,
                fingerprint,
                starts_at,
                status,
                alertname,
                json.dumps(labels, sort_keys=True),
                outcome,
                reason,
                incident_id,
            ),
        )

    def incident_of_alert(self, fingerprint: str, starts_at: float) -> str | None:
        row = self.conn.execute(
            "SELECT incident_id FROM alerts WHERE fingerprint=? AND starts_at=? AND"
            " incident_id IS NOT NULL ORDER BY id DESC LIMIT 1",
            (fingerprint, starts_at),
        ).fetchone()
        return None if row is None else str(row[0])

    def returned_at(self, incident_id: str) -> float | None:
        """When the incident's node was last returned to service by its run (phase `returned`)."""
        row = self.conn.execute(
            "SELECT MAX(ts) FROM timeline WHERE incident_id=? AND phase='returned' AND status='ok'",
            (incident_id,),
        ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    # incidents --------------------------------------------------------------------------------
    def find_joinable(self, node: str, fault_class: str, closed_since: float) -> IncidentRecord | None:
        """The open incident for (node, fault class), else one closed at or after `closed_since`."""
        marks = ",".join("?" * len(OPEN_STATES))
        row = self.conn.execute(
            f"SELECT * FROM incidents WHERE node=? AND fault_class=? AND (state IN ({marks})"  # noqa: S608
            f" OR closed_at >= ?) ORDER BY (state IN ({marks})) DESC, opened_at DESC LIMIT 1",
            (node, fault_class, *OPEN_STATES, closed_since, *OPEN_STATES),
        ).fetchone()
        return None if row is None else _incident(row)

    def get(self, incident_id: str) -> IncidentRecord | None:
        row = self.conn.execute("SELECT * FROM incidents WHERE id=?", (incident_id,)).fetchone()
        return None if row is None else _incident(row)

    def create_incident(
        self,
        *,
        node: str,
        gpu: int | None,
        xid: int,
        fault_class: str,
        tier: str,
        fingerprint: str,
        rule: str,
        playbook: str,
        extra_vars: dict[str, Any],
        rule_dry_run: bool,
        state: IncidentState = IncidentState.PENDING,
        source: str = "alertmanager",
        incident_id: str | None = None,
    ) -> str:
        if state not in INITIAL_STATES:
            raise JournalError(f"an incident cannot start {state}; it starts one of {sorted(INITIAL_STATES)}")
        iid = incident_id or new_incident_id()
        self.conn.execute(
            "INSERT INTO incidents (id, node, gpu, xid, fault_class, tier, fingerprint, rule,"
            " playbook, extra_vars, rule_dry_run, state, opened_at, updated_at, source)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                iid,
                node,
                gpu,
                xid,
                fault_class,
                tier,
                fingerprint,
                rule,
                playbook,
                json.dumps(extra_vars, sort_keys=True),
                int(rule_dry_run),
                state,
                self.now,
                self.now,
                source,
            ),
        )
        self.timeline(iid, "received", "ok", source="runner")
        return iid

    def join(self, incident_id: str, *, resolved: bool, tier: str | None = None) -> None:
        self.conn.execute(
            "UPDATE incidents SET alert_count = alert_count + 1,"
            " resolved_alerts = resolved_alerts + ?, updated_at=?,"
            # CAST: PostgreSQL cannot tell the type of a bare parameter tested for NULL
            " tier = CASE WHEN CAST(? AS TEXT) IS NOT NULL AND state IN ('pending','held')"
            " THEN ? ELSE tier END"
            " WHERE id=?",
            (int(resolved), self.now, tier, tier, incident_id),
        )

    def transition(self, incident_id: str, new: IncidentState, reason: str, **fields: Any) -> None:
        """Move an incident to `new`: the one place a state changes (remediation/states.py).

        A move that TRANSITIONS does not allow (or of an unknown incident) is refused: logged,
        counted and raised as IllegalTransition, so the caller's transaction writes nothing.
        """
        row = self.conn.execute("SELECT state FROM incidents WHERE id=?", (incident_id,)).fetchone()
        if row is None:
            raise JournalError(f"incident {incident_id} is missing; cannot move it to {new}")
        current = IncidentState(row[0])
        if not allowed(current, IncidentState(new)):
            log.error("refused illegal transition of incident %s: %s -> %s", incident_id, current, new)
            if self._on_illegal is not None:
                self._on_illegal(incident_id, current, IncidentState(new))
            raise IllegalTransition(f"incident {incident_id}: {current} -> {new} is not an allowed move")
        sets = ["state=?", "reason=?"]
        args: list[Any] = [IncidentState(new).value, reason]
        if new in CLOSED_STATES:
            sets.append("closed_at=?")
            args.append(self.now)
        self._update(incident_id, sets, args, fields)

    def mark(self, incident_id: str, **fields: Any) -> None:
        """Change an incident's fields but not its state (e.g. an on-call cancel request)."""
        self._update(incident_id, [], [], fields)

    def _update(self, incident_id: str, sets: list[str], args: list[Any], fields: dict[str, Any]) -> None:
        sets = [*sets, "updated_at=?"]
        args = [*args, self.now]
        for key, value in fields.items():
            if key not in ("opt_out", "dry_run", "tier", "run_id", "cancel_requested", "extra_vars"):
                raise JournalError(f"cannot set incident field {key!r}")
            sets.append(f"{key}=?")
            if key == "extra_vars":
                value = json.dumps(value, sort_keys=True)
            args.append(int(value) if isinstance(value, bool) else value)
        args.append(incident_id)
        self.conn.execute(f"UPDATE incidents SET {', '.join(sets)} WHERE id=?", args)  # noqa: S608

    # timeline and runs ------------------------------------------------------------------------
    def timeline(
        self,
        incident_id: str,
        phase: str,
        status: str,
        *,
        source: str,
        ts: float | None = None,
        run_id: int | None = None,
        detail: str = "",
    ) -> None:
        self.conn.execute(
            "INSERT INTO timeline (incident_id, phase, status, ts, run_id, source, detail)"
            " VALUES (?,?,?,?,?,?,?)",
            (incident_id, phase, status, self.now if ts is None else ts, run_id, source, detail),
        )

    def create_run(
        self,
        *,
        playbook: str,
        incident_ids: Sequence[str],
        nodes: Sequence[str],
        check_mode: bool,
        source: str,
        private_dir: str = "",
        events_path: str = "",
    ) -> int:
        return self.conn.insert(
            "INSERT INTO runs (playbook, incident_ids, nodes, check_mode, status, started_at,"
            " owner_pid, private_dir, events_path, source, autoheal_version) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                playbook,
                json.dumps(list(incident_ids)),
                json.dumps(list(nodes)),
                int(check_mode),
                RunStatus.RUNNING.value,
                self.now,
                _pid(),
                private_dir,
                events_path,
                source,
                __version__,
            ),
        )

    def update_run(self, run_id: int, **fields: Any) -> None:
        allowed = {
            "status",
            "rc",
            "finished_at",
            "play_pid",
            "private_dir",
            "events_path",
            "events_offset",
            "detail",
        }
        if not fields or not set(fields) <= allowed:
            raise JournalError(f"cannot set run fields {sorted(set(fields) - allowed)}")
        if "status" in fields:
            fields["status"] = RunStatus(fields["status"]).value
        sets = ", ".join(f"{k}=?" for k in fields)
        self.conn.execute(f"UPDATE runs SET {sets} WHERE id=?", (*fields.values(), run_id))  # noqa: S608

    def add_step(
        self,
        *,
        run_id: int,
        task: str,
        host: str,
        status: str,
        changed: bool,
        started_at: float | None,
        finished_at: float,
    ) -> None:
        self.conn.execute(
            "INSERT INTO steps (run_id, task, host, status, changed, started_at, finished_at)"
            " VALUES (?,?,?,?,?,?,?)",
            (run_id, task[:200], host[:253], status, int(changed), started_at, finished_at),
        )

    def set_setting(self, key: str, value: Any, actor: str = "") -> None:
        self.conn.execute(
            "INSERT INTO settings (key, value, updated_at, actor) VALUES (?,?,?,?)"
            " ON CONFLICT(key) DO UPDATE SET value=excluded.value, updated_at=excluded.updated_at,"
            " actor=excluded.actor",
            (key, json.dumps(value), self.now, actor),
        )

    def setting(self, key: str, default: Any = None) -> Any:
        """A setting as this transaction sees it (after the write lock: no other writer between)."""
        row = self.conn.execute("SELECT value FROM settings WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default


# A check run first in every write transaction of a journal handle; raising refuses the whole
# transaction. The leader's worker is guarded by its fencing token (remediation/fencing.py).
Guard = Callable[[Tx], None]


def _pid() -> int:
    import os

    return os.getpid()


class Journal:
    """A thread-safe handle on the journal database (one connection, serialised by a lock).

    Journal(path) opens, creating it if need be, the embedded SQLite file; Journal.postgres(dsn)
    a PostgreSQL database that several runner replicas may share.
    """

    def __init__(self, path: Path | Database, on_illegal: IllegalHook | None = None) -> None:
        self._db = path if isinstance(path, Database) else SqliteDatabase(path)
        self.path: Path | None = None if isinstance(path, Database) else path  # the SQLite file, if any
        self.name = self._db.name  # the file or the DSN (without password): for messages
        self.on_illegal = on_illegal  # set by the runtime: counts refused state changes
        self.guard: Guard | None = None  # set by the runtime under leader election
        self._lock = threading.RLock()
        try:
            self._migrate()
        except self._db.Error as exc:
            self._db.close()
            raise JournalError(f"journal {self.name}: cannot open: {exc}") from exc
        except BaseException:
            self._db.close()
            raise

    @classmethod
    def postgres(cls, dsn: str, on_illegal: IllegalHook | None = None) -> Journal:
        """The journal in a PostgreSQL database, named by a libpq DSN: a URL
        (postgresql://user@host:port/db) or conninfo. The password is not in the DSN: libpq reads
        $PGPASSWORD or $PGPASSFILE (~/.pgpass). Creates the schema if the database has none."""
        return cls(PostgresDatabase(dsn), on_illegal)

    @classmethod
    def configured(cls, path: Path | None, dsn: str | None, on_illegal: IllegalHook | None = None) -> Journal:
        """The journal a runner config names: PostgreSQL (journal_dsn) or a SQLite file (journal_path)."""
        if dsn is not None:
            return cls.postgres(dsn, on_illegal)
        if path is None:  # RunnerConfig's validator makes this unreachable
            raise JournalError("journal_path: set journal_path or journal_dsn")
        return cls(path, on_illegal)

    @property
    def schema_version(self) -> int:
        with self._lock:
            return self._db.schema_version()

    def _migrate(self) -> None:
        """Create the schema, or bring an older one up to SCHEMA_VERSION, in one write transaction
        (so two replicas opening a new PostgreSQL journal at once create it once). A current
        journal is only read: the CLI can open a journal whose disk is full."""
        db = self._db
        if db.schema_version() == SCHEMA_VERSION:
            return
        db.begin()
        try:
            version = db.schema_version()
            if version > SCHEMA_VERSION:
                raise JournalError(
                    f"journal {self.name}: schema version {version} is newer than this runner's"
                    f" ({SCHEMA_VERSION}); run the newer runner or restore a backup"
                )
            if version < SCHEMA_VERSION:  # else another replica did it while we waited
                fresh = not db.has_table("incidents")
                for stmt in db.ddl(_SCHEMA):  # IF NOT EXISTS: adds only what is missing
                    db.execute(stmt)
                version = SCHEMA_VERSION if fresh else max(version, 1)
                while version < SCHEMA_VERSION:
                    for stmt in db.ddl(_MIGRATIONS[version]):
                        db.execute(stmt)
                    version += 1
                    log.info("journal %s: migrated to schema version %d", self.name, version)
                db.set_schema_version(version)
        except BaseException:
            db.rollback()
            raise
        db.commit()

    def prune(self, before: float) -> int:
        """Forget closed incidents that closed before `before`, with their alerts, timeline,
        runs and steps (a run only once none of its incidents is kept); returns how many
        incidents went. The journal is the queue, not the archive: the notifications and the
        metrics are the long record."""
        with self.transaction() as tx:
            c = tx.conn
            cmarks = ",".join("?" * len(CLOSED_STATES))
            gone = [
                str(r[0])
                for r in c.execute(
                    f"SELECT id FROM incidents WHERE state IN ({cmarks}) AND closed_at < ?",  # noqa: S608
                    (*CLOSED_STATES, before),
                )
            ]
            c.execute("CREATE TEMP TABLE IF NOT EXISTS prune_ids (id TEXT PRIMARY KEY)")
            c.execute("DELETE FROM prune_ids")
            c.executemany("INSERT INTO prune_ids VALUES (?)", [(i,) for i in gone])
            c.execute("DELETE FROM timeline WHERE incident_id IN (SELECT id FROM prune_ids)")
            c.execute("DELETE FROM alerts WHERE incident_id IN (SELECT id FROM prune_ids)")
            c.execute("DELETE FROM alerts WHERE incident_id IS NULL AND received_at < ?", (before,))
            c.execute("DELETE FROM incidents WHERE id IN (SELECT id FROM prune_ids)")
            c.execute(
                "DELETE FROM runs WHERE finished_at IS NOT NULL AND finished_at < ? AND NOT EXISTS"  # noqa: S608
                f" (SELECT 1 FROM {c.json_values('runs.incident_ids')}, incidents"
                " WHERE incidents.id = j.value)",
                (before,),
            )
            c.execute("DELETE FROM steps WHERE run_id NOT IN (SELECT id FROM runs)")
        return len(gone)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def transaction(self, now: float | None = None) -> Iterator[Tx]:
        """One atomic, durable write; raises JournalError (nothing written) on failure. Writers
        take turns, across processes and replicas too (Database.begin)."""
        db = self._db
        with self._lock:
            try:
                db.begin()
            except db.Error as exc:
                raise JournalError(f"journal {self.name}: cannot begin: {exc}") from exc
            try:
                tx = Tx(db, time.time() if now is None else now, self.on_illegal)
                if self.guard is not None:
                    self.guard(tx)
                yield tx
            except db.Error as exc:  # e.g. SQLITE_FULL (the disk is full), a lost server connection
                self._rollback()
                raise JournalError(f"journal {self.name}: write failed: {exc}") from exc
            except BaseException:
                self._rollback()
                raise
            try:
                db.commit()
            except db.Error as exc:
                self._rollback()
                raise JournalError(f"journal {self.name}: commit failed: {exc}") from exc

    def _rollback(self) -> None:
        """Undo the open transaction, if the database has not already (Database.rollback)."""
        try:
            self._db.rollback()
        except self._db.Error as exc:
            log.error("journal %s: rollback failed: %s", self.name, exc)

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        with self._lock:
            try:
                return self._db.read(sql, args)
            except self._db.Error as exc:
                raise JournalError(f"journal {self.name}: query failed: {exc}") from exc

    # reads ------------------------------------------------------------------------------------
    def incident(self, incident_id: str) -> IncidentRecord | None:
        rows = self._query("SELECT * FROM incidents WHERE id=?", (incident_id,))
        return _incident(rows[0]) if rows else None

    def require_incident(self, incident_id: str) -> IncidentRecord:
        """An incident this process created or was handed: its absence is a journal fault."""
        inc = self.incident(incident_id)
        if inc is None:
            raise JournalError(f"journal {self.name}: incident {incident_id} is missing")
        return inc

    def incidents(
        self, states: Sequence[str] | None = None, limit: int | None = None
    ) -> list[IncidentRecord]:
        """Incidents oldest first. In `states`: every one of them, unless `limit` asks for only
        the newest - the worker and the policy must see a whole storm (a cap of 1000 once left
        every held incident past the first 1000 unfenced, and would undercount a budget's nodes
        in use). Without `states`: the newest `limit` (RECENT_INCIDENTS by default) of any state."""
        where, params = "", tuple[object, ...]()
        if states:
            where, params = f"WHERE state IN ({','.join('?' * len(states))})", tuple(states)
        elif limit is None:
            limit = RECENT_INCIDENTS
        if limit is None:
            sql = f"SELECT * FROM incidents {where} ORDER BY opened_at, id"  # noqa: S608
        else:
            sql = (
                f"SELECT * FROM (SELECT * FROM incidents {where} ORDER BY opened_at DESC, id DESC"  # noqa: S608
                " LIMIT ?) AS recent ORDER BY opened_at, id"
            )
            params = (*params, limit)
        return [_incident(r) for r in self._query(sql, params)]

    def closed_since(self, since: float, states: Sequence[str]) -> list[IncidentRecord]:
        """Incidents in `states` closed at or after `since`, oldest first: a loop that looks back
        a week reads that week (the closed_at index), not the whole history, every pass."""
        marks = ",".join("?" * len(states))
        rows = self._query(
            f"SELECT * FROM incidents WHERE closed_at >= ? AND state IN ({marks})"  # noqa: S608
            " ORDER BY opened_at, id",
            (since, *states),
        )
        return [_incident(r) for r in rows]

    def cancel_requests(self) -> list[IncidentRecord]:
        """Open incidents an on-call engineer asked to cancel."""
        marks = ",".join("?" * len(CANCELLABLE_NOW))
        rows = self._query(
            f"SELECT * FROM incidents WHERE cancel_requested=1 AND state IN ({marks})"  # noqa: S608
            " ORDER BY opened_at",
            CANCELLABLE_NOW,
        )
        return [_incident(r) for r in rows]

    def count_states(self) -> dict[str, int]:
        rows = self._query("SELECT state, COUNT(*) FROM incidents GROUP BY state")
        return {str(r[0]): int(r[1]) for r in rows}

    def count_node_incidents(self, node: str, since: float) -> int:
        """Fatal (not notify-only) incidents opened on `node` at or after `since`; manual runs
        by on-call and a degraded node's validation (source `return`) do not count."""
        rows = self._query(
            "SELECT COUNT(*) FROM incidents WHERE node=? AND opened_at >= ?"
            " AND source NOT IN ('manual', 'return') AND tier != 'notify'",
            (node, since),
        )
        return int(rows[0][0])

    def count_gpu_incidents(self, node: str, gpu: int, xids: Sequence[int], since: float) -> int:
        """Incidents of `xids` opened on GPU `gpu` of `node` at or after `since`; manual runs do
        not count. A query, not a scan of recent incidents: in a storm the window may hold more
        incidents than any fixed page."""
        if not xids:
            return 0
        marks = ",".join("?" * len(xids))
        rows = self._query(
            "SELECT COUNT(*) FROM incidents WHERE node=? AND gpu=? AND opened_at >= ?"  # noqa: S608
            f" AND source NOT IN ('manual', 'return') AND xid IN ({marks})",
            (node, gpu, since, *map(int, xids)),
        )
        return int(rows[0][0])

    def timeline(self, incident_id: str) -> list[TimelineEntry]:
        rows = self._query(
            "SELECT incident_id, phase, status, ts, run_id, source, detail FROM timeline"
            " WHERE incident_id=? ORDER BY ts, id",
            (incident_id,),
        )
        return [TimelineEntry(**dict(r)) for r in rows]

    def done_phases(self, incident_id: str) -> list[str]:
        """Phases the play reported finished (status ok) for this incident, in order."""
        rows = self._query(
            "SELECT phase FROM timeline WHERE incident_id=? AND status='ok' AND source='play'"
            " GROUP BY phase ORDER BY MIN(ts)",
            (incident_id,),
        )
        return [str(r[0]) for r in rows]

    def run(self, run_id: int) -> RunRecord | None:
        rows = self._query("SELECT * FROM runs WHERE id=?", (run_id,))
        return _run(rows[0]) if rows else None

    def require_run(self, run_id: int) -> RunRecord:
        """A run this process created: its absence is a journal fault."""
        run = self.run(run_id)
        if run is None:
            raise JournalError(f"journal {self.name}: run {run_id} is missing")
        return run

    def runs(self, status: str | None = None) -> list[RunRecord]:
        if status:
            rows = self._query("SELECT * FROM runs WHERE status=? ORDER BY id", (status,))
        else:
            rows = self._query("SELECT * FROM runs ORDER BY id")
        return [_run(r) for r in rows]

    def runs_of(self, incident_id: str) -> list[RunRecord]:
        rows = self._query(
            f"SELECT runs.* FROM runs, {self._db.json_values('runs.incident_ids')}"  # noqa: S608
            " WHERE j.value=? ORDER BY runs.id",
            (incident_id,),
        )
        return [_run(r) for r in rows]

    def steps(self, run_id: int) -> list[dict[str, Any]]:
        return [dict(r) for r in self._query("SELECT * FROM steps WHERE run_id=? ORDER BY id", (run_id,))]

    def alerts(self, incident_id: str | None = None) -> list[dict[str, Any]]:
        if incident_id is None:
            rows = self._query("SELECT * FROM alerts ORDER BY id")
        else:
            rows = self._query("SELECT * FROM alerts WHERE incident_id=? ORDER BY id", (incident_id,))
        return [dict(r) for r in rows]

    def setting(self, key: str, default: Any = None) -> Any:
        rows = self._query("SELECT value FROM settings WHERE key=?", (key,))
        return json.loads(rows[0][0]) if rows else default

    def settings(self) -> dict[str, dict[str, Any]]:
        rows = self._query("SELECT key, value, updated_at, actor FROM settings")
        return {str(r[0]): {"value": json.loads(r[1]), "updated_at": r[2], "actor": r[3]} for r in rows}
