"""Run a plgd Spark application on a Spark Connect server: ``python spark_apps/<app>.py ARGS``.

The ETL DAG's ``decode``, ``dedupe`` and ``rebuild`` tasks with
``build_etl_dag(spark_connect_conn_id=...)`` (docs/spark-connect.md, "The ETL DAG on Spark
Connect"). The application's ``main`` (``spark.session.run_app``) runs in a child process of the
Airflow task, the Spark Connect client: it connects to the server named by ``SPARK_REMOTE``, ships
the plgd code with ``addArtifacts`` (``spark.session.ship_code``) and runs the application there.

A child process, not the task's own process: ``SPARK_REMOTE`` and the token live in the child's
environment only (a Connect session is per process and pyspark reads both from the environment),
the child's session ends with it, and an ``execution_timeout`` or a killed task stops it by its
process group.

The connection is of the Spark provider's type ``spark_connect``
(``airflow.providers.apache.spark.hooks.spark_connect.SparkConnectHook``: host, port, login =
user ID, password = token, extra ``use_ssl``). The token is never on a command line nor in the
URL: the child gets it as ``SPARK_CONNECT_AUTHENTICATE_TOKEN`` (pyspark's ``ChannelBuilder``
reads it when the URL has none), and it is masked in the task log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_plgd.compat import AirflowTaskTimeout, BaseOperator
from airflow_provider_plgd.exceptions import SparkApplicationTimeoutError
from airflow_provider_plgd.operators.links import SPARK_APP_XCOM_KEY, parse_spark_application_line
from airflow_provider_plgd.run_params import UntrustedRunParamError, check_run_spark_conf, run_spark_conf_policy
from airflow_provider_plgd.spark.session import SPARK_APP_LOG_MARKER

#: The environment variable of the Connect token that pyspark reads (``ChannelBuilder.token``).
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
#: Environment variables of this worker that must not reach the child (the connection decides).
_CLEARED_ENV = ("SPARK_REMOTE", TOKEN_ENV, "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_SUBMIT_ARGS", "MASTER")
#: Lines of the child's output kept for the error message of a failed application.
_TAIL_LINES = 40


class SparkConnectApplicationError(RuntimeError):
    """The application exited non-zero; the message names it, its exit status and its last lines."""


def connect_url_and_token(conn_id: str) -> tuple[str, str | None]:
    """``(SPARK_REMOTE without the token, token or None)`` of the ``spark_connect`` connection ``conn_id``.

    The URL is the Spark provider's (``SparkConnectHook.get_connection_url``: ``sc://host:port/;user_id=..;use_ssl=..``)
    with its ``token`` parameter removed; the token is the connection's password.

    :raises AirflowNotFoundException: no such connection.
    :raises ValueError: the host has a path (the provider's check).
    """
    # lazy: the Connect hook needs the Spark Connect client: at execute only
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    hook = SparkConnectHook(conn_id=conn_id)
    conn = hook.get_connection(conn_id)
    url = hook.get_connection_url()
    head, sep, params = url.partition("/;")
    kept = [p for p in params.split(";") if p and not p.startswith("token=")]  # pyspark's ChannelBuilder name
    remote = head + ("/;" + ";".join(kept) if kept else ("/" if sep else ""))
    return remote, conn.password or None


def child_env(remote: str, token: str | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: ``base`` (default: this process's) without :data:`_CLEARED_ENV`,
    plus ``SPARK_REMOTE`` and, with a token, :data:`TOKEN_ENV`."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _CLEARED_ENV}
    env["SPARK_REMOTE"] = remote
    if token:
        env[TOKEN_ENV] = token
    return env


class PlgdSparkConnectOperator(BaseOperator):
    """Run ``application`` (a ``spark_apps/*.py`` script) with ``application_args`` as a Spark
    Connect client: ``<this Python> application ARGS`` in a child process whose environment alone
    holds ``SPARK_REMOTE`` and the token of ``conn_id``.

    The child's output (stdout and stderr) goes to the task log line by line. Like
    ``PlgdSparkSubmitOperator``, ``execute`` returns None (the run summary is in the storage root;
    the ETL DAG's ``post_execute`` puts it into the asset events) and pushes the application
    (``{"app_id", "ui_web_url": None, "finished": True, "history_url": None}``) to XCom under
    :data:`~airflow_provider_plgd.operators.links.SPARK_APP_XCOM_KEY` when the child logged it.

    :param conn_id: a ``spark_connect`` connection (not templated: a run may not choose the server).
    :param application: the application script's path.
    :param application_args: (templated) its arguments; never holds the token.
    :param name: the application's name, for messages.
    :param run_conf_param: the DAG param of a run's Spark settings (e.g. ``spark_conf``), checked
        against ``run_conf_keys`` like ``PlgdSparkSubmitOperator`` does; on Spark Connect the
        server's settings apply, so a non-empty value is refused before the child starts.
    :param run_conf_keys: the settings that param may hold (``run_params.run_spark_conf_policy``).
    :param python: the client's interpreter (default: this worker's, ``sys.executable``); it needs
        the provider with its ``[spark]`` extra.
    :raises SparkConnectApplicationError: (from ``execute``) the application exited non-zero; the
        message has its last lines of output.
    :raises UntrustedRunParamError: (from ``execute``, before the child starts) a bad or non-empty
        ``run_conf_param`` value; no retries.
    :raises SparkApplicationTimeoutError: the task's ``execution_timeout`` passed; the child is killed.
    """

    template_fields: Sequence[str] = ("application_args",)
    ui_color = "#e4f0e8"

    def __init__(self, *, conn_id: str, application: str, application_args: Sequence[str] = (),
                 name: str | None = None, run_conf_param: str | None = None,
                 run_conf_keys: Mapping[str, str | None] | None = None, python: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not conn_id:
            raise ValueError("PlgdSparkConnectOperator(conn_id=...): a spark_connect connection ID is required")
        self.conn_id = conn_id
        self.application = application
        self.application_args = list(application_args)
        self.name = name or os.path.basename(application)
        self.run_conf_param = run_conf_param
        self.run_conf_keys = run_spark_conf_policy(run_conf_keys)
        self.python = python
        self._proc: subprocess.Popen | None = None

    def _check_run_conf(self, context: Any) -> None:
        if not self.run_conf_param:
            return
        params = context.get("params") or {}
        settings = check_run_spark_conf(params.get(self.run_conf_param), self.run_conf_keys,
                                        param=self.run_conf_param)
        if settings:
            raise UntrustedRunParamError(
                f"run param {self.run_conf_param!r} sets {', '.join(sorted(settings))}: this DAG runs its Spark "
                "applications on Spark Connect, where the server's settings apply; leave the param empty")

    def execute(self, context: Any) -> None:
        # lazy: compat resolves the masker of the installed Airflow on first use
        from airflow_provider_plgd.compat import mask_secret

        self._check_run_conf(context)  # untrusted input: before anything else
        remote, token = connect_url_and_token(self.conn_id)
        if token and mask_secret is not None:  # the task log shows *** for it
            mask_secret(token)
        cmd = [self.python or sys.executable, self.application, *map(str, self.application_args)]
        self.log.info("Spark Connect application %s on %s (token: %s): %s", self.name, remote,
                      "set" if token else "none", " ".join(cmd))
        tail: deque[str] = deque(maxlen=_TAIL_LINES)
        app: dict[str, Any] | None = None
        self._proc = subprocess.Popen(cmd, env=child_env(remote, token), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                      errors="replace", start_new_session=True)
        try:
            assert self._proc.stdout is not None
            for raw in self._proc.stdout:
                line = raw.rstrip("\n")
                if token and token in line:  # never expected; a log line must not carry it
                    line = line.replace(token, "***")
                self.log.info("%s", line)
                tail.append(line)
                if app is None and SPARK_APP_LOG_MARKER in line:
                    app = parse_spark_application_line(line)
            status = self._proc.wait()
        except AirflowTaskTimeout as err:
            self._kill()
            if isinstance(err, SparkApplicationTimeoutError):
                raise
            raise SparkApplicationTimeoutError(
                f"Spark Connect application {self.name!r} did not finish within the task's execution_timeout "
                f"({self.execution_timeout}); its client process is killed") from err
        except BaseException:
            self._kill()
            raise
        finally:
            self._proc = None
        if app is not None and app.get("app_id"):
            self.log.info("Spark application %s", app["app_id"])
            context["ti"].xcom_push(key=SPARK_APP_XCOM_KEY,
                                    value={**app, "finished": True, "history_url": None})
        if status != 0:
            raise SparkConnectApplicationError(
                f"Spark Connect application {self.name!r} exited with status {status}; its last lines:\n"
                + "\n".join(tail))

    def _kill(self) -> None:
        """Stop the child's process group (SIGTERM, SIGKILL after 10 s)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def on_kill(self) -> None:
        self._kill()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (extra ``lineage``): the application's input and output tables, as for ``spark-submit``."""
        # lazy: the lineage facets load only when OpenLineage asks for them
        from airflow_provider_plgd.operators import lineage

        return lineage.spark_app_lineage(self.application, self.application_args or [])
