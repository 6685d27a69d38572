"""``SparkSubmitOperator`` that runs only a ``--py-files`` zip whose SHA-256 it has just checked.

In client mode the Spark driver runs inside the Airflow task, with the worker's environment
(connections in ``AIRFLOW_CONN_*``, secrets backends' credentials). Whoever can change the
``--py-files`` zip therefore runs code as the Airflow worker. The ETL ``plan`` task builds the
zip in a worker-private folder under a content-addressed name
(:func:`airflow_provider_plgd.spark_deps.build_private_py_files_zip`); this operator checks the
file against that name right before ``spark-submit``
(:func:`airflow_provider_plgd.spark_deps.verified_py_files_zip`) and fails without retries
otherwise. Trust boundary: ``docs/operations.md``, "Shipping the plgd code to executors".
"""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_provider_plgd.spark_deps import PyFilesIntegrityError, verified_py_files_zip

try:  # Airflow 3.x
    from airflow.sdk.exceptions import AirflowFailException as _FailWithoutRetry
except ImportError:  # pragma: no cover - Airflow 2.11
    from airflow.exceptions import AirflowFailException as _FailWithoutRetry  # type: ignore[no-redef]


class UntrustedPyFilesError(_FailWithoutRetry, PyFilesIntegrityError):
    """The ``--py-files`` zip failed its check; the task fails at once, without retries (a retry
    would meet the same file). Also a :class:`~airflow_provider_plgd.spark_deps.PyFilesIntegrityError`
    (a ``ValueError``)."""


class PlgdSparkSubmitOperator(SparkSubmitOperator):
    """``SparkSubmitOperator`` whose ``py_files`` is the plgd zip, verified before ``spark-submit``.

    Takes every argument of ``SparkSubmitOperator`` (``apache-airflow-providers-apache-spark``).

    :param py_files: (templated) the path the ETL ``plan`` task returned, named
        ``plgd_py_files-<sha256>.zip``. Before submitting, ``execute`` replaces it with this
        worker's verified copy (``spark_deps.verified_py_files_zip``: looked up in this worker's
        private folder, built from the installed provider if missing, SHA-256 compared with the
        name).
    :raises UntrustedPyFilesError: (from ``execute``, before ``spark-submit`` starts) the file's
        SHA-256 differs from its name, this worker builds a different zip (another provider
        version), the name is not content-addressed, or the folder is not private. The message
        names the path and both hashes.
    """

    def execute(self, context: Any) -> None:
        try:
            verified = verified_py_files_zip(self.py_files or "")
        except PyFilesIntegrityError as err:
            raise UntrustedPyFilesError(str(err)) from err
        self.log.info("--py-files %s: sha256 matches its name", verified)
        self.py_files = verified
        self._hook = None  # a hook built earlier would carry the unverified path
        return super().execute(context)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (extra ``lineage``): the application's input and output tables
        (:func:`airflow_provider_plgd.lineage.spark_app_lineage`; names in ``docs/lineage.md``)."""
        from airflow_provider_plgd import lineage

        return lineage.spark_app_lineage(self.application, self.application_args or [])
