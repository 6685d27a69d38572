"""Fixtures and helpers of the fetch/sensor/trigger integration tests (real nats-server, real Airflow).

* ``airflow_db``: the Airflow metadata DB (SQLite in the session's temp AIRFLOW_HOME), created once.
* ``dags_folder``: the DAG bundle folder of that AIRFLOW_HOME; ``load_dag(path, dag_id)`` imports a
  DAG file written there, so ``dag.test()`` finds the DAG serialized from its bundle.
* ``publish_messages``: publish with JetStream PubAcks, ``read_stream``: every stored message
  with its exact server timestamp (ns) from the ack reply subject -- an independent reader used
  as ground truth (nats-py directly, not the hook under test).

Autouse fixtures take work out of every ``dag.test()`` (docs/testing.md): the DAG files a test
(or a module fixture) wrote are removed when it ends (each ``dag.test()`` parses every file of the
dags folder), and ``dag.test()``'s 1 s poll waits only when its last round changed no task state
(:func:`dag_test_polls_on_progress`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def airflow_db():
    """Create the Airflow metadata DB of this test session (idempotent)."""
    from airflow.utils import db

    db.initdb()
    return True


@pytest.fixture(scope="session")
def dags_folder(airflow_db) -> Path:
    """The dags folder of the session's AIRFLOW_HOME (the default ``dags-folder`` bundle)."""
    from airflow.configuration import conf

    path = Path(conf.get("core", "dags_folder"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _dag_files() -> set[Path]:
    folder = Path(os.environ["AIRFLOW_HOME"]) / "dags"  # conf core.dags_folder: not set by the tests
    return set(folder.glob("*.py")) if folder.is_dir() else set()


@contextlib.contextmanager
def _removing_new_dag_files() -> Iterator[None]:
    before = _dag_files()
    yield
    for path in _dag_files() - before:
        path.unlink(missing_ok=True)


@pytest.fixture(scope="module", autouse=True)
def dag_files_of_the_module():
    """Remove the DAG files this test module wrote into the session's dags folder when it ends.

    Every ``dag.test()`` parses the whole dags folder (``BundleDagBag`` of the ``dags-folder``
    bundle, to sync the DAG to the metadata DB), so each file left there by an earlier test would
    cost every later ``dag.test()`` of the session one more parse. The DAGs stay in the DB.
    """
    with _removing_new_dag_files():
        yield


@pytest.fixture(autouse=True)
def dag_files_of_the_test(dag_files_of_the_module):
    """Remove the DAG files a test wrote when it ends (see :func:`dag_files_of_the_module`; the
    files of a module fixture, set up before this one, stay until the module ends)."""
    with _removing_new_dag_files():
        yield


#: Where ``DAG.test`` is defined (``airflow.sdk.definitions.dag``), matched without importing Airflow.
_DAG_TEST_FILE = os.path.join("airflow", "sdk", "definitions", "dag.py")


@pytest.fixture(autouse=True)
def dag_test_polls_on_progress(monkeypatch):
    """``dag.test()`` polls again at once after a round that changed a task state; it waits its 1 s
    only when nothing changed.

    After its first task fails, ``dag.test()`` marks one more layer of downstream tasks
    ``upstream_failed`` per round of its loop and sleeps 1 s after each round ("No tasks to run"):
    7 s of a refused ETL run. A task that really waits (a retry delay, a sensor's reschedule, a
    human) changes no state between two rounds, so the loop still waits 1 s per round for it. Only
    the ``time.sleep`` calls of ``DAG.test`` itself are affected (the caller's frame is checked);
    the rounds, the states and the outcome of the run are Airflow's. ``test_harness.py`` fails if
    Airflow moves ``DAG.test`` or its ``all_tis``, so that this cannot stop helping unseen.
    """
    real_sleep = time.sleep
    last: dict[str, frozenset] = {}

    def sleep(seconds: float) -> None:
        caller = sys._getframe(1)
        code = caller.f_code
        if code.co_name == "test" and code.co_filename.endswith(_DAG_TEST_FILE) and "all_tis" in caller.f_locals:
            states = frozenset((ti.task_id, ti.map_index, str(ti.state), ti.try_number)
                               for ti in caller.f_locals["all_tis"])
            changed = last.get("states") != states
            last["states"] = states
            if changed:
                return
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    yield


def use_local_spark(monkeypatch) -> None:
    """Environment of a test whose DAG runs real ``spark-submit`` in local mode: the venv's
    ``spark_submit_env`` and a ``spark_default`` connection on ``local[2]``."""
    from plgd_devtools.spark import spark_submit_env

    for key, value in spark_submit_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))


def spark_connect_conn(server, *, conn_id: str = "plgd_spark_connect_test") -> dict[str, str]:
    """The environment of a DAG whose Spark tasks run on the session's Spark Connect server
    (fixture ``spark_connect_server``; ``build_etl_dag(spark_connect_conn_id=conn_id)``): the
    connection ``AIRFLOW_CONN_<CONN_ID>`` of type ``spark_connect``. For the tests that prove the
    chain, the scheduler or the tables, not the ``spark-submit`` path (docs/testing.md names the
    tests that prove that path)."""
    return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(
        {"conn_type": "spark_connect", "host": "localhost", "port": server.port})}


def use_spark_connect(monkeypatch, server, *, conn_id: str = "plgd_spark_connect_test") -> None:
    """:func:`spark_connect_conn` set for this test (in-process ``dag.test()``); no ``SPARK_REMOTE``
    or token of the caller's environment reaches the clients."""
    for key, value in spark_connect_conn(server, conn_id=conn_id).items():
        monkeypatch.setenv(key, value)
    for key in ("SPARK_REMOTE", "SPARK_CONNECT_AUTHENTICATE_TOKEN"):
        monkeypatch.delenv(key, raising=False)


def run_connect_client(server, script: Path, *args: str, log: Path, timeout: float = 900) -> None:
    """Run the driver ``script`` (a plain Python program: ``session.build_spark_session`` then
    ``session.ship_code``) as a client of the session's Spark Connect server (fixture
    ``spark_connect_server``): ``SPARK_REMOTE`` set, this checkout first on ``PYTHONPATH``, no
    ``PYSPARK_PYTHON`` (the client runs no Python worker; the server's have no provider). For the
    tests whose point is an application's logic, not the ``spark-submit`` path (docs/testing.md,
    "Which test proves what"). The caller holds the Spark lock. Fails the test with the log's tail.
    """
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, SPARK_REMOTE=server.remote, PYTHONPATH=str(repo))
    for key in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_CONNECT_AUTHENTICATE_TOKEN"):
        env.pop(key, None)
    with log.open("ab") as fh:
        proc = subprocess.run([sys.executable, str(script), *args], env=env, stdout=fh, stderr=subprocess.STDOUT,
                              cwd=repo, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:])
        pytest.fail(f"{script.name} on Spark Connect failed ({proc.returncode}):\n{tail}")


def load_test_dag(dags_folder: Path, name: str, text: str, dag_id: str):
    """Write the DAG file ``{dags_folder}/{name}.py`` with ``text`` and return its DAG ``dag_id``."""
    path = dags_folder / f"{name}.py"
    path.write_text(text)
    return load_dag(path, dag_id)


#: An ETL DAG file whose Spark tasks run on the session's Spark Connect server (connection
#: ``plgd_spark_connect_test``, :func:`use_spark_connect`), for tests of the chain and the tables
#: rather than of ``spark-submit`` (docs/testing.md).
CONNECT_ETL_DAG_FILE = """
import tempfile
from datetime import datetime, timedelta, timezone
from airflow_provider_plgd.etl import build_etl_dag

dag = build_etl_dag(dag_id={dag_id!r}, schedule=timedelta(seconds={interval_s}),
                    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), catchup=False,
                    spark_connect_conn_id="plgd_spark_connect_test", default_args={{"retries": 0}},
                    storage_roots={roots})  # the roots a run may choose
"""


def load_connect_etl_dag(dags_folder: Path, dag_id: str, interval_s: int, *,
                         storage_roots: str = "[tempfile.gettempdir()]"):
    """Write and load :data:`CONNECT_ETL_DAG_FILE` as ``{dags_folder}/{dag_id}.py``.

    :param interval_s: the schedule's interval, s.
    :param storage_roots: the ``storage_roots`` argument as Python source (default: below the temp dir).
    """
    text = CONNECT_ETL_DAG_FILE.format(dag_id=dag_id, interval_s=int(interval_s), roots=storage_roots)
    return load_test_dag(dags_folder, dag_id, text, dag_id)


def load_dag(path: Path, dag_id: str):
    """Import a DAG file from the dags folder and return its DAG ``dag_id``."""
    name = f"_plgd_test_dag_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    for value in vars(module).values():
        if getattr(value, "dag_id", None) == dag_id and hasattr(value, "test"):
            return value
    raise LookupError(f"no DAG {dag_id!r} in {path}")


async def apublish_messages(url: str, messages: list[tuple], *, window: int = 256) -> list[int]:
    """Publish ``(subject, data, headers|None)`` in order (at most ``window`` PubAcks outstanding).

    :return: the stream sequences, in publish order.
    """
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    seqs: list[int] = []
    try:
        for i in range(0, len(messages), window):
            chunk = messages[i:i + window]
            # ordered: publish requests are sent in order on one connection, acks gathered after
            acks = await asyncio.gather(*(js.publish(s, d, headers=h) for s, d, h in chunk))
            seqs.extend(a.seq for a in acks)
    finally:
        await nc.close()
    return seqs


def publish_messages(url: str, messages: list[tuple], **kw: Any) -> list[int]:
    """Sync :func:`apublish_messages`."""
    return asyncio.run(apublish_messages(url, messages, **kw))


async def aread_stream(url: str, stream: str = "EVENTS") -> dict[int, tuple]:
    """Read every message of the stream: ``{seq: (subject, time_ns, headers, data)}``."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        total = info.state.messages
        out: dict[int, tuple] = {}
        if not total:
            return out
        psub = await js.pull_subscribe("", stream=stream, config=ConsumerConfig(
            ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, inactive_threshold=30.0))
        while len(out) < total:
            for msg in await psub.fetch(min(1000, total - len(out)), timeout=10):
                tokens = msg.reply.split(".")
                seq, ts = (int(tokens[5]), int(tokens[7])) if len(tokens) == 9 else (int(tokens[7]), int(tokens[9]))
                out[seq] = (msg.subject, ts, msg.headers or None, msg.data)
        await psub.unsubscribe()
        return out
    finally:
        await nc.close()


def read_stream(url: str, stream: str = "EVENTS") -> dict[int, tuple]:
    """Sync :func:`aread_stream`."""
    return asyncio.run(aread_stream(url, stream))


@pytest.fixture
def storage_root(tmp_path) -> str:
    """A fresh local storage root."""
    path = tmp_path / "root"
    path.mkdir()
    return str(path)


def xcom_value(dag_run, task_id: str, key: str = "return_value"):
    """The XCom ``key`` of ``task_id`` in ``dag_run`` from the metadata DB (None when absent)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id, task_ids=task_id, key=key)
        ).first()
        return None if row is None else XComModel.deserialize_value(row)
