"""The journal's rules (autoheal/journalrules.py), which the runner's config, the RemediationRunner
component and the stack file all apply: replicas need PostgreSQL; no password in the DSN."""

from __future__ import annotations

import pytest

from autoheal.journalrules import dsn_has_password, postgres_url_problem, replicas_problem


@pytest.mark.parametrize(
    ("dsn", "has"),
    [
        ("postgresql://autoheal@db:5432/autoheal", False),
        ("postgres://autoheal@db/autoheal?sslmode=verify-full", False),
        ("postgresql://autoheal:secret@db/autoheal", True),
        ("postgresql://autoheal@db/autoheal?password=secret", True),
        ("host=db dbname=autoheal user=autoheal", False),
        ("host=db dbname=autoheal password=secret", True),
        ("postgresql://[::1/autoheal", False),  # unparsable: the database refuses it, not this rule
    ],
)
def test_a_password_in_a_url_or_conninfo_is_seen(dsn, has):
    assert dsn_has_password(dsn) is has


@pytest.mark.parametrize(
    ("journal", "replicas", "problem"),
    [
        ("sqlite", 1, None),
        ("postgres", 1, None),
        ("postgres", 5, None),
        ("sqlite", 2, "replicas=2 needs journal='postgres': a SQLite journal has one writer"),
        ("postgres", 0, "replicas must be at least 1, got 0"),
        ("mysql", 1, "journal must be 'sqlite' or 'postgres', got 'mysql'"),
    ],
)
def test_replicas_need_postgres(journal, replicas, problem):
    found = replicas_problem(journal, replicas)
    assert found == problem if problem is None else (found is not None and found.startswith(problem))


def test_a_deployments_postgres_url_is_a_url_without_a_password():
    assert postgres_url_problem("postgresql://autoheal@db/autoheal") is None
    assert "must be a postgresql:// URL" in str(postgres_url_problem("host=db"))
    assert "must not carry a password" in str(postgres_url_problem("postgresql://a:b@db/x"))
    assert "must not carry a password" in str(postgres_url_problem("postgresql://a@db/x?password=b"))
