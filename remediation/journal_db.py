"""The journal's two databases: an embedded SQLite file (the default) and a shared PostgreSQL.

journal.py writes one SQL, SQLite's, with `?` placeholders, and calls the few operations below;
each Database runs that SQL on its engine and owns everything that differs, so no journal method
asks which engine it is on:

- connecting, and how a write transaction starts. SQLite's BEGIN IMMEDIATE makes writers take
  turns across processes; PostgreSQL gets the same from BEGIN plus a transaction-scoped advisory
  lock, so two runner replicas sharing one database write one at a time and each transaction reads
  what the last one committed (READ COMMITTED takes a fresh snapshot per statement, after the lock);
- the schema's column types, where the schema version lives, a JSON array read as rows, a new
  row's id, the placeholder, the error type, and when there is something left to roll back;
- what a dropped server connection means: PostgreSQL reconnects once between transactions (a
  restarted server must not end the runner's journal for good), never inside one.
"""

from __future__ import annotations

import logging
import re
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote, urlencode

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from remediation.errors import JournalError

log = logging.getLogger(__name__)
T = TypeVar("T")

# pg_advisory_xact_lock's key: every journal writer of a database takes this one ("autoheal" in
# ASCII). Advisory locks are per database, so journals in different databases never wait on it.
PG_WRITE_LOCK = int.from_bytes(b"autoheal", "big")
# As SQLite's busy_timeout: a writer waits this long for the other replica's transaction, then fails.
LOCK_TIMEOUT_S = 30
CONNECT_TIMEOUT_S = 10  # unless the DSN says otherwise


class Row(Protocol):
    """A result row: by position, by column name, and dict(row) (sqlite3.Row, PgRow)."""

    def __getitem__(self, key: int | str, /) -> Any: ...
    def keys(self) -> list[str]: ...


class Cursor(Protocol):
    def fetchone(self) -> Any: ...
    def fetchall(self) -> Sequence[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Database(ABC):
    """One connection to the journal's database, in autocommit mode with explicit transactions.

    Not thread-safe by itself: the Journal's lock serialises every call.
    """

    name: str  # for messages and logs: the file, or the DSN without its password
    Error: type[Exception]  # what the driver raises; the Journal turns it into JournalError

    @abstractmethod
    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        """Run one statement written with `?` placeholders."""

    @abstractmethod
    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...

    @abstractmethod
    def insert(self, sql: str, args: Sequence[Any]) -> int:
        """Run an INSERT into a table with an `id` key and return the new row's id."""

    @abstractmethod
    def begin(self) -> None:
        """Start a write transaction, after every other writer of this journal has finished."""

    def commit(self) -> None:
        self.execute("COMMIT")

    @abstractmethod
    def rollback(self) -> None:
        """Undo the open transaction, if the engine has not already ended it itself."""

    def read(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        """A query outside any write transaction."""
        return list(self.execute(sql, args).fetchall())

    @abstractmethod
    def has_table(self, name: str) -> bool: ...

    @abstractmethod
    def schema_version(self) -> int:
        """The schema version recorded in the database; 0 when none is (new, or before versioning)."""

    @abstractmethod
    def set_schema_version(self, version: int) -> None:
        """Record the schema version (inside the migrating transaction)."""

    def ddl(self, script: str) -> list[str]:
        """The statements of a schema script written in SQLite's types, in this engine's."""
        return [part.strip() for part in script.split(";") if part.strip()]  # no ';' in our literals

    @abstractmethod
    def json_values(self, array: str) -> str:
        """A FROM item `j` with one row per element of the JSON array (text) `array`, in `j.value`."""

    @abstractmethod
    def close(self) -> None: ...


class SqliteDatabase(Database):
    """The embedded default: one file in WAL mode, so the CLI reads while the server writes."""

    Error = sqlite3.Error

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
            self.conn.row_factory = sqlite3.Row
            self.conn.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit is on disk (WAL fsynced) before the webhook answers 2xx.
            self.conn.execute("PRAGMA synchronous=FULL")
            self.conn.execute("PRAGMA busy_timeout=30000")
        except sqlite3.Error as exc:
            raise JournalError(f"journal {path}: cannot open: {exc}") from exc

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        return self.conn.execute(sql, args)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self.conn.executemany(sql, rows)

    def insert(self, sql: str, args: Sequence[Any]) -> int:
        cur = self.conn.execute(sql, args)
        if cur.lastrowid is None:
            raise JournalError(f"journal {self.name}: the new row got no id")
        return int(cur.lastrowid)

    def begin(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def rollback(self) -> None:
        # SQLite rolls back by itself on some errors (SQLITE_FULL among them), and a second
        # ROLLBACK would hide the first error.
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def has_table(self, name: str) -> bool:
        return (
            self.conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)).fetchone()
            is not None
        )

    def schema_version(self) -> int:
        return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    def set_schema_version(self, version: int) -> None:
        self.conn.execute(f"PRAGMA user_version={int(version)}")

    def json_values(self, array: str) -> str:
        return f"json_each({array}) AS j"

    def close(self) -> None:
        self.conn.close()


class PgRow:
    """A PostgreSQL result row read as a sqlite3.Row is: row[0], row["state"], dict(row)."""

    __slots__ = ("_index", "_values")

    def __init__(self, index: dict[str, int], values: Sequence[Any]) -> None:
        self._index = index
        self._values = values

    def __getitem__(self, key: int | str, /) -> Any:
        return self._values[self._index[key] if isinstance(key, str) else key]

    def keys(self) -> list[str]:
        return list(self._index)

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __repr__(self) -> str:
        return f"PgRow({dict(zip(self._index, self._values, strict=True))!r})"


def _pg_rows(cursor: psycopg.Cursor[Any]) -> Callable[[Sequence[Any]], PgRow]:
    index = {col.name: i for i, col in enumerate(cursor.description or ())}
    return lambda values: PgRow(index, values)


# SQLite's column types in PostgreSQL's words: the same values (SQLite's INTEGER is 64-bit and
# its REAL a double; PostgreSQL's REAL is 4 bytes), an `INTEGER PRIMARY KEY` numbered for us.
_PG_TYPES = (
    (re.compile(r"\bINTEGER PRIMARY KEY\b"), "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
)


def pg_sql(sql: str) -> str:
    """`?` placeholders as psycopg's `%s` (our SQL has no `?` or `%` inside a literal)."""
    return sql.replace("%", "%%").replace("?", "%s")


def redact(dsn: str) -> str:
    """The DSN (URL or conninfo) as a postgresql:// URL without its password, for messages."""
    params = conninfo_to_dict(dsn)
    params.pop("password", None)
    user = params.pop("user", None)
    host = str(params.pop("host", "") or "")
    port = params.pop("port", None)
    dbname = params.pop("dbname", None)
    url = "postgresql://" + (f"{quote(str(user), safe='')}@" if user else "") + quote(host, safe=",")
    url += f":{port}" if port else ""
    url += f"/{quote(str(dbname), safe='')}" if dbname else ""
    return url + (f"?{urlencode(sorted(params.items()))}" if params else "")


class PostgresDatabase(Database):
    """A PostgreSQL database that several runner replicas may share.

    The password is never part of the runner's configuration: libpq reads it from $PGPASSWORD
    or the file $PGPASSFILE (default ~/.pgpass) when the DSN has none.
    """

    Error = psycopg.Error

    def __init__(self, dsn: str) -> None:
        try:
            params = conninfo_to_dict(dsn)
            self.name = redact(dsn)
        except psycopg.Error as exc:
            # the DSN itself is not shown: it may hold a password
            raise JournalError(f"journal: not a PostgreSQL DSN (URL or conninfo): {exc}") from exc
        self._dsn = dsn
        self._connect_args: dict[str, Any] = (
            {} if "connect_timeout" in params else {"connect_timeout": CONNECT_TIMEOUT_S}
        )
        self._in_tx = False  # between begin() and commit()/rollback(): never reconnect then
        self._closed = False
        try:
            self.conn = self._connect()
        except psycopg.Error as exc:
            raise JournalError(f"journal {self.name}: cannot open: {exc}") from exc

    def _connect(self) -> psycopg.Connection[PgRow]:
        conn = psycopg.connect(self._dsn, autocommit=True, row_factory=_pg_rows, **self._connect_args)
        conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT_S}s'")
        return conn

    def _again_if_dropped(self, op: Callable[[], T]) -> T:
        """Run `op`; if the server connection turns out to have dropped (the server restarted, a
        firewall cut an idle connection), connect again once and rerun it. Only for what is safe
        to repeat, outside a transaction: a read, or the start of one (nothing written yet)."""
        try:
            return op()
        except psycopg.OperationalError:
            if self._in_tx or self._closed or not (self.conn.closed or self.conn.broken):
                raise
        log.warning("journal %s: the server connection dropped; connecting again", self.name)
        self.conn = self._connect()
        return op()

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        return self.conn.execute(pg_sql(sql), tuple(args))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(pg_sql(sql), rows)

    def insert(self, sql: str, args: Sequence[Any]) -> int:
        row = self.execute(f"{sql} RETURNING id", args).fetchone()
        if row is None:
            raise JournalError(f"journal {self.name}: the new row got no id")
        return int(row[0])

    def begin(self) -> None:
        self._again_if_dropped(self._begin)
        self._in_tx = True

    def _begin(self) -> None:
        self.conn.execute("BEGIN")
        try:
            self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (PG_WRITE_LOCK,))
        except psycopg.Error:
            self._end()
            raise

    def commit(self) -> None:
        self._in_tx = False
        if self.conn.info.transaction_status == TransactionStatus.INERROR:
            # PostgreSQL would answer this COMMIT with a silent ROLLBACK (SQLite, where a failed
            # statement undoes only itself, would commit the rest): say that nothing was written
            self._end()
            raise psycopg.OperationalError("a statement of the transaction failed: it was rolled back")
        self.execute("COMMIT")

    def rollback(self) -> None:
        self._in_tx = False
        self._end()

    def _end(self) -> None:
        """ROLLBACK if the server still holds a transaction of ours (not after a dropped connection,
        nor after a failed COMMIT, which PostgreSQL has already rolled back)."""
        if self.conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
            self.conn.execute("ROLLBACK")

    def read(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        return self._again_if_dropped(lambda: list(self.execute(sql, args).fetchall()))

    def has_table(self, name: str) -> bool:
        # a query of the catalog, not to_regclass(): that reads the session's catalog cache, which
        # may still miss a table another replica created while this one waited for the lock
        row = self.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables"
            " WHERE schemaname = current_schema() AND tablename = ?)",
            (name,),
        ).fetchone()
        return bool(row is not None and row[0])

    def schema_version(self) -> int:
        if not self.has_table("schema_version"):
            return 0
        row = self.execute("SELECT version FROM schema_version").fetchone()
        return 0 if row is None else int(row[0])

    def set_schema_version(self, version: int) -> None:
        # one row (the key can only be TRUE): PostgreSQL has no PRAGMA user_version
        self.execute(
            "CREATE TABLE IF NOT EXISTS schema_version"
            " (one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one), version BIGINT NOT NULL)"
        )
        self.execute(
            "INSERT INTO schema_version (version) VALUES (?)"
            " ON CONFLICT (one) DO UPDATE SET version = excluded.version",
            (int(version),),
        )

    def ddl(self, script: str) -> list[str]:
        statements = super().ddl(script)
        for pattern, pg_type in _PG_TYPES:
            statements = [pattern.sub(pg_type, s) for s in statements]
        return statements

    def json_values(self, array: str) -> str:
        return f"jsonb_array_elements_text(({array})::jsonb) AS j(value)"

    def close(self) -> None:
        self._closed = True
        self.conn.close()
