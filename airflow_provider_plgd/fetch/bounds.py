"""The bounds of one fetch of the operator: a time interval, a stream-sequence range or a durable
consumer, checked (:func:`read_bounds`).

Errors: ``ValueError`` naming the argument and what is expected;
:class:`~airflow_provider_plgd.exceptions.MissingDataIntervalError` (Airflow: no retries) for a run
without a data interval, or with an empty one.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_plgd import times
from airflow_provider_plgd.coerce import positive_int
from airflow_provider_plgd.exceptions import MissingDataIntervalError


def zero_width_interval_message(task_id: str, moment: Any) -> str:
    """The error for a run whose data interval has no width (``data_interval_start == data_interval_end``).

    Airflow 3 turns ``schedule=timedelta(...)`` into ``DeltaTriggerTimetable`` and a cron string into
    ``CronTriggerTimetable`` (unless ``[scheduler] create_delta_data_intervals`` /
    ``create_cron_data_intervals`` are on): their runs cover one point in time, not an interval.
    Source: Airflow 3 docs, "Timetables" and the ``[scheduler]`` configuration reference.
    """
    return (
        f"task {task_id!r}: the run's data interval is empty (data_interval_start == data_interval_end == "
        f"{moment}), so there is nothing to fetch. On Airflow 3 a DAG with schedule=timedelta(...) or a cron "
        "string gets a trigger timetable whose runs cover one point in time. Schedule the DAG with a "
        "data-interval timetable: schedule=DeltaDataIntervalTimetable(timedelta(hours=1)) or "
        "schedule=CronDataIntervalTimetable(\"0 * * * *\", timezone=\"UTC\") (both from airflow.sdk), or set "
        "[scheduler] create_delta_data_intervals / create_cron_data_intervals = True; or give the operator "
        "start_time and end_time. See docs/operations.md, \"Using the operators in your own DAG\"."
    )


def read_bounds(task_id: str, *, start_time: Any, end_time: Any, start_seq: Any, end_seq: Any, durable: Any,
                max_messages: Any, data_interval_start: Any, data_interval_end: Any,
                ) -> tuple[str, dict[str, Any] | times.Interval]:
    """Return ``(mode, bounds)``: ``("time", times.Interval)`` from ``start_time``/``end_time`` or else
    the run's data interval; ``("seq", {"kind": "seq", "start_seq", "end_seq"})``; or
    ``("durable", {"kind": "durable", "consumer", "max_messages"})`` (default 100,000 messages).

    :raises ValueError: more than one kind of bounds, or a bad value (named).
    :raises MissingDataIntervalError: no explicit bounds and no (or an empty) data interval.
    """
    explicit_time = start_time not in (None, "") or end_time not in (None, "")
    explicit_seq = start_seq not in (None, "") or end_seq not in (None, "")
    is_durable = durable not in (None, "")
    if explicit_time + explicit_seq + is_durable > 1:
        raise ValueError(
            "choose one kind of bounds: start_time/end_time, start_seq/end_seq, or durable "
            f"(got start_time={start_time!r}, end_time={end_time!r}, start_seq={start_seq!r}, "
            f"end_seq={end_seq!r}, durable={durable!r})"
        )
    if is_durable:
        name = str(durable)
        if not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"durable consumer name {name!r} may only contain letters, digits, '-' and '_'")
        max_messages = positive_int(max_messages if max_messages not in (None, "") else 100_000,
                                     "max_messages")
        return "durable", {"kind": "durable", "consumer": name, "max_messages": max_messages}
    if explicit_seq:
        if start_seq in (None, ""):
            raise ValueError(f"start_seq is required with end_seq={end_seq!r}")
        start_seq = positive_int(start_seq, "start_seq")
        end_seq = None if end_seq in (None, "") else positive_int(end_seq, "end_seq")
        if end_seq is not None and end_seq < start_seq:
            raise ValueError(f"end_seq {end_seq} must not be below start_seq {start_seq}")
        return "seq", {"kind": "seq", "start_seq": start_seq, "end_seq": end_seq}
    if explicit_time:
        if start_time in (None, "") or end_time in (None, ""):
            raise ValueError(
                f"start_time and end_time must both be set (got {start_time!r}, {end_time!r})"
            )
        start, end = start_time, end_time
    else:
        start, end = data_interval_start, data_interval_end
        if start is None or end is None:
            raise MissingDataIntervalError(
                f"task {task_id!r} has no data interval (a manually triggered or asset-driven run on "
                "Airflow 3) and no explicit bounds: trigger the DAG with a logical date / backfill it, or set "
                "start_time/end_time, start_seq/end_seq, or durable"
            )
        if start == end:
            raise MissingDataIntervalError(zero_width_interval_message(task_id, start))
    return "time", times.Interval.of(start, end)  # type: ignore[arg-type]  # both checked set above


def interval_and_read_kwargs(mode: str, bounds: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """The staging interval ID and the ``JetStreamHook.aiter_batches`` bounds of a time (``start_ns``,
    ``end_ns``) or sequence (``start_seq``, ``end_seq``) read."""
    if mode == "time":
        window = times.Interval.from_bounds(bounds)
        return window.id, {"start_time": window.start_ns, "end_time": window.end_ns}
    return (times.seq_interval_id(bounds["start_seq"], bounds["end_seq"]),
            {"start_seq": bounds["start_seq"], "end_seq": bounds["end_seq"]})
