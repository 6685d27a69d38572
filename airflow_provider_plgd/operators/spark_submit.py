"""``SparkSubmitOperator`` that runs only a ``--py-files`` zip whose SHA-256 it has just checked.

In client mode the Spark driver runs inside the Airflow task, with the worker's environment
(connections in ``AIRFLOW_CONN_*``, secrets backends' credentials). Whoever can change the
``--py-files`` zip therefore runs code as the Airflow worker. The ETL ``plan`` task builds the
zip in a worker-private folder under a content-addressed name
(:func:`airflow_provider_plgd.spark_deps.build_private_py_files_zip`); this operator checks the
file against that name right before ``spark-submit``
(:func:`airflow_provider_plgd.spark_deps.verified_py_files_zip`) and fails without retries
otherwise. Trust boundary: ``docs/operations.md``, "Shipping the plgd code to executors".

It also takes Spark settings of the DAG run from a DAG param (``run_conf_param``), gives the driver
the Airflow worker's Python when only ``spark.pyspark.python`` is set, and turns an
``execution_timeout`` into :class:`SparkApplicationTimeoutError` (``docs/operations.md``, "Run on a
Spark cluster"). Its "Spark application" link (:class:`~airflow_provider_plgd.operators.links.PlgdSparkApplicationLink`)
leads to the driver's Spark UI while the application runs, then to the History Server if configured.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_provider_plgd.compat import AirflowTaskTimeout
from airflow_provider_plgd.exceptions import (
    PyFilesIntegrityError,
    SparkApplicationTimeoutError,
    UntrustedPyFilesError,
)
from airflow_provider_plgd.operators.links import (
    SPARK_APP_XCOM_KEY,
    PlgdSparkApplicationLink,
    history_url,
    parse_spark_application_line,
    spark_application_url,
)
from airflow_provider_plgd.run_params import check_run_spark_conf, run_spark_conf_policy
from airflow_provider_plgd.spark.session import SPARK_APP_LOG_MARKER
from airflow_provider_plgd.spark_conf import merge_spark_conf
from airflow_provider_plgd.spark_deps import verified_py_files_zip

#: Spark's setting of the executors' Python (Spark docs, "Configuration", "Runtime Environment").
PYSPARK_PYTHON = "spark.pyspark.python"
#: Spark's setting of the driver's Python; it wins over ``PYSPARK_DRIVER_PYTHON``, and when it is
#: unset ``spark.pyspark.python`` wins over the environment for the driver too.
PYSPARK_DRIVER_PYTHON = "spark.pyspark.driver.python"


def with_driver_python(conf: Mapping[str, str], driver_python: str | None = None) -> dict[str, str]:
    """``conf`` with ``spark.pyspark.driver.python`` set to ``driver_python`` (default: this
    process's interpreter, the Airflow worker's) when only ``spark.pyspark.python`` is set.

    In client mode the driver runs on the Airflow worker; Spark gives ``spark.pyspark.python`` to
    the driver too when ``spark.pyspark.driver.python`` is unset, and that path (the executors'
    interpreter) usually does not exist there (``Cannot run program .../python``).
    """
    out = dict(conf)
    if out.get(PYSPARK_PYTHON) and PYSPARK_DRIVER_PYTHON not in out:
        out[PYSPARK_DRIVER_PYTHON] = driver_python or sys.executable
    return out


class PlgdSparkSubmitOperator(SparkSubmitOperator):
    """``SparkSubmitOperator`` whose ``py_files`` is the plgd zip, verified before ``spark-submit``.

    Takes every argument of ``SparkSubmitOperator`` (``apache-airflow-providers-apache-spark``), and:

    :param run_conf_param: the name of a DAG param (e.g. ``spark_conf``) whose value, an object of
        Spark settings, is merged over ``conf`` when the task runs (:func:`merge_spark_conf`:
        ``null`` removes a setting). ``None`` (default): no param.
    :param run_conf_keys: the settings that param may hold, with the pattern of each value
        (:func:`airflow_provider_plgd.run_params.run_spark_conf_policy`; default: the resource
        settings of ``DEFAULT_RUN_SPARK_CONF_KEYS``). A run param is untrusted input.

    Before submitting, ``spark.pyspark.driver.python`` defaults to the Airflow worker's Python when
    only ``spark.pyspark.python`` is set (:func:`with_driver_python`).

    :param py_files: (templated) the path the ETL ``plan`` task returned, named
        ``plgd_py_files-<sha256>.zip``. Before submitting, ``execute`` replaces it with this
        worker's verified copy (``spark_deps.verified_py_files_zip``: looked up in this worker's
        private folder, built from the installed provider if missing, SHA-256 compared with the
        name).
    :raises UntrustedPyFilesError: (from ``execute``, before ``spark-submit`` starts) the file's
        SHA-256 differs from its name, this worker builds a different zip (another provider
        version), the name is not content-addressed, or the folder is not private. The message
        names the path and both hashes.
    :raises UntrustedRunParamError: (from ``execute``, before ``spark-submit`` starts) the
        ``run_conf_param`` value is not an object of settings, holds a setting outside
        ``run_conf_keys`` or a value that does not match its pattern; no retries.
    :param spark_ui_url_template: the Spark History Server page of an application, with
        ``{app_id}``, e.g. ``https://spark-history.example:18080/history/{app_id}/``. The
        "Spark application" link leads to the driver's Spark UI while ``spark-submit`` runs (the
        application logs its ID and UI URL, :func:`~airflow_provider_plgd.spark.session.log_spark_application`;
        YARN and Kubernetes cluster mode: the ID ``SparkSubmitHook`` found), and after it ended to
        this page; without a template, no link then. ``None`` (default): no History Server.
    :raises ValueError: ``spark_ui_url_template`` has another field than ``{app_id}``.
    :raises SparkApplicationTimeoutError: the task's ``execution_timeout`` passed before
        ``spark-submit`` ended (Airflow kills it; retries apply).
    """

    operator_extra_links = (PlgdSparkApplicationLink(),)

    def __init__(self, *, run_conf_param: str | None = None,
                 run_conf_keys: Mapping[str, str | None] | None = None,
                 spark_ui_url_template: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_conf_param = run_conf_param
        self.run_conf_keys = run_spark_conf_policy(run_conf_keys)
        history_url(spark_ui_url_template, "app-check")  # a bad template fails the DAG's parse
        self.spark_ui_url_template = spark_ui_url_template
        self._spark_app: dict[str, Any] | None = None
        self._link_context: Any = None

    def _get_hook(self) -> Any:
        """The provider's hook, whose ``spark-submit`` output also goes through
        :meth:`_watch_submit_log` (the "Spark application" link)."""
        hook = super()._get_hook()
        process = getattr(hook, "_process_spark_submit_log", None)
        if process is None:  # a private method of the apache-spark provider's hook
            self.log.warning("%s has no _process_spark_submit_log: the \"Spark application\" link "
                             "appears only after the application ends", type(hook).__name__)
        else:
            setattr(hook, "_process_spark_submit_log",  # noqa: B010 - wraps the hook's own method
                    lambda itr: process(self._watch_submit_log(itr)))
        return hook

    def _watch_submit_log(self, lines: Any) -> Any:
        """Yield ``lines`` unchanged; the first :data:`SPARK_APP_LOG_MARKER` line sets the link
        (:meth:`_push_spark_application`)."""
        for line in lines:
            if self._spark_app is None and SPARK_APP_LOG_MARKER in line:
                application = parse_spark_application_line(line)
                if application is not None:
                    self._spark_app = application
                    self._push_spark_application(finished=False)
            yield line

    def _push_spark_application(self, *, finished: bool) -> None:
        """Push the application to XCom (:data:`~airflow_provider_plgd.operators.links.SPARK_APP_XCOM_KEY`);
        while it runs, on Airflow 3 also the link itself under the link's ``xcom_key`` (the UI
        shows it before the task ends; Airflow 2.11's webserver calls ``get_link`` itself). A
        failed push is logged, never fails the task."""
        ti = (self._link_context or {}).get("ti")
        if ti is None or not self._spark_app or not self._spark_app.get("app_id"):
            return
        value = {**self._spark_app, "finished": finished,
                 "history_url": history_url(self.spark_ui_url_template, self._spark_app["app_id"])}
        try:
            ti.xcom_push(key=SPARK_APP_XCOM_KEY, value=value)
            link_key = getattr(PlgdSparkApplicationLink(), "xcom_key", None)  # Airflow 3 only
            if link_key and not finished:
                ti.xcom_push(key=link_key, value=spark_application_url(value))
        except Exception:  # a link is not worth failing the Spark task
            self.log.warning("Could not push the Spark application %s to XCom", value["app_id"], exc_info=True)

    def _finish_spark_application(self) -> None:
        """After ``spark-submit``: the application ID (logged by the app, else the one the hook
        found in YARN/Kubernetes cluster mode) goes to XCom as finished."""
        if self._spark_app is None:
            hook = self._hook
            app_id = (getattr(hook, "_yarn_application_id", None)
                      or getattr(hook, "_kubernetes_application_id", None))
            if app_id:
                self._spark_app = {"app_id": app_id, "ui_web_url": None}
        if self._spark_app is not None:
            self.log.info("Spark application %s", self._spark_app["app_id"])
            self._push_spark_application(finished=True)

    def execute(self, context: Any) -> None:
        run_settings = {}
        if self.run_conf_param:  # untrusted input: checked before anything else
            params = context.get("params") or {}
            run_settings = check_run_spark_conf(params.get(self.run_conf_param), self.run_conf_keys,
                                                param=self.run_conf_param)
        try:
            verified = verified_py_files_zip(self.py_files or "")
        except PyFilesIntegrityError as err:
            raise UntrustedPyFilesError(str(err)) from err
        self.log.info("--py-files %s: sha256 matches its name", verified)
        self.py_files = verified
        dag_conf = self.conf
        conf = merge_spark_conf(dict(dag_conf or {}), run_settings, source=f"DAG param {self.run_conf_param!r}")
        run_conf = with_driver_python(conf)
        if PYSPARK_DRIVER_PYTHON not in conf and PYSPARK_DRIVER_PYTHON in run_conf:
            self.log.info("%s is set and %s is not: the driver (client mode, on this worker) uses %s",
                          PYSPARK_PYTHON, PYSPARK_DRIVER_PYTHON, run_conf[PYSPARK_DRIVER_PYTHON])
        self.log.info("Spark settings (--conf) of this run: %s", ", ".join(sorted(run_conf)))
        self.conf = run_conf  # this run's settings; the DAG's are restored after spark-submit
        self._hook = None  # a hook built earlier would carry the unverified path and other settings
        self._spark_app, self._link_context = None, context
        try:
            return super().execute(context)
        except AirflowTaskTimeout as err:
            if isinstance(err, SparkApplicationTimeoutError):
                raise
            timeout = getattr(self, "execution_timeout", None)
            raise SparkApplicationTimeoutError(
                f"Spark application {self.name or self.application!r} did not finish within the task's "
                f"execution_timeout ({timeout}); spark-submit is killed. If its log shows \"Initial job has "
                "not accepted any resources\", it never got an executor: the workers cannot reach the driver "
                "(spark.driver.host) or no worker offers spark.executor.memory / spark.executor.cores. See "
                "docs/operations.md, \"Run on a Spark cluster\"."
            ) from err
        finally:
            self.conf = dag_conf
            self._finish_spark_application()
            self._link_context = None

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (extra ``lineage``): the application's input and output tables
        (:func:`airflow_provider_plgd.operators.lineage.spark_app_lineage`; names in ``docs/lineage.md``)."""
        # lazy: the lineage facets load only when OpenLineage asks for them
        from airflow_provider_plgd.operators import lineage

        return lineage.spark_app_lineage(self.application, self.application_args or [])
