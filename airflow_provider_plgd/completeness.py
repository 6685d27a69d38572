"""Is a data interval complete in the stream? Judged on the NATS server's clock, never the worker's.

An interval ``[start, end)`` (bounds on the JetStream server timestamp of each message) is
complete when no message with a server timestamp before ``end`` can still be stored:

* the stream holds a message whose server timestamp is at or after ``end`` (``state.last_ts`` of
  ``$JS.API.STREAM.INFO``; any subject): JetStream assigns the timestamp when it stores a
  message, in stream-sequence order, so every message stored later is at or after ``end`` too;
* or the server's own time is at or after ``end + settle_seconds`` (``ts`` of the same answer:
  "TimeStamp indicates when the info was gathered", ``StreamInfo.TimeStamp`` in nats-server
  ``server/stream.go``, sent since nats-server 2.10). On a single server ``settle_seconds`` 0 is
  enough (everything stored from then on is stamped later); the margin covers clock differences
  between the servers of a cluster (the stream leader stamps messages; a leader change moves
  that to another server's clock).

A publisher's clock does not matter (the server stamps messages), nor does the worker's or the
triggerer's: both rules use only values the server sent. Used by the interval-complete sensor,
its trigger, and the fetch operator (which refuses to commit a time-bounded batch of an
incomplete interval). Source: ``docs/reliability.md`` ("Complete intervals").
"""

from __future__ import annotations

from typing import Any

from airflow_provider_plgd.times import parse_rfc3339_ns

__all__ = ["check_settle_seconds", "interval_status", "require_interval_complete", "server_time_ns"]


def check_settle_seconds(value: Any) -> float:
    """Return ``value`` as seconds (float >= 0).

    :raises ValueError: not a number, or negative (the message names the value).
    """
    try:
        if isinstance(value, bool):
            raise ValueError
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"settle_seconds must be a number of seconds >= 0, got {value!r}") from None
    if not seconds >= 0:  # also NaN
        raise ValueError(f"settle_seconds must be a number of seconds >= 0, got {value!r}")
    return seconds


def server_time_ns(info: dict[str, Any]) -> int:
    """The server's time (unix ns) from a ``$JS.API.STREAM.INFO`` answer (its ``ts`` field).

    :raises JetStreamAPIError: the answer has no ``ts`` (nats-server older than 2.10).
    """
    from airflow_provider_plgd.exceptions import JetStreamAPIError

    ts = parse_rfc3339_ns(info.get("ts"))
    if ts is None:
        raise JetStreamAPIError(
            "the JetStream stream info answer carries no server time ('ts'); nats-server 2.10 or newer is "
            "needed to judge interval completeness on the server's clock (upgrade the server)"
        )
    return ts


def interval_status(info: dict[str, Any], *, end_ns: int, settle_seconds: float) -> dict[str, Any]:
    """Judge the interval ending at ``end_ns`` from one ``$JS.API.STREAM.INFO`` answer.

    :param info: the stream info dict (``ts``, ``state.last_ts``, ``state.last_seq``).
    :param end_ns: exclusive interval end, unix ns (server time).
    :param settle_seconds: seconds (>= 0) after ``end_ns`` on the server's clock after which the
        interval counts as complete without a newer message.
    :return: ``{"complete": bool, "reason": "newer_message" | "settled" | None, "end_ns",
        "server_time_ns", "last_ts_ns" (None for a stream that never held a message),
        "settle_seconds"}``.
    :raises JetStreamAPIError: no server time in ``info`` (see :func:`server_time_ns`).
    """
    end_ns = int(end_ns)
    settle = check_settle_seconds(settle_seconds)
    now = server_time_ns(info)
    state = info.get("state") or {}
    last_ts = parse_rfc3339_ns(state.get("last_ts")) if int(state.get("last_seq") or 0) > 0 else None
    if last_ts is not None and last_ts >= end_ns:
        reason = "newer_message"
    elif now >= end_ns + int(settle * 1e9):
        reason = "settled"
    else:
        reason = None
    return {"complete": reason is not None, "reason": reason, "end_ns": end_ns, "server_time_ns": now,
            "last_ts_ns": last_ts, "settle_seconds": settle}


def require_interval_complete(info: dict[str, Any], stream: str, bounds: dict[str, Any],
                              settle_seconds: Any) -> dict[str, Any]:
    """Fail unless the time bounds ``bounds`` (``start_ns``, ``end_ns``) are complete (see the module).

    :param info: the stream info dict taken before the fetch reads.
    :param stream: the stream name, for the message.
    :param bounds: the fetch operator's time bounds.
    :param settle_seconds: seconds (>= 0), see :func:`interval_status`.
    :return: the :func:`interval_status` dict (complete).
    :raises IntervalNotCompleteError: not complete on the server's clock; names the interval,
        the server's time, the stream's last message time and the fix.
    :raises ValueError: bad ``settle_seconds``.
    """
    from airflow_provider_plgd import times
    from airflow_provider_plgd.exceptions import IntervalNotCompleteError

    status = interval_status(info, end_ns=int(bounds["end_ns"]), settle_seconds=settle_seconds)
    if status["complete"]:
        return status
    start_ns, end_ns, now = bounds.get("start_ns"), status["end_ns"], status["server_time_ns"]
    settle, last_ts = status["settle_seconds"], status["last_ts_ns"]
    last = f"its last message is from {times.ns_to_rfc3339(last_ts)}" if last_ts is not None else "it is empty"
    start = times.ns_to_rfc3339(start_ns) if start_ns is not None else "?"
    raise IntervalNotCompleteError(
        f"interval [{start}, {times.ns_to_rfc3339(end_ns)}) of stream {stream!r} is not complete on the NATS "
        f"server's clock: the server's time is {times.ns_to_rfc3339(now)} "
        f"({(end_ns + int(settle * 1e9) - now) / 1e9:.3f} s before end + settle_seconds={settle:g}), and "
        f"{last}, before the end; messages of the interval may still arrive, so nothing was committed. "
        "Retry after the interval's end on the server's clock (the task's retries do), wait with "
        "JetStreamIntervalCompleteSensor first, or check the worker's clock: the data interval was "
        "probably judged complete on a clock ahead of the NATS server's",
        stream=stream, start_ns=start_ns, end_ns=end_ns, server_time_ns=now, last_ts_ns=last_ts,
        settle_seconds=settle,
    )
