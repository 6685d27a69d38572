"""The provider's errors that subclass Airflow's exceptions (so importing this module imports Airflow).

:class:`UntrustedRunParamError`, :class:`MissingDataIntervalError`, :class:`OffScheduleIntervalError`
and :class:`UntrustedPyFilesError` are ``AirflowFailException`` subclasses: the task fails without
retries. :class:`SparkApplicationTimeoutError` is an ``AirflowTaskTimeout``. All derive from
:class:`~airflow_provider_plgd.exceptions.PlgdError` and are importable from
:mod:`airflow_provider_plgd.exceptions` too.
"""

from __future__ import annotations

from airflow_provider_plgd.compat import AirflowFailException as _FailWithoutRetry
from airflow_provider_plgd.compat import AirflowTaskTimeout
from airflow_provider_plgd.exceptions import PlgdError, PyFilesIntegrityError


class UntrustedRunParamError(_FailWithoutRetry, PlgdError, ValueError):
    """A run param is outside what the DAG author allows (:mod:`airflow_provider_plgd.run_params`).
    Raised in ``plan`` (and by
    :class:`~airflow_provider_plgd.operators.spark_submit.PlgdSparkSubmitOperator` for ``spark_conf``)
    before anything is read, written or started; the task fails at once, without retries (the same
    param would fail again). Also a ``ValueError``. The message names the param, the value (never a
    credential: a root with one is refused without repeating it) and how the DAG author allows it."""


class MissingDataIntervalError(_FailWithoutRetry, PlgdError, ValueError):
    """The DAG run has no data interval, so there is nothing to bound the fetch by.

    On Airflow 3 a run triggered without a logical date (``airflow dags trigger`` without
    ``--logical-date``, the UI's trigger button with an empty date, an asset-triggered run) has
    ``logical_date``, ``data_interval_start`` and ``data_interval_end`` set to ``None``. Raised by
    the ETL DAG's first task (``wait_for_interval``, through its ``interval_check``), and by the
    interval sensor and the fetch operator when they have neither a data interval nor explicit
    bounds. Also the error of an empty data interval (start == end, e.g. the one-point runs
    of Airflow 3's trigger timetables), in ``wait_for_interval`` and the fetch operator: the one
    error of a run without an interval to process. An ``AirflowFailException``, so the task
    fails at once without retries. Also a ``ValueError``.
    """


class OffScheduleIntervalError(_FailWithoutRetry, PlgdError, ValueError):
    """A manual run's data interval is not one interval of the DAG's schedule.

    Airflow 3.3's Trigger dialog fills the logical date with the current time, and Airflow infers
    the data interval ``[logical date - interval, logical date)`` from it
    (``DeltaDataIntervalTimetable.infer_manual_data_interval``), e.g. 16:14-17:14, which overlaps
    two intervals of the schedule. Such a run is refused in its first task (``wait_for_interval``),
    before anything is read or written; the message names the last interval of the schedule that
    ends by the logical date and the backfill that runs it. An ``AirflowFailException`` (no
    retries) and a ``ValueError``.
    """


class UntrustedPyFilesError(_FailWithoutRetry, PyFilesIntegrityError):
    """The ``--py-files`` zip failed its check; the task fails at once, without retries (a retry
    would meet the same file). Also a :class:`PyFilesIntegrityError` (a ``ValueError``)."""


class SparkApplicationTimeoutError(AirflowTaskTimeout, PlgdError):
    """The Spark application did not finish within the task's ``execution_timeout``.

    Airflow then kills ``spark-submit`` (the operator's ``on_kill``) and handles the task like any
    timeout (retries apply). Typical cause: the application never got an executor (the driver is
    unreachable from the workers, or ``spark.executor.memory`` / ``spark.executor.cores`` above
    what any worker offers).
    """


__all__ = ["MissingDataIntervalError", "OffScheduleIntervalError", "SparkApplicationTimeoutError",
           "UntrustedPyFilesError", "UntrustedRunParamError"]
