"""A real Spark standalone cluster on 127.0.0.1 for tests and benchmarks: one master, N workers.

Each daemon is its own JVM, started with pyspark's ``bin/spark-class`` (pip's pyspark has no
``sbin/start-*.sh`` scripts): ``org.apache.spark.deploy.master.Master`` and
``org.apache.spark.deploy.worker.Worker`` (Spark docs, "Spark Standalone Mode", "Starting a
Cluster Manually"). Everything binds to 127.0.0.1 (``SPARK_LOCAL_IP`` and ``--host``) on free
ports; the workers' folders (``--work-dir``: one folder per application with its ``--py-files``
copy and the executor logs) and the daemons' logs live under one temp dir. No configuration of the
machine reaches the daemons: ``SPARK_CONF_DIR`` is pyspark's own ``conf`` folder, which pip's pyspark
does not have (then the daemons' class path is ``spark-submit``'s, so that a class-data sharing
archive of a driver applies to them too), or else an empty folder under the temp dir. Readiness is the master web UI's ``/json`` endpoint (``aliveworkers``, ``workers``,
``activeapps``), polled with a bound. Each daemon runs in its own session (process group), so
:meth:`SparkCluster.kill_worker` takes a worker down together with its executors and their Python
workers, like a lost machine; :meth:`SparkCluster.stop` stops each group by its PID.

Usage::

    with SparkCluster(workers=2) as cluster:
        cluster.master_url  # spark://127.0.0.1:<port>
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"


class SparkClusterError(RuntimeError):
    """A daemon did not start, exited, or the cluster did not reach the wanted state in time.
    The message names the daemon, its log file and the log's tail."""


def free_port(host: str = HOST) -> int:
    """A TCP port free on ``host`` right now (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def spark_home() -> Path:
    """The Spark installation inside the pyspark package (its ``bin/spark-class``).

    :raises SparkClusterError: pyspark is not importable or has no ``bin/spark-class``.
    """
    try:
        import pyspark
    except ImportError as err:  # pragma: no cover - the `spark` extra is missing
        raise SparkClusterError("pyspark is not installed (the `spark` extra)") from err
    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").is_file():
        raise SparkClusterError(f"{home}/bin/spark-class not found: not a full pyspark installation")
    return home


@dataclass
class Daemon:
    """One started JVM: ``name`` (``master``, ``worker-0``, ...), ``proc``, ``log`` path, ports."""

    name: str
    proc: subprocess.Popen
    log: Path
    port: int
    webui_port: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""


class SparkCluster:
    """A Spark standalone master and ``workers`` workers on 127.0.0.1 (see the module docstring).

    :param workers: workers started by :meth:`start` (each ``cores`` cores, ``memory`` of memory).
    :param cores: cores per worker (``--cores``).
    :param memory: memory per worker (``--memory``, Spark size string such as ``2g``); an
        application whose ``spark.executor.memory`` is larger never gets an executor.
    :param base_dir: the folder for work dirs, logs and conf (default: a new temp dir, removed by
        :meth:`stop`).
    :param daemon_memory: heap of each daemon JVM (``SPARK_DAEMON_MEMORY``).
    :param start_timeout: seconds to wait for the master and for the workers to register.
    :param env: more environment variables of every daemon, and so of the workers' executors (as
        ``conf/spark-env.sh`` sets them on a real machine, e.g. an S3 endpoint and credentials).
    """

    def __init__(self, workers: int = 2, *, cores: int = 1, memory: str = "2g", base_dir: str | None = None,
                 daemon_memory: str = "256m", start_timeout: float = 120.0,
                 env: Mapping[str, str] | None = None) -> None:
        if workers < 0 or cores < 1:
            raise ValueError(f"need workers >= 0 and cores >= 1, got workers={workers!r} cores={cores!r}")
        self.initial_workers = workers
        self.cores = cores
        self.memory = memory
        self.daemon_memory = daemon_memory
        self.start_timeout = start_timeout
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="plgd-spark-cluster-"))
        self.master: Daemon | None = None
        self.workers: list[Daemon] = []
        self._spark_home = spark_home()
        self._extra_env = dict(env or {})

    # -- addresses ---------------------------------------------------------------------------
    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>`` (the ``spark`` connection's host)."""
        if self.master is None:
            raise SparkClusterError("the cluster is not started")
        return f"spark://{HOST}:{self.master.port}"

    @property
    def web_url(self) -> str:
        """The master web UI (``http://127.0.0.1:<port>``); ``/json`` is the cluster state."""
        if self.master is None:
            raise SparkClusterError("the cluster is not started")
        return f"http://{HOST}:{self.master.webui_port}"

    # -- processes ---------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # executors inherit the worker's environment, and Spark adds its PYTHONPATH to the Python
        # workers': none of the caller's Python settings may leak into the executors' Python
        for key in ("PYTHONPATH", "PYTHONHOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV",
                    "SPARK_CONF_DIR"):
            env.pop(key, None)
        # no spark-defaults.conf or spark-env.sh of the machine: Spark's default SPARK_CONF_DIR,
        # $SPARK_HOME/conf, when pyspark has none (pip's), else an empty folder of our own
        if (self._spark_home / "conf").exists():
            conf_dir = self.base_dir / "conf"
            conf_dir.mkdir(parents=True, exist_ok=True)
            env["SPARK_CONF_DIR"] = str(conf_dir)
        env.update(self._extra_env)
        env.update({
            "SPARK_HOME": str(self._spark_home),
            "SPARK_LOCAL_IP": HOST,
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            "SPARK_NO_DAEMONIZE": "1",
            # spark-class's find-spark-home asks python for pyspark: this interpreter's bin first
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        })
        return env

    def _spawn(self, name: str, args: list[str], port: int, webui_port: int) -> Daemon:
        log = self.base_dir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [str(self._spark_home / "bin" / "spark-class"), *args]
        with log.open("ab") as fh:
            proc = subprocess.Popen(cmd, env=self._env(), stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.base_dir)
        return Daemon(name=name, proc=proc, log=log, port=port, webui_port=webui_port)

    def start(self) -> SparkCluster:
        """Start the master, then the workers; wait until every worker is registered and alive.

        :raises SparkClusterError: a daemon exited or the cluster was not ready within ``start_timeout``.
        """
        if self.master is not None:
            return self
        port, webui = free_port(), free_port()
        self.master = self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", HOST,
                                             "--port", str(port), "--webui-port", str(webui)], port, webui)
        try:
            self._wait(lambda state: state is not None, "the master web UI answers", [self.master])
            for _ in range(self.initial_workers):
                self.add_worker(wait=False)
            self.wait_for_workers(self.initial_workers)
        except BaseException:
            self.stop()
            raise
        return self

    def add_worker(self, *, wait: bool = True) -> Daemon:
        """Start one more worker (``cores`` cores, ``memory``, its own work dir); with ``wait``,
        return once the master counts it alive."""
        index = len(self.workers)
        name = f"worker-{index}"
        work_dir = self.base_dir / "work" / name
        work_dir.mkdir(parents=True, exist_ok=True)
        port, webui = free_port(), free_port()
        worker = self._spawn(name, [
            "org.apache.spark.deploy.worker.Worker", "--host", HOST, "--port", str(port),
            "--webui-port", str(webui), "--cores", str(self.cores), "--memory", self.memory,
            "--work-dir", str(work_dir), self.master_url,
        ], port, webui)
        worker.extra["work_dir"] = work_dir
        self.workers.append(worker)
        if wait:
            self.wait_for_workers(len(self.alive_workers()))
        return worker

    def alive_workers(self) -> list[Daemon]:
        """The workers whose JVM is running (not killed or stopped)."""
        return [w for w in self.workers if w.alive()]

    def kill_worker(self, index: int = 0, *, timeout: float = 30.0) -> Daemon:
        """SIGKILL worker ``index`` with its process group (its executors and their Python workers:
        a lost machine); return once the master no longer counts it alive.

        :raises SparkClusterError: the master still lists it alive after ``timeout`` s.
        """
        worker = self.workers[index]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.proc.wait(timeout=timeout)
        address = f"{HOST}:{worker.port}"
        self._wait(lambda s: s is not None and not any(
            w.get("state") == "ALIVE" and f"{w.get('host')}:{w.get('port')}" == address for w in s.get("workers", [])),
            f"the master drops {worker.name}", [self.master], timeout=timeout)
        return worker

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every daemon by its PID (SIGTERM to its process group, SIGKILL after ``timeout`` s);
        remove the base dir when this cluster created it. Safe to call twice."""
        for daemon in [*reversed(self.workers), *([self.master] if self.master else [])]:
            if daemon.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(daemon.pid, signal.SIGTERM)
                try:
                    daemon.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(daemon.pid, signal.SIGKILL)
                    daemon.proc.wait(timeout=timeout)
            # executors of a worker stopped by SIGTERM are its children in its group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(daemon.pid, signal.SIGKILL)
        self.workers = []
        self.master = None
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- state -------------------------------------------------------------------------------
    def state(self) -> dict[str, Any] | None:
        """The master's ``/json`` (keys ``workers``, ``aliveworkers``, ``activeapps``,
        ``completedapps``, ...), or None when it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.web_url}/json", timeout=5) as resp:
                return json.loads(resp.read())
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def worker_state(self, index: int) -> dict[str, Any] | None:
        """Worker ``index``'s web UI ``/json`` (``executors``: the running executors, each with
        ``appid``), or None when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.workers[index].webui_port}/json", timeout=5) as resp:
                return json.loads(resp.read())
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def wait_for_workers(self, count: int, timeout: float | None = None) -> dict[str, Any]:
        """Wait until the master counts ``count`` alive workers; return its ``/json``.

        :raises SparkClusterError: a daemon exited, or not within ``timeout`` (default ``start_timeout``) s.
        """
        return self._wait(lambda s: s is not None and s.get("aliveworkers") == count,
                          f"{count} workers alive", [self.master, *self.alive_workers()], timeout=timeout)

    def _wait(self, ready, what: str, daemons: list[Daemon | None], timeout: float | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        while True:
            for d in daemons:
                if d is not None and not d.alive():
                    raise SparkClusterError(f"{d.name} exited ({d.proc.returncode}) while waiting for {what}; "
                                            f"log {d.log}:\n{d.tail()}")
            state = self.state() if self.master is not None else None
            if ready(state):
                return state or {}
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {d.name} ({d.log}):\n{d.tail(15)}" for d in daemons if d is not None)
                raise SparkClusterError(f"not ready in time: {what}; master /json: {state}\n{tails}")
            time.sleep(0.25)
