"""Async trigger behind the deferrable :class:`JetStreamIntervalCompleteSensor`.

An interval ``[start, end)`` is complete when the stream holds a message of the filter whose
JetStream server timestamp is at or after ``end`` (server timestamps grow with the stream
sequence, so nothing older can still arrive), or when ``settle_seconds`` have passed since
``end`` by the wall clock. Source: ``docs/architecture.md`` ("Bounded batches").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow_provider_plgd.compat import BaseTrigger, TriggerEvent

CLASSPATH = "airflow_provider_plgd.triggers.interval_complete.JetStreamIntervalCompleteTrigger"


async def check_interval_complete(
    hook: Any, *, subject_filter: str, end_ns: int, settle_seconds: float, now_ns: int | None = None
) -> dict[str, Any] | None:
    """Check once whether the interval ending at ``end_ns`` is complete.

    :param hook: a ``JetStreamHook`` (its ``acount_messages`` is used).
    :param subject_filter: JetStream filter subject (``plgd.>`` for the whole stream).
    :param end_ns: exclusive end of the interval, unix ns (JetStream server time).
    :param settle_seconds: wall-clock seconds after ``end_ns`` after which the interval counts as
        complete even without a newer message.
    :param now_ns: the current time (unix ns; default ``time.time_ns()``).
    :return: ``{"status": "success", "reason": "newer_message" | "settled", "end_ns", "newer_messages"}``
        when complete, else None.
    :raises Exception: errors of the hook (connection, missing stream) propagate.
    """
    now_ns = time.time_ns() if now_ns is None else now_ns
    newer = await hook.acount_messages(subject_filter, start_time=int(end_ns))
    if newer > 0:
        return {"status": "success", "reason": "newer_message", "end_ns": int(end_ns), "newer_messages": int(newer)}
    if now_ns >= int(end_ns) + int(float(settle_seconds) * 1e9):
        return {"status": "success", "reason": "settled", "end_ns": int(end_ns), "newer_messages": 0}
    return None


def is_missing_stream_error(exc: BaseException) -> bool:
    """True when ``exc`` (or its cause) says the stream does not exist.

    Recognises the hook's :class:`airflow_provider_plgd.exceptions.StreamNotFoundError`, nats-py's
    ``NotFoundError`` and the JetStream error code 10059.
    """
    from airflow_provider_plgd.exceptions import StreamNotFoundError

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, StreamNotFoundError) or getattr(exc, "err_code", None) == 10059:
            return True
        try:
            from nats.js.errors import NotFoundError

            if isinstance(exc, NotFoundError):
                return True
        except ImportError:  # pragma: no cover
            pass
        exc = exc.__cause__ or exc.__context__
    return False


class JetStreamIntervalCompleteTrigger(BaseTrigger):
    """Poll JetStream until an interval is complete (see the module docstring), then fire once.

    Events (payload, JSON):

    * ``{"status": "success", "reason": "newer_message" | "settled", "end_ns", "newer_messages"}``
    * ``{"status": "error", "reason": "missing_stream", "message": ...}`` when the stream does not
      exist. Other errors (connection lost, server restarting) are logged and retried at the
      next poll.

    :param end_ns: exclusive end of the interval, unix ns.
    :param subject_filter: JetStream filter subject (default ``plgd.>``).
    :param stream: stream name (None: the connection's ``stream`` extra, else ``EVENTS``).
    :param jetstream_conn_id: Airflow connection of type ``plgd_jetstream``.
    :param settle_seconds: see :func:`check_interval_complete`.
    :param poll_interval: seconds between checks.
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
    ) -> None:
        super().__init__()
        self.end_ns = int(end_ns)
        self.subject_filter = subject_filter
        self.stream = stream
        self.jetstream_conn_id = jetstream_conn_id
        self.settle_seconds = float(settle_seconds)
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return the classpath and JSON-only kwargs (str, int, float, None)."""
        return CLASSPATH, {
            "end_ns": self.end_ns,
            "subject_filter": self.subject_filter,
            "stream": self.stream,
            "jetstream_conn_id": self.jetstream_conn_id,
            "settle_seconds": self.settle_seconds,
            "poll_interval": self.poll_interval,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll every ``poll_interval`` seconds; yield one event, then stop."""
        from airflow_provider_plgd.hooks.jetstream import JetStreamHook

        hook = JetStreamHook(jetstream_conn_id=self.jetstream_conn_id, stream=self.stream)
        settle_at_ns = self.end_ns + int(self.settle_seconds * 1e9)
        while True:
            try:
                result = await check_interval_complete(
                    hook, subject_filter=self.subject_filter, end_ns=self.end_ns, settle_seconds=self.settle_seconds
                )
            except Exception as exc:  # noqa: BLE001 - see below
                if is_missing_stream_error(exc):
                    yield TriggerEvent({"status": "error", "reason": "missing_stream",
                                        "message": f"stream {self.stream or hook.stream!r} not found: {exc}"})
                    return
                self.log.warning("Checking interval completeness failed (retrying in %.1f s): %s",
                                 self.poll_interval, exc)
                result = None
                if time.time_ns() >= settle_at_ns:
                    result = {"status": "success", "reason": "settled", "end_ns": self.end_ns, "newer_messages": 0}
            if result is not None:
                self.log.info("Interval ending at %s ns is complete (%s)", self.end_ns, result["reason"])
                yield TriggerEvent(result)
                return
            wait = min(self.poll_interval, max((settle_at_ns - time.time_ns()) / 1e9, 0.0) + 0.01)
            await asyncio.sleep(wait)
