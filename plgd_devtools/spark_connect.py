"""A local Spark Connect server on 127.0.0.1 for tests and benchmarks, from the installed pyspark.

The server is one JVM started with pyspark's ``bin/spark-submit`` and the class
``org.apache.spark.sql.connect.service.SparkConnectServer`` (in pyspark's jars; the Spark docs'
``sbin/start-connect-server.sh`` does the same), on a free loopback port
(``spark.connect.grpc.binding.port``), in ``local[N]`` mode with
:data:`plgd_devtools.spark.FAST_LOCAL_SPARK_CONF` (unless ``fast_local=False``). Its Python workers (the tasks of
``mapInArrow``/``applyInArrow`` and the Python data sources) run ``python`` (``PYSPARK_PYTHON``):
give it an environment without the provider (e.g. the ``requirements-executor.txt`` venv) to prove
that a client ships its own code (``SparkSession.addArtifacts``). The log, an empty
``SPARK_CONF_DIR`` and ``spark.local.dir`` live under one temp dir, removed by :meth:`stop`.
Readiness: the gRPC port accepts connections (polled with a bound, failing early when the JVM
exits). The JVM runs in its own session (process group), stopped by its PID.

Usage::

    with SparkConnectServer(python="/path/to/executor/venv/bin/python") as server:
        server.remote  # sc://127.0.0.1:<port>  (SPARK_REMOTE of a client)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from plgd_devtools.spark import FAST_LOCAL_SPARK_CONF
from plgd_devtools.spark_cluster import HOST, free_port, spark_home

#: The Spark Connect server's main class (in pyspark's jars).
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


class SparkConnectError(RuntimeError):
    """The server did not start in time or exited; the message names its log and the log's tail."""


class SparkConnectServer:
    """A Spark Connect server on ``127.0.0.1:<free port>`` (see the module docstring).

    :param python: the interpreter of the server's Python workers (``PYSPARK_PYTHON``; default
        ``sys.executable``).
    :param master: the server's master (default ``local[2]``).
    :param conf: extra Spark settings (strings), after :data:`FAST_LOCAL_SPARK_CONF`.
    :param fast_local: start from :data:`FAST_LOCAL_SPARK_CONF` (short runs on small data; the
        default); False: Spark's defaults (a benchmark at scale compares it with a ``spark-submit``
        of the DAG's default settings).
    :param start_timeout: seconds to wait for the port to accept connections.
    :param env: extra environment variables of the server JVM and so of its Python workers, e.g.
        the ``AWS_*`` endpoint and credentials of an S3 API (as a real server gets them from
        ``conf/spark-env.sh``: a client cannot pass them to the workers).
    """

    def __init__(self, *, python: str | None = None, master: str = "local[2]",
                 conf: dict[str, str] | None = None, start_timeout: float = 120.0,
                 fast_local: bool = True, env: dict[str, str] | None = None) -> None:
        self.python = python or sys.executable
        self.master = master
        self.extra_env = dict(env or {})
        self.conf = {**(FAST_LOCAL_SPARK_CONF if fast_local else {}), **(conf or {})}
        self.start_timeout = start_timeout
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.base_dir: Path | None = None

    @property
    def remote(self) -> str:
        """``sc://127.0.0.1:<port>``: the ``SPARK_REMOTE`` (or ``SparkSession.builder.remote``) of a client.

        :raises SparkConnectError: the server is not started.
        """
        if self.port is None:
            raise SparkConnectError("the Spark Connect server is not started")
        return f"sc://{HOST}:{self.port}"

    @property
    def log(self) -> Path:
        assert self.base_dir is not None
        return self.base_dir / "connect-server.log"

    def tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the server log ("" when none)."""
        with contextlib.suppress(OSError, AssertionError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def _env(self) -> dict[str, str]:
        assert self.base_dir is not None
        conf_dir = self.base_dir / "conf"  # empty: no spark-defaults.conf or spark-env.sh of the machine
        conf_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.extra_env}
        # the Python workers get Spark's PYTHONPATH only: none of the caller's settings may leak in
        for key in ("PYTHONPATH", "PYTHONHOME", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "SPARK_REMOTE",
                    "SPARK_CONNECT_MODE_ENABLED"):
            env.pop(key, None)
        home = spark_home()
        env.update({
            "SPARK_HOME": str(home),
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOCAL_IP": HOST,
            "PYSPARK_PYTHON": self.python,
            "PYTHONHASHSEED": "0",
            # spark-submit's find-spark-home asks python for pyspark: this interpreter's bin first
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        })
        return env

    def start(self) -> SparkConnectServer:
        """Start the server; return once its port accepts connections.

        :raises SparkConnectError: the JVM exited or the port did not open within ``start_timeout`` s.
        """
        if self.proc is not None:
            return self
        self.base_dir = Path(tempfile.mkdtemp(prefix="plgd-spark-connect-"))
        self.port = free_port()
        local_dir = self.base_dir / "local"
        local_dir.mkdir()
        conf = {**self.conf, "spark.connect.grpc.binding.port": str(self.port),
                "spark.connect.grpc.binding.address": HOST, "spark.local.dir": str(local_dir),
                "spark.ui.enabled": "false", "spark.pyspark.python": self.python}
        cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", self.master, "--class", SERVER_CLASS,
               "--name", "plgd-spark-connect"]
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        cmd.append("spark-internal")
        try:
            with self.log.open("ab") as fh:
                self.proc = subprocess.Popen(cmd, env=self._env(), stdout=fh, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.base_dir)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self.proc is not None and self.port is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise SparkConnectError(f"the Spark Connect server exited ({self.proc.returncode}); "
                                        f"log {self.log}:\n{self.tail()}")
            with contextlib.suppress(OSError), socket.create_connection((HOST, self.port), timeout=1):
                return
            if time.monotonic() > deadline:
                raise SparkConnectError(f"the Spark Connect server did not open port {self.port} in "
                                        f"{self.start_timeout} s; log {self.log}:\n{self.tail()}")
            time.sleep(0.25)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the server by its PID (SIGTERM to its process group, SIGKILL after ``timeout`` s) and
        remove the temp dir. Safe to call twice."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=timeout)
            with contextlib.suppress(ProcessLookupError, PermissionError):  # its Python workers
                os.killpg(proc.pid, signal.SIGKILL)
        if self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None
        self.port = None

    def __enter__(self) -> SparkConnectServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
