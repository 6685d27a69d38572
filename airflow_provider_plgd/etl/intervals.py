"""The data interval of an ETL run: the schedule's grid, and the run's interval checked against it."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import pendulum
from airflow.timetables.interval import CronDataIntervalTimetable as CoreCron  # the core computes the grid

from airflow_provider_plgd import times
from airflow_provider_plgd.exceptions import MissingDataIntervalError, OffScheduleIntervalError


def schedule_interval_ending_by(schedule: timedelta | str, start_date: datetime,
                                moment: datetime) -> tuple[datetime, datetime]:
    """The last interval ``[start, end)`` of the ETL DAG's schedule with ``end <= moment``.

    :param schedule: the ``build_etl_dag`` schedule: a ``timedelta`` (intervals ``start_date + k *
        schedule``, as ``DeltaDataIntervalTimetable`` schedules them) or a cron string (UTC;
        ``CronDataIntervalTimetable``, whose ``infer_manual_data_interval`` is this rule).
    :param start_date: the DAG's start date (aware).
    :param moment: an aware datetime.
    """
    if isinstance(schedule, timedelta):
        step_ns = schedule // timedelta(microseconds=1) * 1000  # integers: pendulum's Duration // timedelta fails
        k = (times.to_ns(moment, "moment") - times.to_ns(start_date, "start_date")) // step_ns
        end = start_date + k * schedule
        return end - schedule, end
    interval = CoreCron(schedule, timezone="UTC").infer_manual_data_interval(run_after=pendulum.instance(moment))
    return interval.start, interval.end


def require_data_interval(context: Mapping[str, Any], *, schedule: timedelta | str | None = None,
                          start_date: datetime | None = None) -> tuple[datetime, datetime]:
    """Return the run's ``(data_interval_start, data_interval_end)`` (aware datetimes).

    Used as the ``interval_check`` of ``wait_for_interval`` and by ``plan`` (``build_etl_dag``
    passes its ``schedule`` and ``start_date``).

    :param context: the task context (keys ``data_interval_start``, ``data_interval_end``, ``dag_run``).
    :param schedule: with ``start_date``: refuse a manual run whose interval is not one interval
        of this schedule (:func:`schedule_interval_ending_by`).
    :raises MissingDataIntervalError: when either is missing (a run without a logical date on
        Airflow 3), with the ways to run the DAG for an interval.
    :raises OffScheduleIntervalError: a manual run whose data interval is not an interval of the schedule.
    """
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None:
        dag_run = context.get("dag_run")
        run_id = getattr(dag_run, "run_id", None)
        raise MissingDataIntervalError(
            f"DAG run {run_id!r} has no data interval (logical date None: a manual or asset-triggered run\n"
            "on Airflow 3), so there is no interval of the stream to process. Run an interval with a backfill:\n"
            "  airflow backfill create --dag-id <dag> \\\n"
            "    --from-date <interval start> --to-date <interval start> --reprocess-behavior completed\n"
            "or `airflow dags test <dag> <interval end>`; see docs/operations.md, \"Backfill and reruns\"."
        )
    if end <= start:
        raise MissingDataIntervalError(f"empty data interval [{start}, {end}) of DAG run {context.get('run_id')!r}")
    dag_run = context.get("dag_run")
    run_type = getattr(dag_run, "run_type", None)
    manual = str(getattr(run_type, "value", run_type)) == "manual"
    if schedule is not None and start_date is not None and manual \
            and (start, end) != schedule_interval_ending_by(schedule, start_date, end):
        grid_start, grid_end = schedule_interval_ending_by(schedule, start_date, context.get("logical_date") or end)
        dag_id = getattr(dag_run, "dag_id", None) or "<dag>"
        raise OffScheduleIntervalError(
            f"manual DAG run {getattr(dag_run, 'run_id', None)!r}\n"
            f"has the data interval [{start.isoformat()}, {end.isoformat()}),\n"
            f"which is not an interval of the schedule ({schedule} from {start_date.isoformat()}).\n"
            "It would overlap processed intervals, so nothing was read or written.\n"
            "The last interval of the schedule that ends by the logical date is\n"
            f"  [{grid_start.isoformat()}, {grid_end.isoformat()}).\n"
            "To (re)process it, use a backfill (the Trigger dialog's Backfill option, or the command below),\n"
            "or clear that interval's run:\n"
            f"  airflow backfill create --dag-id {dag_id} \\\n"
            f"    --from-date {grid_start.isoformat()} --to-date {grid_start.isoformat()} \\\n"
            "    --reprocess-behavior completed\n"
            "See docs/operations.md, \"Manual runs\"."
        )
    return start, end
