"""Sensor: wait until a data interval is complete in the JetStream stream.

Complete means: the stream holds a message whose server timestamp is at or after the interval's
end, or the NATS server's clock is at ``end + settle_seconds`` or later and, for a mirror, its
origin was in contact after that with ``lag`` 0. Both are judged on the
server's values, never on the worker's or triggerer's clock
(:mod:`airflow_provider_plgd.jetstream.completeness`). Works in poke mode and in deferrable mode
(:class:`~airflow_provider_plgd.triggers.interval_complete.JetStreamIntervalCompleteTrigger`).
Source: ``docs/architecture.md`` ("Bounded batches"), ``docs/reliability.md`` ("Complete intervals").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.configuration import conf

from airflow_provider_plgd import times
from airflow_provider_plgd.compat import BaseSensorOperator
from airflow_provider_plgd.exceptions import IntervalNotCompleteError, MissingDataIntervalError, StreamSourceStaleError
from airflow_provider_plgd.jetstream.completeness import check_settle_seconds, check_source_wait_seconds
from airflow_provider_plgd.triggers.interval_complete import (
    JetStreamIntervalCompleteTrigger,
    check_interval_complete,
    is_missing_stream_error,
)

if TYPE_CHECKING:
    from airflow_provider_plgd.compat import Context


def _default_deferrable() -> bool:
    return conf.getboolean("operators", "default_deferrable", fallback=False)


class JetStreamIntervalCompleteSensor(BaseSensorOperator):
    """Wait until the interval ending at ``end_time`` (default: the run's ``data_interval_end``) is complete.

    Succeeds when the stream holds a message (any subject) with a JetStream server timestamp at
    or after the end, or when the NATS server's time is at or after the end plus
    ``settle_seconds`` and, for a mirror (e.g. of the hub's stream across a leafnode), its origin
    was in contact after that with ``lag`` 0 (:mod:`airflow_provider_plgd.jetstream.completeness`).
    Returns (XCom) ``{"status": "success", "reason": "newer_message" | "settled", "end_ns",
    "newer_messages", "server_time_ns"}`` (``newer_messages``: messages of
    ``subject_filter`` at or after the end; ``server_time_ns``: the server's time of the deciding
    check, unix ns).

    Errors: a missing stream raises ``ValueError`` (poke mode) or
    :class:`~airflow_provider_plgd.exceptions.IntervalNotCompleteError` (deferrable mode). A mirror's link
    still not current past ``end + settle_seconds + source_wait_seconds`` on the server's clock
    raises :class:`~airflow_provider_plgd.exceptions.StreamSourceStaleError` (both modes), naming
    the origin, its lag and its last contact. Any other failed check
    (connection undefined, server unreachable, ...) is logged with its cause and counts as "not
    complete": the sensor pokes again, and fails when ``timeout`` is reached. It never succeeds
    without an answer of the server. Without a data interval and without ``end_time``,
    ``execute`` raises :class:`~airflow_provider_plgd.exceptions.MissingDataIntervalError` (a
    ``ValueError``; no retries).

    :param jetstream_conn_id: Airflow connection of type ``plgd_jetstream``.
    :param subject_filter: JetStream filter subject whose newer messages are counted in the
        result (templated; default ``plgd.>``).
    :param stream: stream name (templated; default the connection's ``stream`` extra, else ``EVENTS``).
    :param settle_seconds: seconds after the end, on the NATS server's clock, after which the
        interval counts as complete without a newer message (templated; default 60).
    :param source_wait_seconds: a mirror: seconds past ``end + settle_seconds`` after which a
        mirror still not current fails the sensor (templated; default
        ``completeness.DEFAULT_SOURCE_WAIT_SECONDS``, 1 h).
    :param end_time: explicit interval end: aware datetime, ISO string or unix ns (templated).
    :param deferrable: defer to the triggerer instead of poking (default: the
        ``[operators] default_deferrable`` config option). Poll period: ``poke_interval``.
    :param interval_check: ``callable(context)`` called first in ``execute``, before anything is
        read: it raises when the run's interval must not be processed (the ETL DAG passes
        ``etl.require_data_interval``). Its exception is the task's error, logged after the
        collapsed "Pre Execute" log group of Airflow 3, where the task's page shows a failure
        (a ``pre_execute`` hook's error stays folded inside that group). Not templated.
    """

    template_fields: Sequence[str] = ("subject_filter", "stream", "settle_seconds", "source_wait_seconds", "end_time")
    ui_color = "#e6f1f2"

    def __init__(
        self,
        *,
        jetstream_conn_id: str = "plgd_jetstream_default",
        subject_filter: str = "plgd.>",
        stream: str | None = None,
        settle_seconds: float | str = 60,
        source_wait_seconds: float | str | None = None,
        end_time: Any = None,
        deferrable: bool | None = None,
        interval_check: Callable[[Context], object] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.jetstream_conn_id = jetstream_conn_id
        self.subject_filter = subject_filter
        self.stream = stream
        self.settle_seconds = settle_seconds
        self.source_wait_seconds = source_wait_seconds
        self.end_time = end_time
        self.deferrable = _default_deferrable() if deferrable is None else deferrable
        self.interval_check = interval_check
        self._result: dict[str, Any] | None = None

    # -- helpers ------------------------------------------------------------------------------
    def _end_ns(self, context: Context) -> int:
        end = self.end_time if self.end_time not in (None, "") else context.get("data_interval_end")
        if end is None:
            raise MissingDataIntervalError(
                f"sensor {self.task_id!r} has no data interval (a manually triggered or asset-driven run on "
                "Airflow 3) and no end_time: trigger the DAG with a logical date, or set end_time"
            )
        return times.to_ns(end, "end_time")

    def _settle(self) -> float:
        return check_settle_seconds(self.settle_seconds)

    def _source_wait(self) -> float | None:
        value = self.source_wait_seconds
        return None if value in (None, "", "None") else check_source_wait_seconds(value)

    def _hook(self):
        # lazy: the hook (and nats) load at execute, not when a DAG file is parsed
        from airflow_provider_plgd.hooks.jetstream import JetStreamHook

        return JetStreamHook(jetstream_conn_id=self.jetstream_conn_id, stream=self.stream or None)

    # -- poke mode ----------------------------------------------------------------------------
    def poke(self, context: Context) -> bool:
        """Check once; True when the interval is complete (see the class docstring)."""
        end_ns, settle, source_wait = self._end_ns(context), self._settle(), self._source_wait()
        try:
            result = asyncio.run(
                check_interval_complete(
                    self._hook(), subject_filter=self.subject_filter, end_ns=end_ns, settle_seconds=settle,
                    source_wait_seconds=source_wait,
                )
            )
        except StreamSourceStaleError:
            raise  # the mirror's link is down past the limit: fail loudly
        except Exception as exc:  # classified below
            if is_missing_stream_error(exc):
                raise ValueError(f"JetStream stream {self.stream or '(connection default)'!r} does not exist: {exc}") \
                    from exc
            # never "complete" without an answer of the server
            self.log.warning("Checking interval completeness failed, not complete; will retry at the next poke: "
                             "%s: %s", type(exc).__name__, exc)
            return False
        if result is None:
            self.log.info("Interval ending %s not complete yet (filter %s)", times.ns_to_rfc3339(end_ns),
                          self.subject_filter)
            return False
        self.log.info("Interval ending %s is complete: %s (NATS server time %s)", times.ns_to_rfc3339(end_ns),
                      result["reason"], times.ns_to_rfc3339(result["server_time_ns"]))
        self._result = result
        return True

    # -- execute: poke or defer ---------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        """``interval_check``, then poke mode: the base sensor loop; deferrable: one check, then defer
        to the trigger."""
        if self.interval_check is not None:
            self.interval_check(context)
        if not self.deferrable:
            super().execute(context)
            return self._result
        if self.poke(context):
            return self._result
        self.defer(
            trigger=JetStreamIntervalCompleteTrigger(
                end_ns=self._end_ns(context),
                subject_filter=self.subject_filter,
                stream=self.stream or None,
                jetstream_conn_id=self.jetstream_conn_id,
                settle_seconds=self._settle(),
                source_wait_seconds=self._source_wait(),
                poll_interval=float(self.poke_interval if not isinstance(self.poke_interval, timedelta)
                                    else self.poke_interval.total_seconds()),
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=float(self.timeout)) if self.timeout is not None else None,
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resume after the trigger fired; return its payload or raise on an error event."""
        if event and event.get("reason") == "source_stale":
            raise StreamSourceStaleError(
                event["message"], start_ns=None, **{k: event[k] for k in (
                    "stream", "end_ns", "server_time_ns", "last_ts_ns", "settle_seconds", "source_wait_seconds",
                    "upstreams")})
        if not event or event.get("status") != "success":
            raise IntervalNotCompleteError(
                f"waiting for the interval failed: {(event or {}).get('message', event)!r}"
            )
        self.log.info("Interval ending %s is complete: %s", times.ns_to_rfc3339(event["end_ns"]), event["reason"])
        return event
