"""A private PostgreSQL server on loopback, for the tests and the lab's shared journal.

Debian's server (package postgresql; the newest of /usr/lib/postgresql/<version>/bin) runs a
throwaway cluster in a folder of ours: the data, the log and the unix socket all live there, the
server listens on 127.0.0.1 only, at the port we give, and trusts connections from that address
and that socket only (no password to hand around; nothing off the machine can reach it). fsync
stays on, as in production: a commit costs what it will cost there. Nothing global is touched or
reused: no system cluster, no /var/run/postgresql, no service unit.

PostgreSQL refuses to run as root, so as root the server runs as the `postgres` OS user (the
package creates it) and the folder is handed to that user; every folder above it must let that
user through (a folder under /tmp does).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

import psycopg
from psycopg import sql

from autoheal.errors import LabError

PG_ROOT = Path("/usr/lib/postgresql")
OS_USER = "postgres"  # who runs the server when we are root
SUPERUSER = "postgres"  # the cluster's superuser (initdb -U), trusted from loopback and the socket
SOCKET_PATH_MAX = 107  # bytes in a unix socket path (sun_path), the terminating NUL aside


def server_bin() -> Path:
    """The bin folder of the newest installed PostgreSQL server (no version written down here)."""

    def version(bin_dir: Path) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", bin_dir.parent.name))

    found = sorted((b for b in PG_ROOT.glob("*/bin") if (b / "initdb").is_file()), key=version)
    if not found:
        raise LabError(f"postgres: no server in {PG_ROOT}/*/bin (scripts/bootstrap.sh installs postgresql)")
    return found[-1]


class PostgresServer:
    """One throwaway cluster in `folder`, served on 127.0.0.1:`port`; a context manager that
    always stops it. start() returns the DSN of `database`, created on first start."""

    def __init__(self, folder: Path, port: int, database: str = "autoheal") -> None:
        self.folder = folder.resolve()
        self.port = port
        self.database = database
        self.bin = server_bin()
        self.data = self.folder / "data"
        self.log = self.folder / "server.log"
        socket = self.folder / f".s.PGSQL.{port}"
        if len(os.fsencode(socket)) > SOCKET_PATH_MAX:
            raise LabError(f"postgres: {self.folder} is too deep for a unix socket path ({socket})")
        self._owner = pwd.getpwnam(OS_USER) if os.geteuid() == 0 else None

    def dsn(self, database: str | None = None) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database or self.database}"

    def start(self) -> str:
        """Create the cluster if there is none yet, start the server and wait until it accepts
        connections, create the database if missing; returns its DSN."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._owner is not None:
            os.chown(self.folder, self._owner.pw_uid, self._owner.pw_gid)
            os.chmod(self.folder, 0o700)
            if self._run(["test", "-w", str(self.folder)], check=False).returncode != 0:
                raise LabError(
                    f"postgres: the {OS_USER} user cannot reach {self.folder} (a folder above it is closed)"
                )
        if not (self.data / "PG_VERSION").exists():
            self._initdb()
        self._write(
            self.data / "autoheal.conf",
            f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
            f"unix_socket_directories = '{self.folder}'\nfsync = on\nsynchronous_commit = on\n",
        )
        started = self._run(
            [str(self.bin / "pg_ctl"), "start", "-w", "-t", "30", "-D", str(self.data), "-l", str(self.log)],
            check=False,
        )
        if started.returncode != 0:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise LabError(
                f"postgres: did not start on port {self.port} (log {self.log}):\n{started.stdout}{tail}"
            )
        self.create_database(self.database)
        return self.dsn()

    def _initdb(self) -> None:
        # --no-sync: only initdb's own final flush of a throwaway cluster; the server fsyncs
        initdb = [str(self.bin / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "-A", "trust"]
        self._run([*initdb, "-E", "UTF8", "--locale=C", "--no-sync"])
        self._write(
            self.data / "pg_hba.conf",
            "# lab/postgres.py: trusted from this cluster's socket folder and 127.0.0.1, nothing else\n"
            "local all all trust\nhost all all 127.0.0.1/32 trust\n",
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\ninclude = 'autoheal.conf'  # listen address, port, socket: lab/postgres.py\n")

    def create_database(self, name: str) -> None:
        """Create database `name` unless it exists."""
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def drop_database(self, name: str) -> None:
        """Drop database `name`, ending whatever connections are still in it."""
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def running(self) -> bool:
        return (
            self._run([str(self.bin / "pg_ctl"), "status", "-D", str(self.data)], check=False).returncode == 0
        )

    def stop(self) -> None:
        """Stop the server (fast: open connections are ended, nothing committed is lost); a
        stopped or never-started one is left as it is."""
        if not (self.data / "postmaster.pid").exists():
            return
        res = self._run(
            [str(self.bin / "pg_ctl"), "stop", "-w", "-t", "30", "-m", "fast", "-D", str(self.data)],
            check=False,
        )
        if res.returncode != 0 and self.running():
            raise LabError(f"postgres: did not stop (log {self.log}): {res.stdout}{res.stderr}")

    def __enter__(self) -> PostgresServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a server program as the server's owner, in the cluster folder."""
        if self._owner is not None:
            argv = ["runuser", "-u", OS_USER, "--", *argv]
        res = subprocess.run(
            argv,
            cwd=self.folder,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "LC_ALL": "C"},
        )
        if check and res.returncode != 0:
            raise LabError(f"postgres: {' '.join(argv)} failed ({res.returncode}): {res.stdout}{res.stderr}")
        return res

    def _write(self, path: Path, text: str) -> None:
        path.write_text(text)
        if self._owner is not None:
            os.chown(path, self._owner.pw_uid, self._owner.pw_gid)


@contextmanager
def throwaway_server(port: int, prefix: str = "autoheal-pg-") -> Iterator[PostgresServer]:
    """A started server in a fresh folder under /tmp (not under pytest's tmp_path, which is closed
    to the `postgres` user the server runs as), stopped and deleted afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with PostgresServer(folder, port) as server:
            yield server
    finally:
        shutil.rmtree(folder, ignore_errors=True)
