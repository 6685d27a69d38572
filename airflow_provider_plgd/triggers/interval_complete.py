"""Async trigger behind the deferrable :class:`JetStreamIntervalCompleteSensor`.

An interval ``[start, end)`` is complete when the stream holds a message whose JetStream server
timestamp is at or after ``end`` (server timestamps grow with the stream sequence, so nothing
older can still arrive), or when the NATS server's clock is at ``end + settle_seconds`` or
later and, for a mirror, its origin was in contact after that with ``lag`` 0. Both are judged
on values the server sends, never on the triggerer's clock
(:mod:`airflow_provider_plgd.jetstream.completeness`). A mirror still not current past
``end + settle_seconds + source_wait_seconds`` ends the wait with an error. A check that fails
(connection undefined, server down) is never taken for "complete": it is logged and retried.
Source: ``docs/architecture.md`` ("Bounded batches"), ``docs/reliability.md`` ("Complete intervals").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow_provider_plgd.compat import BaseTrigger, TriggerEvent
from airflow_provider_plgd.exceptions import StreamNotFoundError, StreamSourceStaleError
from airflow_provider_plgd.jetstream.completeness import require_interval_complete

if TYPE_CHECKING:
    from airflow_provider_plgd.jetstream.completeness import IntervalStatus

CLASSPATH = "airflow_provider_plgd.triggers.interval_complete.JetStreamIntervalCompleteTrigger"


async def read_status_failing_stale(
    hook: Any, *, subject_filter: str, end_ns: int, settle_seconds: float, source_wait_seconds: float | None = None
) -> IntervalStatus:
    """One check of the interval ending at ``end_ns`` (``hook.aget_interval_status``), failing when stale.

    :return: the hook's :class:`~airflow_provider_plgd.jetstream.completeness.IntervalStatus`.
    :raises StreamSourceStaleError: a mirror's link is still not current past
        ``end + settle_seconds + source_wait_seconds`` (``completeness.require_interval_complete``).
    :raises Exception: errors of the hook (connection, missing stream) propagate; they never
        mean "complete".
    """
    status: IntervalStatus = await hook.aget_interval_status(
        int(end_ns), settle_seconds=float(settle_seconds), subject_filter=subject_filter,
        source_wait_seconds=source_wait_seconds)
    if status.stale:
        require_interval_complete(status, (await hook.aget_settings()).stream)
    return status


def success_payload(status: IntervalStatus) -> dict[str, Any]:
    """The sensor's result / the trigger's success event of a complete ``status`` (JSON: the edge
    where the typed status becomes a dict)."""
    return {"status": "success", "reason": status.reason, "end_ns": status.end_ns,
            "newer_messages": status.newer_messages, "server_time_ns": status.server_time_ns}


async def check_interval_complete(
    hook: Any, *, subject_filter: str, end_ns: int, settle_seconds: float, source_wait_seconds: float | None = None
) -> dict[str, Any] | None:
    """Check once whether the interval ending at ``end_ns`` is complete, on the server's clock.

    :param hook: a ``JetStreamHook`` (its ``aget_interval_status`` is used).
    :param subject_filter: JetStream filter subject whose messages at or after the end are counted
        (``newer_messages``); completeness itself is a property of the whole stream.
    :param end_ns: exclusive end of the interval, unix ns (JetStream server time).
    :param settle_seconds: seconds after ``end_ns`` on the NATS server's clock after which the
        interval counts as complete even without a newer message (a mirror: current after it).
    :param source_wait_seconds: a mirror: seconds past end + settle after which a mirror still not
        current raises (None: ``completeness.DEFAULT_SOURCE_WAIT_SECONDS``).
    :return: ``{"status": "success", "reason": "newer_message" | "settled", "end_ns",
        "newer_messages", "server_time_ns"}`` when complete, else None.
    :raises StreamSourceStaleError: a mirror is still not current past the limit.
    :raises Exception: errors of the hook (connection, missing stream) propagate; they never
        mean "complete".
    """
    status = await read_status_failing_stale(hook, subject_filter=subject_filter, end_ns=end_ns,
                                             settle_seconds=settle_seconds, source_wait_seconds=source_wait_seconds)
    return success_payload(status) if status.complete else None


def raise_if_cancelling() -> None:
    """Re-raise a cancellation of the current task that a library swallowed.

    On Python 3.11, ``asyncio.wait_for`` (used inside nats-py's requests) drops a cancellation that
    arrives as its inner future completes (CPython gh-86296, fixed in 3.12). A polling loop that
    then goes on would never end: the triggerer could not stop it, and a caller's timeout would
    wait forever. Called after each poll; ``Task.cancelling`` exists from Python 3.11.

    :raises asyncio.CancelledError: the current task was asked to stop.
    """
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    if cancelling is not None and cancelling():
        raise asyncio.CancelledError


def is_missing_stream_error(exc: BaseException | None) -> bool:
    """True when ``exc`` (or its cause) says the stream does not exist.

    Recognises :class:`airflow_provider_plgd.exceptions.StreamNotFoundError` (what the one JetStream
    API client, ``jetstream/api.py``, raises for a missing stream) and the JetStream error code 10059.
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, StreamNotFoundError) or getattr(exc, "err_code", None) == 10059:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class JetStreamIntervalCompleteTrigger(BaseTrigger):
    """Poll JetStream until an interval is complete (see the module docstring), then fire once.

    Events (payload, JSON):

    * ``{"status": "success", "reason": "newer_message" | "settled", "end_ns", "newer_messages",
      "server_time_ns"}`` (``server_time_ns``: the NATS server's time of the deciding check, unix ns)
    * ``{"status": "error", "reason": "missing_stream", "message": ...}`` when the stream does not
      exist.
    * ``{"status": "error", "reason": "source_stale", "message", "stream", "end_ns",
      "server_time_ns", "last_ts_ns", "settle_seconds", "source_wait_seconds", "upstreams"}`` when
      the stream is a mirror that is still not current past
      ``end + settle_seconds + source_wait_seconds`` (the fields of ``StreamSourceStaleError``).
      Other errors (connection undefined or lost, server down or restarting) are logged
      with their cause and retried at the next poll; they never produce a success event (the
      deferral's timeout, the sensor's ``timeout``, fails the task if they persist).

    :param end_ns: exclusive end of the interval, unix ns.
    :param subject_filter: JetStream filter subject (default ``plgd.>``).
    :param stream: stream name (None: the connection's ``stream`` extra, else ``EVENTS``).
    :param jetstream_conn_id: Airflow connection of type ``plgd_jetstream``.
    :param settle_seconds: see :func:`check_interval_complete`.
    :param poll_interval: seconds between checks.
    :param source_wait_seconds: see :func:`check_interval_complete` (None: the default).
    """

    def __init__(
        self,
        *,
        end_ns: int,
        subject_filter: str = "plgd.>",
        stream: str | None = None,
        jetstream_conn_id: str = "plgd_jetstream_default",
        settle_seconds: float = 60.0,
        poll_interval: float = 5.0,
        source_wait_seconds: float | None = None,
    ) -> None:
        super().__init__()
        self.end_ns = int(end_ns)
        self.subject_filter = subject_filter
        self.stream = stream
        self.jetstream_conn_id = jetstream_conn_id
        self.settle_seconds = float(settle_seconds)
        self.poll_interval = float(poll_interval)
        self.source_wait_seconds = None if source_wait_seconds is None else float(source_wait_seconds)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return the classpath and JSON-only kwargs (str, int, float, None)."""
        return CLASSPATH, {
            "end_ns": self.end_ns,
            "subject_filter": self.subject_filter,
            "stream": self.stream,
            "jetstream_conn_id": self.jetstream_conn_id,
            "settle_seconds": self.settle_seconds,
            "poll_interval": self.poll_interval,
            "source_wait_seconds": self.source_wait_seconds,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll every ``poll_interval`` seconds; yield one event, then stop.

        Errors other than a missing stream are logged (WARNING, with the cause) and retried at the
        next poll; they never complete the interval. When they persist, the sensor's ``timeout``
        ends the wait and fails the task.
        """
        # lazy: the hook (and nats) load in the triggerer's run, not when a DAG file is parsed
        from airflow_provider_plgd.hooks.jetstream import JetStreamHook

        hook = JetStreamHook(jetstream_conn_id=self.jetstream_conn_id, stream=self.stream)
        settle_ns = int(self.settle_seconds * 1e9)
        while True:
            wait = self.poll_interval
            try:
                status = await read_status_failing_stale(
                    hook, subject_filter=self.subject_filter, end_ns=self.end_ns, settle_seconds=self.settle_seconds,
                    source_wait_seconds=self.source_wait_seconds)
            except StreamSourceStaleError as exc:
                self.log.error("%s", exc)
                yield TriggerEvent({"status": "error", "reason": "source_stale", "message": str(exc),
                                    "stream": exc.stream, "end_ns": exc.end_ns, "server_time_ns": exc.server_time_ns,
                                    "last_ts_ns": exc.last_ts_ns, "settle_seconds": exc.settle_seconds,
                                    "source_wait_seconds": exc.source_wait_seconds, "upstreams": exc.upstreams})
                return
            except Exception as exc:  # see below
                if is_missing_stream_error(exc):
                    yield TriggerEvent({"status": "error", "reason": "missing_stream",
                                        "message": f"stream not found: {exc}"})
                    return
                self.log.warning("Checking interval completeness failed, not complete; retrying in %.1f s: %s: %s",
                                 self.poll_interval, type(exc).__name__, exc)
            else:
                if status.complete:
                    self.log.info("Interval ending at %s ns is complete (%s; server time %s ns)", self.end_ns,
                                  status.reason, status.server_time_ns)
                    yield TriggerEvent(success_payload(status))
                    return
                if status.waiting_for:
                    self.log.info("Interval ending at %s ns: waiting for the mirror's origin %s to be current",
                                  self.end_ns, ", ".join(status.waiting_for))
                # wake up when the settle time is over on the server's clock, if that is sooner; once it
                # is over (a mirror not yet current), poll every poll_interval, not in a tight loop
                ahead = (self.end_ns + settle_ns - status.server_time_ns) / 1e9
                if ahead > 0:
                    wait = min(wait, ahead + 0.01)
            raise_if_cancelling()
            await asyncio.sleep(wait)
