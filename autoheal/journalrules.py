"""The rules for the runner's journal, written once for everything that configures a runner.

Four places configure the journal and must agree: the runner's own config file
(remediation/config.py: `journal_path` or `journal_dsn`), the RemediationRunner component
(components/runner.py: `journal`, `postgres`, `replicas`), the stack file that declares it
(components/config.py, `autoheal:runner`) and the lab (lab/config.py: `runner_journal`,
`runner_replicas`). The runner and the components may not import each other
(docs/architecture.md#layers), so the rules live here, in the shared core:

- **Replicas need PostgreSQL.** A SQLite journal has one writer (its file, on one volume); more
  than one runner needs the shared PostgreSQL journal (and leader election).
- **No password in the DSN.** A PostgreSQL URL or conninfo never spells out a password; the
  password comes from a Secret (PGPASSWORD) or PGPASSFILE, so it is in no config file, ConfigMap
  or stack state in clear.

Each caller names its own keys in its messages; the judgement is made here.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

JournalKind = Literal["sqlite", "postgres"]
JOURNAL_KINDS: tuple[JournalKind, ...] = ("sqlite", "postgres")
POSTGRES_URL_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(dsn: str) -> bool:
    """Whether `dsn` is a libpq URL (rather than a `key=value` conninfo string)."""
    return dsn.startswith(POSTGRES_URL_SCHEMES)


def dsn_has_password(dsn: str) -> bool:
    """Whether a libpq URL or conninfo string spells out a password."""
    if is_postgres_url(dsn):
        try:
            parts = urlsplit(dsn)
            return parts.password is not None or "password=" in (parts.query or "")
        except ValueError:
            return False
    return any(part.strip().startswith("password") for part in dsn.split())


def replicas_problem(journal: str, replicas: int) -> str | None:
    """Why `replicas` runners cannot share a journal of kind `journal`; None when they can."""
    if journal not in JOURNAL_KINDS:
        return f"journal must be 'sqlite' or 'postgres', got {journal!r}"
    if replicas < 1:
        return f"replicas must be at least 1, got {replicas}"
    if journal == "sqlite" and replicas != 1:
        return (
            f"replicas={replicas} needs journal='postgres': a SQLite journal has one writer"
            " (its file on one PVC); set journal='postgres' and postgres.url"
        )
    return None


def postgres_url_problem(url: str) -> str | None:
    """Why `url` cannot be the PostgreSQL journal's URL in a deployment; None when it can."""
    if not is_postgres_url(url):
        return f"postgres.url must be a postgresql:// URL, got {url!r}"
    if dsn_has_password(url):
        return "postgres.url must not carry a password: set postgres.password (a Secret)"
    return None
