"""The real Airflow 3 components of one temporary ``AIRFLOW_HOME``, for the tests that need a
scheduler (``test_backfill.py``, ``test_backfill_gap_scheduler.py``, ``test_chain_scheduler.py``):
``api-server`` (the task Execution API), ``scheduler`` with the ``LocalExecutor``, ``dag-processor``
and ``triggerer``, each in its own process group, on a PostgreSQL metadata database (fixture
``airflow_postgres_db``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from plgd_devtools import postgres_server
from tests.integration.conftest import spark_connect_conn

REPO = Path(__file__).resolve().parents[2]
#: The DAG of the shipped DAG file (``dags/plgd_events_etl.py``), which the tests run.
DAG_ID = "plgd_events_etl"
#: Seconds between two looks at the metadata database (a few SELECTs: far cheaper than a task start).
POLL_S = 0.5
RUN_TIMEOUT_S = 900  # a busy 2-core CI machine: 3 runs of 9 tasks each took 510 s beside other jobs


#: ``$AIRFLOW_HOME/config/airflow_local_settings.py`` of every stack; Airflow imports it in each of
#: its processes. The scheduler and the dag-processor import the ETL's modules once, at their start:
#: the LocalExecutor's task processes and the dag-processor's parse processes are forked from them
#: and find the modules imported, instead of importing them again for every task (~0.5 s CPU each,
#: 1-2.5 s wall on a busy machine: the "dag_file_parse_ms" of a task's log). Each task still runs the
#: DAG file and its own code in its own process (docs/testing.md, "Third round, Airflow side").
#: ``DAG_BUILD_MODULES`` are what ``build_etl_dag`` imports lazily when the DAG file runs (~0.3 s CPU
#: per parse otherwise); ``TASK_MODULES`` what the tasks import lazily when they execute (the NATS
#: client, ``deltalake``: ~0.35 s CPU per task otherwise). Importing them starts no thread, so the
#: forks stay safe; the scheduler imports both, the dag-processor only parses.
DAG_BUILD_MODULES = (
    "airflow_provider_plgd.etl",
    "airflow_provider_plgd.hooks.jetstream",
    "airflow_provider_plgd.operators.ledger_range_fetch",
    "airflow_provider_plgd.operators.lineage",
    "airflow_provider_plgd.operators.spark_connect",
    "airflow_provider_plgd.operators.spark_submit",
    "airflow_provider_plgd.run_params",
    "airflow_provider_plgd.sensors.interval_complete",
)
TASK_MODULES = ("nats.aio.client", "nats.js", "deltalake", "deltalake.transaction")
LOCAL_SETTINGS = f"""\
import importlib
import sys

if sys.argv[1:2] in (["scheduler"], ["dag-processor"]):
    for name in {DAG_BUILD_MODULES!r}:
        importlib.import_module(name)
if sys.argv[1:2] == ["scheduler"]:
    for name in {TASK_MODULES!r}:
        importlib.import_module(name)
"""


def free_port() -> int:
    from plgd_devtools.nats_server import free_port

    return free_port()


class AirflowStack:
    """The Airflow 3 components of one temporary ``AIRFLOW_HOME``, each in its own process group.

    ``env`` is the environment of every component and CLI call; ``db_url`` the libpq URL of the
    PostgreSQL metadata database (read by :meth:`query`).
    :meth:`stop` terminates every process group (SIGTERM, then SIGKILL after 20 s).
    """

    COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")

    def __init__(self, *, home: Path, env: dict[str, str], db_url: str, api_apps: str = "execution") -> None:
        self.home = home
        self.api_apps = api_apps
        self.env = env
        self.db_url = db_url
        self.procs: dict[str, subprocess.Popen] = {}
        config = home / "config"
        config.mkdir(exist_ok=True)
        if os.environ.get("PLGD_TEST_NO_PREIMPORT") != "1":  # to compare
            (config / "airflow_local_settings.py").write_text(LOCAL_SETTINGS)

    def cli(self, *args: str, timeout: float = 180) -> str:
        """Run ``airflow <args>``; return stdout; AssertionError with the output on failure."""
        proc = subprocess.run([sys.executable, "-m", "airflow", *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout, cwd=self.home)
        assert proc.returncode == 0, f"airflow {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc.stdout

    def api(self, method: str, path: str, body: Any = None, *, timeout: float = 60) -> tuple[int, Any]:
        """One request to the api-server's public REST API (``api_apps`` with ``core``), as the UI sends
        it: ``(status, JSON body)``; no token needed (``simple_auth_manager_all_admins``). A request
        costs the api-server a few ms, an ``airflow`` CLI call ~3-4 s CPU of Python start."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.env["AIRFLOW__API__BASE_URL"] + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    return response.status, json.loads(response.read() or b"null")
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read() or b"null")
            except urllib.error.URLError:  # the api-server is not listening yet
                self.check_alive()
                if time.monotonic() > deadline:
                    raise
                time.sleep(POLL_S)

    def reparse(self, dag_id: str = DAG_ID) -> datetime:
        """Ask the dag-processor to parse the DAG's file now (the UI's "Reparse Dag":
        ``PUT /api/v2/parseDagFile/{file_token}``) and wait until it did; return the parse time. The
        stacks parse a file once, then only on request (``MIN_FILE_PROCESS_INTERVAL`` 600 s), not
        every few seconds (a fork and the DAG file's import each)."""
        asked = datetime.now().astimezone()
        status, dag = self.api("GET", f"/api/v2/dags/{dag_id}")
        assert status == 200, (status, dag)
        status, body = self.api("PUT", f"/api/v2/parseDagFile/{dag['file_token']}")
        assert status == 201, (status, body)
        return self.poll(f"the dag-processor parsed {dag_id} again", lambda: (self.query(
            "SELECT last_parsed_time FROM dag WHERE dag_id = %s AND last_parsed_time > %s", dag_id, asked)
            or [None])[0], timeout=120)[0]

    def start(self, names: tuple[str, ...] | None = None) -> None:
        for name in names or self.COMPONENTS:
            args = [name]
            if name == "api-server":
                args += ["--host", "127.0.0.1", "--port", self.env["_PLGD_API_PORT"], "--workers", "1",
                         "--apps", self.api_apps]
            log = (self.home / f"{name}.log").open("ab")
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "airflow", *args], env=self.env, cwd=self.home,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
            log.close()

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            assert proc.poll() is None, f"airflow {name} exited with {proc.returncode}:\n{self.log_tail(name)}"

    def log_tail(self, name: str, lines: int = 60) -> str:
        path = self.home / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) used so far by each component's process group: its live
        processes and the children they waited for (task processes, parse processes)."""
        tick = os.sysconf("SC_CLK_TCK")
        groups = {proc.pid: name for name, proc in self.procs.items()}
        used = dict.fromkeys(self.procs, 0.0)
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:  # the process ended meanwhile
                continue
            name = groups.get(int(fields[2]))  # the process group
            if name:
                used[name] += sum(int(v) for v in fields[11:15]) / tick  # utime stime cutime cstime
        return used

    def stop(self) -> None:
        try:
            cpu = self.cpu_seconds()
            print(f"[airflow_stack] CPU s by component: { {k: round(v, 1) for k, v in cpu.items()} }")
        except OSError:  # no /proc
            pass
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            # the whole group: executor workers, task processes, spark-submit and its JVM
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def poll(self, what: str, check: Any, *, timeout: float = RUN_TIMEOUT_S, every: float = POLL_S) -> Any:
        """Call ``check()`` until it returns a truthy value (returned); fail with the scheduler's and
        the dag-processor's logs after ``timeout`` s, or when a component exited."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            got = check()
            if got:
                return got
            time.sleep(every)
        pytest.fail(f"{what}: not after {timeout:.0f} s; runs {self.runs()}\nscheduler:\n{self.log_tail('scheduler')}"
                    f"\ndag-processor:\n{self.log_tail('dag-processor', 30)}")

    # -- metadata DB (SELECT queries on PostgreSQL, ``%s`` parameters) -----------------------------
    def query(self, sql: str, *params: Any) -> list[tuple]:
        """The rows of one statement on the stack's metadata database (``%s`` parameters)."""
        return postgres_server.query(self.db_url, sql, *params)

    def runs(self) -> list[tuple]:
        """``(run_id, state, run_type, logical_date, end_date, backfill_id)`` of the DAG's runs, oldest first."""
        return self.query("SELECT run_id, state, run_type, logical_date, end_date, backfill_id FROM dag_run "
                          "WHERE dag_id = %s ORDER BY logical_date", DAG_ID)

    def failed_tasks(self) -> list[tuple]:
        return self.query("SELECT run_id, task_id, map_index, state, try_number FROM task_instance "
                          "WHERE dag_id = %s AND state IN ('failed', 'up_for_retry', 'upstream_failed')", DAG_ID)

    def wait_for_run_end(self, run_id: str, timeout: float) -> list[tuple]:
        """Poll until the run ``run_id`` is failed or successful (or ``timeout`` s passed); return ``[(state,)]``."""
        deadline = time.monotonic() + timeout
        state: list[tuple] = []
        while time.monotonic() < deadline:
            state = self.query("SELECT state FROM dag_run WHERE dag_id = %s AND run_id = %s", DAG_ID, run_id)
            if state and state[0][0] in ("failed", "success"):
                break
            time.sleep(POLL_S)
        return state

    def task_log(self, run_id: str, task_id: str) -> str:
        logs = sorted((self.home / "logs").glob(f"dag_id={DAG_ID}/run_id={run_id}/task_id={task_id}/**/*.log"))
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in logs[-2:])

    def wait_for_runs(self, *, count: int, done: Any, what: str, timeout: float = RUN_TIMEOUT_S) -> list[tuple]:
        """Poll until ``done(runs)`` holds for ``count`` runs; fail fast on a failed or retrying task."""
        deadline = time.monotonic() + timeout
        runs: list[tuple] = []
        while time.monotonic() < deadline:
            self.check_alive()
            runs = self.runs()
            bad = self.failed_tasks()
            if bad:
                run_id, task_id = bad[0][0], bad[0][1]
                pytest.fail(f"{what}: task {bad} did not succeed; its log:\n{self.task_log(run_id, task_id)}\n"
                            f"scheduler:\n{self.log_tail('scheduler', 30)}")
            if any(r[1] == "failed" for r in runs):
                pytest.fail(f"{what}: a DAG run failed: {runs}\nscheduler:\n{self.log_tail('scheduler')}")
            if len(runs) >= count and done(runs):
                return runs
            time.sleep(POLL_S)
        pytest.fail(f"{what}: not done after {timeout:.0f} s; runs {runs}\nscheduler:\n"
                    f"{self.log_tail('scheduler')}\ndag-processor:\n{self.log_tail('dag-processor', 30)}")


def airflow_env(*, home: Path, dags: Path, root: Path, nats_server, start: datetime,
                database: dict[str, str], schedule_seconds: float = 6.0, intervals: int = 3,
                spark_connect: Any = None) -> dict[str, str]:
    """The environment of every component of one ``AIRFLOW_HOME`` (``AirflowStack``): the
    ``LocalExecutor`` on ``database``, the connections to ``nats_server`` and ``local[2]`` Spark,
    the shipped DAG file's settings (``intervals`` intervals of ``schedule_seconds`` from ``start``).

    :param spark_connect: a running Spark Connect server (fixture ``spark_connect_server``): the
        shipped DAG file runs its Spark tasks there (``PLGD_ETL_SPARK_CONNECT_CONN_ID``), not with
        ``spark-submit``; default: ``spark-submit`` with ``FAST_LOCAL_SPARK_CONF``."""
    from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF

    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    port = str(free_port())
    env.update({
        "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        **database,  # AIRFLOW__DATABASE__SQL_ALCHEMY_CONN(_ASYNC): the PostgreSQL database
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "600",
        # the scheduler's sleep when a loop found nothing to do (Airflow's default: 1 s): the next task
        # of a run is queued sooner (docs/testing.md); PLGD_TEST_SCHEDULER_IDLE_SLEEP to compare
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": os.environ.get("PLGD_TEST_SCHEDULER_IDLE_SLEEP", "0.25"),
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        # A task that starts before the api-server listens (the components start side by side) retries
        # its first Execution API call: 5 tries (Airflow's default, 4-15 s) ended in "Connection refused"
        # and a failed task at load 15; 10 tries wait up to minutes, only while the api-server starts.
        "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "10",
        "AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT": json.dumps({
            "conn_type": "plgd_jetstream", "host": nats_server.host, "port": nats_server.port,
            "extra": {"stream": "EVENTS", "storage_root": str(root)},
        }),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "PLGD_ETL_SCHEDULE_SECONDS": str(schedule_seconds),
        "PLGD_ETL_START_DATE": start.isoformat(),
        # the last scheduled interval starts at start + (INTERVALS - 1) intervals
        "PLGD_ETL_END_DATE": (start + timedelta(seconds=schedule_seconds * (intervals - 1))).isoformat(),
        "PLGD_ETL_PARAMS": json.dumps({"settle_seconds": 2}),
        "PLGD_ETL_SPARK_CONF": json.dumps(FAST_LOCAL_SPARK_CONF),
        "_PLGD_API_PORT": port,
    })
    if spark_connect is not None:
        conn_id = "plgd_spark_connect_test"
        env.update(spark_connect_conn(spark_connect, conn_id=conn_id))
        env["PLGD_ETL_SPARK_CONNECT_CONN_ID"] = conn_id
        for key in ("PLGD_ETL_SPARK_CONF", "SPARK_REMOTE", "SPARK_CONNECT_AUTHENTICATE_TOKEN"):
            env.pop(key, None)
    return env
