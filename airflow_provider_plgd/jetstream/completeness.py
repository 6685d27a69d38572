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
triggerer's: both rules use only values the server sent.

**Mirrors** (the stream's ``config.mirror``): the stream is a copy of another one, often on
another server across a leafnode or JetStream domain, and keeps its origin's sequences and
timestamps (nats-server ``processInboundMirrorMsg`` stores each message with the origin's
timestamp). While the link is down the mirror's server time passes ``end + settle_seconds``
although messages of the interval still wait on the origin, stamped inside the interval.
STREAM.INFO reports the upstream as ``mirror`` (``StreamSourceInfo{name, external, lag, active,
error}`` in nats-server ``server/stream.go``): ``lag`` is the number of messages the origin still
held after the last one received (from that delivery's ``pending`` count, updated only when a
message arrives: while the link is cut it keeps its last value, usually 0); ``active`` is the time
in ns since anything (a message or the mirror consumer's 1 s idle heartbeat) last arrived from
the origin (-1: never). The ``settled`` rule therefore also needs the mirror to be *current
after the end*:

* ``lag == 0``, ``active >= 0`` and the last contact ``ts - active`` at or after
  ``end + settle_seconds``: the origin was heard from after the end (plus the margin for clock
  differences between the two servers) and had nothing more to send.

``newer_message`` needs no such check: a mirror stores its origin's messages in the origin's
sequence order, so nothing older than a stored message can still arrive.

**Sources** (``config.sources``, reported as ``sources[]``) are listed in the status with the
same ``current`` flag, but the rule does not wait for them: a sourced stream stores each message
with its own server's time when the message arrives (``processInboundSourceMsg`` stores with
timestamp 0, i.e. "now"), so a message delayed by a cut link is stamped after the link returns
and belongs to a later interval, never to one already complete; waiting would not change what
an interval holds.

Right after a mirror consumer is re-created (after a long cut) the server sets ``active`` to 0
before the origin's first message arrives, while ``lag`` is still the old value; one reading can
then look current. :meth:`JetStreamHook.aget_interval_status` therefore confirms a ``settled``
decision on a mirror with a second reading :data:`CONFIRM_SECONDS` later
(:func:`confirm_status`: still complete, and no message arrived in between).

**Limit.** When the server's time passes ``end + settle_seconds + source_wait_seconds`` and the
mirror is still not current, the status says ``stale``: the sensor, the plan and the fetch fail
with :class:`~airflow_provider_plgd.exceptions.StreamSourceStaleError` naming the origin, its API
prefix, its lag and last contact, instead of waiting on a link that may never come back.

Used by the interval-complete sensor, its trigger, the ETL's plan and the fetch operator (which
refuses to commit a time-bounded batch of an incomplete interval), all through
``JetStreamHook.aget_interval_status``, as an :class:`IntervalStatus`. Source: ``docs/reliability.md`` ("Complete intervals").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import MISSING, asdict, dataclass, fields, replace
from typing import Any

from airflow_provider_plgd import times
from airflow_provider_plgd.coerce import non_negative_seconds
from airflow_provider_plgd.exceptions.jetstream import (
    IntervalNotCompleteError,
    JetStreamAPIError,
    StreamSourceStaleError,
)
from airflow_provider_plgd.times import parse_rfc3339_ns

__all__ = [
    "CONFIRM_SECONDS",
    "DEFAULT_SOURCE_WAIT_SECONDS",
    "IntervalStatus",
    "Upstream",
    "check_settle_seconds",
    "check_source_wait_seconds",
    "confirm_status",
    "judge_interval",
    "read_interval_status",
    "require_interval_complete",
    "server_time_ns",
    "upstreams",
]

#: Default seconds, past ``end + settle_seconds`` on the server's clock, to wait for a mirror's
#: link before the interval fails with ``StreamSourceStaleError``.
DEFAULT_SOURCE_WAIT_SECONDS = 3600.0
#: Seconds between the two readings that confirm a ``settled`` decision on a mirror
#: (two of the mirror consumer's 1 s idle heartbeats, ``sourceHealthHB`` in nats-server).
CONFIRM_SECONDS = 2.0


def check_settle_seconds(value: Any) -> float:
    """Return ``value`` as seconds (float >= 0).

    :raises ValueError: not a number, or negative (the message names the value).
    """
    return non_negative_seconds(value, "settle_seconds")


def check_source_wait_seconds(value: Any) -> float:
    """Return ``value`` as seconds (float >= 0); None gives :data:`DEFAULT_SOURCE_WAIT_SECONDS`.

    :raises ValueError: not a number, or negative (the message names the value).
    """
    return DEFAULT_SOURCE_WAIT_SECONDS if value is None else non_negative_seconds(value, "source_wait_seconds")


def server_time_ns(info: dict[str, Any]) -> int:
    """The server's time (unix ns) from a ``$JS.API.STREAM.INFO`` answer (its ``ts`` field).

    :raises JetStreamAPIError: the answer has no ``ts`` (nats-server older than 2.10).
    """
    ts = parse_rfc3339_ns(info.get("ts"))
    if ts is None:
        raise JetStreamAPIError(
            "the JetStream stream info answer carries no server time ('ts'); nats-server 2.10 or newer is "
            "needed to judge interval completeness on the server's clock (upgrade the server)"
        )
    return ts


@dataclass(frozen=True)
class Upstream:
    """A stream feeding this one, from a ``$JS.API.STREAM.INFO`` answer (``mirror`` / ``sources[]``).

    :ivar kind: ``"mirror"`` or ``"source"``. :ivar name: the upstream stream's name.
    :ivar api: the external API prefix (e.g. ``$JS.hub.API``), or None.
    :ivar lag: messages the origin still held after the last one received.
    :ivar active_ns: ns since the last contact (None: never). :ivar contact_ns: server time of the
        last contact (unix ns), or None. :ivar error: the server's description of its error, or None.
    :ivar required: True for a mirror (the ``settled`` rule waits for it; sources: see the module).
    :ivar current: in contact at or after ``end + settle_seconds`` with ``lag`` 0 (set by :func:`judge_interval`).
    """

    kind: str
    name: str | None
    api: str | None
    lag: int
    active_ns: int | None
    contact_ns: int | None
    error: str | None
    required: bool
    current: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (``StreamSourceStaleError.upstreams`` keeps all but
        ``required`` and ``current``)."""
        return asdict(self)


@dataclass(frozen=True)
class IntervalStatus:
    """Is the interval ending at ``end_ns`` complete? One judgement (:func:`judge_interval`) on the
    server's clock; :meth:`as_dict` / :meth:`from_dict` only where it becomes JSON.

    :ivar complete: complete. :ivar reason: ``"newer_message"``, ``"settled"`` or None.
    :ivar end_ns: exclusive interval end (unix ns). :ivar server_time_ns: the server's time of the reading.
    :ivar last_seq: the stream's last sequence. :ivar last_ts_ns: its server time (None: never held a message).
    :ivar settle_seconds: s (>= 0). :ivar source_wait_seconds: s (>= 0), for a mirror not current.
    :ivar upstreams: the streams feeding this one. :ivar waiting_for: names of the required upstreams
        not current (the mirror's origin). :ivar stale: a mirror still not current past the limit.
    :ivar newer_messages: messages of a subject filter at or after the end (the hook's
        ``aget_interval_status``; 0 otherwise).
    """

    complete: bool
    reason: str | None
    end_ns: int
    server_time_ns: int
    last_seq: int
    last_ts_ns: int | None
    settle_seconds: float
    source_wait_seconds: float
    upstreams: tuple[Upstream, ...] = ()
    waiting_for: tuple[str, ...] = ()
    stale: bool = False
    newer_messages: int = 0

    def as_dict(self) -> dict[str, Any]:
        """``{"complete", "reason", "end_ns", "server_time_ns", "last_seq", "last_ts_ns",
        "settle_seconds", "source_wait_seconds", "upstreams": [{...}], "waiting_for": [str],
        "stale", "newer_messages"}`` (JSON)."""
        out = asdict(self)
        out["upstreams"] = [up.as_dict() for up in self.upstreams]
        out["waiting_for"] = list(self.waiting_for)
        return out

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> IntervalStatus:
        """The status of :meth:`as_dict`'s dict.

        :raises ValueError: a field is missing or unknown (names them).
        """
        names = {f.name for f in fields(cls)}
        required = {f.name for f in fields(cls) if f.default is MISSING}
        if not required <= set(value) or not set(value) <= names:
            raise ValueError(f"an interval status needs the keys {sorted(required)} (optional: "
                             f"{sorted(names - required)}), got {sorted(value)}")
        data = dict(value)
        data["upstreams"] = tuple(Upstream(**up) for up in data.get("upstreams") or ())
        data["waiting_for"] = tuple(data.get("waiting_for") or ())
        return cls(**data)


def upstreams(info: dict[str, Any]) -> tuple[Upstream, ...]:
    """The streams feeding this one, from a ``$JS.API.STREAM.INFO`` answer (``mirror``, ``sources``),
    with ``current`` False; empty for a plain stream.

    :raises JetStreamAPIError: an upstream is reported without a server time (see :func:`server_time_ns`).
    """
    found = [("mirror", info["mirror"])] if info.get("mirror") else []
    found += [("source", si) for si in info.get("sources") or [] if si]
    if not found:
        return ()
    now = server_time_ns(info)
    result = []
    for kind, si in found:
        active = si.get("active")
        active_ns = int(active) if isinstance(active, (int, float)) and active >= 0 else None
        error = si.get("error")
        result.append(Upstream(
            kind=kind, name=si.get("name"), api=(si.get("external") or {}).get("api"),
            lag=int(si.get("lag") or 0), active_ns=active_ns,
            contact_ns=now - active_ns if active_ns is not None else None,
            error=(error.get("description") or str(error)) if isinstance(error, dict) else error,
            required=kind == "mirror",
        ))
    return tuple(result)


def judge_interval(info: dict[str, Any], *, end_ns: int, settle_seconds: float,
                   source_wait_seconds: float | None = None) -> IntervalStatus:
    """Judge the interval ending at ``end_ns`` from one ``$JS.API.STREAM.INFO`` answer (rules: the module).

    :param info: the stream info dict (``ts``, ``state.last_ts``, ``state.last_seq``, and
        ``mirror`` / ``sources`` for a stream fed by others).
    :param end_ns: exclusive interval end, unix ns (server time).
    :param settle_seconds: seconds (>= 0) after ``end_ns`` on the server's clock after which the
        interval counts as complete without a newer message (a mirror: current after it).
    :param source_wait_seconds: seconds (>= 0) past ``end_ns + settle_seconds`` after which a
        mirror that is still not current makes the status ``stale`` (None: the default,
        :data:`DEFAULT_SOURCE_WAIT_SECONDS`).
    :raises JetStreamAPIError: no server time in ``info`` (see :func:`server_time_ns`).
    :raises ValueError: bad ``settle_seconds`` or ``source_wait_seconds``.
    """
    end_ns = int(end_ns)
    settle = check_settle_seconds(settle_seconds)
    wait = check_source_wait_seconds(source_wait_seconds)
    now = server_time_ns(info)
    settled_at = end_ns + int(settle * 1e9)
    state = info.get("state") or {}
    last_seq = int(state.get("last_seq") or 0)
    last_ts = parse_rfc3339_ns(state.get("last_ts")) if last_seq > 0 else None
    feeds = tuple(replace(up, current=up.lag == 0 and up.contact_ns is not None and up.contact_ns >= settled_at)
                  for up in upstreams(info))
    waiting = tuple(str(up.name) for up in feeds if up.required and not up.current)
    if last_ts is not None and last_ts >= end_ns:
        reason: str | None = "newer_message"
    elif now >= settled_at and not waiting:
        reason = "settled"
    else:
        reason = None
    stale = reason is None and bool(waiting) and now >= settled_at + int(wait * 1e9)
    return IntervalStatus(complete=reason is not None, reason=reason, end_ns=end_ns, server_time_ns=now,
                          last_seq=last_seq, last_ts_ns=last_ts, settle_seconds=settle, source_wait_seconds=wait,
                          upstreams=feeds, waiting_for=waiting, stale=stale)


def confirm_status(first: IntervalStatus, second: IntervalStatus) -> IntervalStatus:
    """Combine two :func:`judge_interval` readings taken :data:`CONFIRM_SECONDS` apart (see the module).

    A ``settled`` first reading of a mirror holds only when the second reading is
    complete too and the stream stored no message in between (a message that arrived is a sign
    the upstream was still catching up; a newer one completes the interval by itself).

    :return: ``second``, with ``complete`` False and ``reason`` None when the first decision does
        not hold (``stale`` is kept from ``second``).
    """
    if second.reason == "newer_message" or not first.complete:
        return second
    if second.complete and second.last_seq == first.last_seq:
        return second
    return replace(second, complete=False, reason=None)


async def read_interval_status(stream_info: Callable[[], Awaitable[dict[str, Any]]], *, end_ns: int,
                               settle_seconds: float, source_wait_seconds: float | None = None) -> IntervalStatus:
    """Read the stream info with ``stream_info()`` and judge it (:func:`judge_interval`); a
    ``settled`` decision on a mirror is confirmed by a second reading :data:`CONFIRM_SECONDS`
    later (:func:`confirm_status`). Same arguments, return value and errors as :func:`judge_interval`.
    """
    status = judge_interval(await stream_info(), end_ns=end_ns, settle_seconds=settle_seconds,
                            source_wait_seconds=source_wait_seconds)
    if status.reason == "settled" and any(up.required for up in status.upstreams):
        await asyncio.sleep(CONFIRM_SECONDS)
        status = confirm_status(status, judge_interval(await stream_info(), end_ns=end_ns,
                                                       settle_seconds=settle_seconds,
                                                       source_wait_seconds=source_wait_seconds))
    return status


def _upstreams_text(status: IntervalStatus) -> str:
    parts = []
    for up in status.upstreams:
        if up.current or not up.required:
            continue
        contact = (f"last contact {times.ns_to_rfc3339(up.contact_ns)} "
                   f"({(up.active_ns or 0) / 1e9:.1f} s before the server's time)" if up.contact_ns is not None
                   else "never in contact")
        error = f", error: {up.error}" if up.error else ""
        api = f" via {up.api}" if up.api else ""
        parts.append(f"{up.kind} {up.name!r}{api}: lag {up.lag}, {contact}{error}")
    return "; ".join(parts)


def require_interval_complete(status: IntervalStatus, stream: str, start_ns: int | None = None) -> IntervalStatus:
    """Fail unless ``status`` (:func:`read_interval_status`, confirmed) says the interval is complete.

    :param status: the status of the interval, from ``JetStreamHook.aget_interval_status``.
    :param stream: the stream name, for the message.
    :param start_ns: the interval's start (unix ns), for the message; None: unknown.
    :return: ``status`` (complete).
    :raises StreamSourceStaleError: not complete, and the stream is a mirror whose origin is still
        not current past ``end + settle_seconds + source_wait_seconds``; names the origin, its API
        prefix, lag and last contact.
    :raises IntervalNotCompleteError: not complete on the server's clock; names the interval,
        the server's time, the stream's last message time, a mirror not current and the fix.
    """
    if status.complete:
        return status
    end_ns, now = status.end_ns, status.server_time_ns
    settle, last_ts = status.settle_seconds, status.last_ts_ns
    start = times.ns_to_rfc3339(start_ns) if start_ns is not None else "?"
    interval = f"interval [{start}, {times.ns_to_rfc3339(end_ns)}) of stream {stream!r}"
    facts: dict[str, Any] = {"stream": stream, "start_ns": start_ns, "end_ns": end_ns, "server_time_ns": now,
                             "last_ts_ns": last_ts, "settle_seconds": settle}
    if status.stale:
        wait = status.source_wait_seconds
        raise StreamSourceStaleError(
            f"{interval} is not complete: the stream is a mirror, and past end + settle_seconds="
            f"{settle:g} + source_wait_seconds={wait:g} (the server's time is {times.ns_to_rfc3339(now)}) "
            f"{_upstreams_text(status)}; messages of the interval may still wait on the other side of the "
            "link, so nothing was committed. Restore the link (leafnode, domain API, permissions; the "
            "mirror's error above) and run the task again, or raise source_wait_seconds",
            upstreams=[{k: v for k, v in up.as_dict().items() if k not in ("required", "current")}
                       for up in status.upstreams if up.required and not up.current],
            source_wait_seconds=wait, **facts,
        )
    last = f"its last message is from {times.ns_to_rfc3339(last_ts)}" if last_ts is not None else "it is empty"
    before = end_ns + int(settle * 1e9) - now
    when = (f"{before / 1e9:.3f} s before end + settle_seconds={settle:g}" if before > 0
            else f"past end + settle_seconds={settle:g}, but the mirror was not current after it: "
                 f"{_upstreams_text(status) or 'a message arrived while the decision was confirmed'}")
    fix = ("Retry after the interval's end on the server's clock (the task's retries do), wait with "
           "JetStreamIntervalCompleteSensor first, or check the worker's clock: the data interval was probably "
           "judged complete on a clock ahead of the NATS server's" if before > 0 else
           "Retry when the mirror is current (the task's retries do), or wait with "
           "JetStreamIntervalCompleteSensor first")
    raise IntervalNotCompleteError(
        f"{interval} is not complete on the NATS server's clock: the server's time is "
        f"{times.ns_to_rfc3339(now)} ({when}), and {last}, before the end; messages of the interval may still "
        f"arrive, so nothing was committed. {fix}",
        **facts,
    )
