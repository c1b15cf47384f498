"""What only the PostgreSQL journal has to get right: the same schema as SQLite's, two runner
replicas sharing one database (their writes take turns: no lost update, one incident per alert),
and a server that restarts or stops (reconnect between transactions, a clear error otherwise).

The journal's behaviour itself is tested on both engines by the journal_target fixture."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from autoheal.xid import load_catalog
from remediation.config import load_config
from remediation.errors import JournalError
from remediation.incidents import Intake
from remediation.journal import SCHEMA_VERSION, Journal
from remediation.journal_db import PgRow, pg_sql, redact
from remediation.models import WebhookPayload
from remediation.rules import load_rules
from remediation.states import IncidentState
from tests.remediation.remhelp import alert, open_incident, payload, write_config

TABLES = ("alerts", "incidents", "runs", "steps", "timeline", "settings")
PG_TYPE = {"INTEGER": "bigint", "REAL": "double precision", "TEXT": "text"}


def _open(tx, node: str = "gpu-1") -> str:
    return open_incident(tx, node, extra_vars={"k": [1, 2]})  # a JSON value that must round-trip


def _both(fn, *args):
    """Run fn(arg) for each arg at the same moment, each in its own thread; their results."""
    barrier = threading.Barrier(len(args))

    def run(arg):
        barrier.wait()
        return fn(arg)

    with ThreadPoolExecutor(len(args)) as pool:
        return list(pool.map(run, args))


def test_pg_rows_read_like_sqlite_rows_and_the_sql_translates():
    row = PgRow({"id": 0, "state": 1}, (7, "pending"))
    assert (row[0], row["state"], dict(row), list(row), len(row)) == (
        7,
        "pending",
        {"id": 7, "state": "pending"},
        [7, "pending"],
        2,
    )
    with pytest.raises(KeyError):
        row["nope"]
    assert (
        pg_sql("SELECT * FROM t WHERE a=? AND b LIKE '5%'") == "SELECT * FROM t WHERE a=%s AND b LIKE '5%%'"
    )


def test_a_dsn_is_shown_without_its_password():
    assert redact("postgresql://runner:s3cret@db.example:5433/autoheal?sslmode=require") == (
        "postgresql://runner@db.example:5433/autoheal?sslmode=require"
    )
    assert (
        redact("host=/run/pg port=5432 dbname=j user=u password=s3cret")
        == "postgresql://u@%2Frun%2Fpg:5432/j"
    )
    with pytest.raises(JournalError, match="not a PostgreSQL DSN") as err:
        Journal.postgres("postgresql://u:s3cret@h/db?nosuchoption=1")
    assert "s3cret" not in str(err.value)


def test_both_engines_have_the_same_tables_columns_and_indexes(tmp_path, pg_dsn):
    Journal(tmp_path / "j.sqlite").close()
    Journal.postgres(pg_dsn).close()
    lite = sqlite3.connect(tmp_path / "j.sqlite")
    lite_cols = {
        (t, name, PG_TYPE[decl], bool(notnull or pk), None if dflt is None else str(dflt).strip("'"))
        for t in TABLES
        for _, name, decl, notnull, dflt, pk in lite.execute(f"PRAGMA table_info({t})")
    }
    lite_idx = {
        r[0] for r in lite.execute("SELECT name FROM sqlite_master WHERE type='index' AND sql IS NOT NULL")
    }
    lite.close()
    with psycopg.connect(pg_dsn) as pg:
        pg_cols = {
            (t, name, dtype, nullable == "NO", None if dflt is None else dflt.split("::")[0].strip("'"))
            for t, name, dtype, nullable, dflt in pg.execute(
                "SELECT table_name, column_name, data_type, is_nullable, column_default"
                " FROM information_schema.columns WHERE table_schema = current_schema()"
                " AND table_name = ANY(%s)",
                (list(TABLES),),
            )
        }
        pg_idx = {
            r[0]
            for r in pg.execute(
                "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
                " AND indexname NOT LIKE '%%_pkey'"
            )
        }
        [(identity,)] = pg.execute(
            "SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema()"
            " AND is_identity = 'YES'"
        ).fetchall()
    assert len(lite_cols) == 70
    assert pg_cols == lite_cols
    assert pg_idx == lite_idx and len(lite_idx) == 7
    assert identity == 4  # alerts, runs, steps, timeline: numbered by the database, as in SQLite


def test_replicas_opening_a_new_database_at_once_create_the_schema_once(pg_dsn):
    journals = _both(lambda _: Journal.postgres(pg_dsn), *range(4))
    assert [j.schema_version for j in journals] == [SCHEMA_VERSION] * 4
    for j in journals:
        j.close()


def test_two_replicas_writing_at_once_lose_no_update(pg_dsn):
    replicas = [Journal.postgres(pg_dsn), Journal.postgres(pg_dsn)]
    with replicas[0].transaction() as tx:
        tx.set_setting("n", 0)

    def bump(journal):
        for _ in range(25):
            with journal.transaction() as tx:
                [row] = tx.conn.execute("SELECT value FROM settings WHERE key='n'").fetchall()
                time.sleep(0.002)  # a read-to-write window, where an unserialised writer loses updates
                tx.set_setting("n", json.loads(row[0]) + 1)

    _both(bump, *replicas)
    assert replicas[1].setting("n") == 50
    for j in replicas:
        j.close()


def test_two_replicas_given_one_alert_open_one_incident(tmp_path, pg_dsn):
    cfg = load_config(write_config(tmp_path), env={})
    rules, catalog = load_rules(cfg.rules_file), load_catalog()
    replicas = [Journal.postgres(pg_dsn), Journal.postgres(pg_dsn)]
    intakes = [Intake(j, rules, catalog, 900) for j in replicas]
    nodes = [f"gpu-{i}" for i in range(1, 21)]
    for node in nodes:  # the same delivery reaches both replicas at the same moment
        body = WebhookPayload.model_validate(payload(alert(node)))
        results = _both(lambda intake, body=body: intake.record(body), *intakes)
        assert sorted(len(r.created) for r in results) == [0, 1], node
    incidents = replicas[0].incidents()
    assert sorted(i.node for i in incidents) == sorted(nodes)
    assert {i.alert_count for i in incidents} == {2}
    assert len(replicas[1].alerts()) == 40
    for j in replicas:
        j.close()


def test_a_restarted_server_is_reconnected_between_transactions(own_pg):
    journal = Journal.postgres(own_pg.dsn())
    with journal.transaction() as tx:
        iid = _open(tx)
    own_pg.stop()
    own_pg.start()
    assert journal.require_incident(iid).extra_vars == {"k": [1, 2]}  # a read reconnects
    own_pg.stop()
    own_pg.start()
    with journal.transaction() as tx:  # so does a write transaction
        tx.transition(iid, IncidentState.ADMITTED, "after the restart")
    assert journal.require_incident(iid).state is IncidentState.ADMITTED
    journal.close()


def test_a_stopped_server_is_a_journal_error_naming_the_dsn_without_its_password(own_pg):
    dsn = own_pg.dsn().replace("postgres@", "postgres:hunter2@")  # trusted: the password is not checked
    journal = Journal.postgres(dsn)
    own_pg.stop()
    where = f"postgresql://postgres@127.0.0.1:{own_pg.port}/autoheal"
    with pytest.raises(JournalError) as err, journal.transaction():
        pass
    assert str(err.value).startswith(f"journal {where}: cannot begin:"), err.value
    with pytest.raises(JournalError) as err:
        journal.incidents()
    assert str(err.value).startswith(f"journal {where}: query failed:"), err.value
    with pytest.raises(JournalError) as err:
        Journal.postgres(dsn)
    assert str(err.value).startswith(f"journal {where}: cannot open:"), err.value
    assert "hunter2" not in str(err.value)
    journal.close()


def test_a_connection_lost_inside_a_transaction_writes_nothing_and_the_next_one_works(pg_dsn):
    journal = Journal.postgres(pg_dsn)
    with pytest.raises(JournalError, match="write failed"), journal.transaction() as tx:
        tx.set_setting("first", 1)
        [(pid,)] = tx.conn.execute("SELECT pg_backend_pid()").fetchall()
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))  # waits till it is gone
        tx.set_setting("second", 2)
    assert journal.settings() == {}  # nothing half-written; this read connected again
    with journal.transaction() as tx:
        tx.set_setting("third", 3)
    assert list(journal.settings()) == ["third"]
    journal.close()


def test_a_failed_statement_caught_inside_a_transaction_fails_the_commit(pg_dsn):
    """SQLite undoes only the failed statement; PostgreSQL aborts the whole transaction and would
    answer COMMIT with a silent ROLLBACK: the journal says so instead of reporting success."""
    journal = Journal.postgres(pg_dsn)
    with pytest.raises(JournalError, match="commit failed"), journal.transaction() as tx:
        tx.set_setting("first", 1)
        with contextlib.suppress(psycopg.Error):
            tx.conn.execute("SELECT * FROM no_such_table")
    assert journal.settings() == {}
    with journal.transaction() as tx:
        tx.set_setting("next", 2)
    assert journal.setting("next") == 2
    journal.close()
