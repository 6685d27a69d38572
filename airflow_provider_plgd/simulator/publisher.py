"""Publish a simulation to JetStream the way plgd does, and verify the stream got every message.

plgd publishes with core NATS by default (``jetstream: false``, docs/wire-format.md §1.5): plain
``PUB`` with no headers, which a stream bound to ``plgd.>`` stores. We do the same in bulk
(``nc.publish`` with periodic ``flush``), then check with stream info that the stream holds
exactly our messages, so message i has stream sequence ``first_seq + i``.

With ``wait_for_intervals`` every interval k is published inside its wall-clock window
``[start + k*interval, start + (k+1)*interval)`` (same machine clock as the server): publishing
starts at or after the window start, and the stream must have stored the interval's last
message before the window ends, so every JetStream server timestamp falls in its interval.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import nats

from ..exceptions import JetStreamError, PublishError, StreamNotFoundError
from ..jetstream.api import JetStreamApi
from ..jetstream.connection import strip_userinfo
from ..plgd.subjects import subject_matches
from .generator import Simulation

__all__ = ["PublishError", "PublishResult", "acreate_stream", "apublish", "create_stream", "publish"]

_FLUSH_EVERY = 10_000  # messages between flushes (PING/PONG round trips)
_MAX_LAG = 200_000  # messages sent but not yet stored by the stream before we wait
_POLL_SECONDS = 0.005
_STALL_SECONDS = 10


#: The plgd all-in-one bundle's stream (``bundle/jetstream.json``, docs/wire-format.md §1.5), in the
#: JSON form of the JetStream API. Durations are ns; -1 / 0 mean unlimited.
BUNDLE_STREAM_CONFIG: dict[str, Any] = {
    "name": "EVENTS",
    "subjects": ["plgd.>"],
    "retention": "limits",
    "storage": "file",
    "discard": "old",
    "max_age": 0,
    "max_msgs": -1,
    "max_bytes": -1,
    "max_msg_size": -1,
    "max_msgs_per_subject": 0,
    "num_replicas": 1,
    "duplicate_window": 600_000_000_000,
}


@dataclass(frozen=True)
class PublishResult:
    """Where a simulation's messages went: message i of the simulation has stream sequence
    ``first_seq + i`` (verified after publishing). The ground truth of a published simulation
    (``plgd_devtools.ground_truth.GroundTruth.of(sim, result)``) carries these fields too.

    :ivar stream: JetStream stream name.
    :ivar first_seq: stream sequence of the first message.
    :ivar messages: number of messages published.
    :ivar wait_for_intervals: whether publishing respected the interval windows.
    :ivar windows: per interval ``{"interval", "window_start_ns", "window_end_ns",
        "published_from_ns", "stored_by_ns", "messages"}`` (wall clock, unix ns).
    :ivar publish_seconds: wall-clock duration of publishing (s).
    """

    stream: str
    first_seq: int
    messages: int
    wait_for_intervals: bool
    windows: list[dict[str, Any]] = field(default_factory=list)
    publish_seconds: float = 0.0

    @property
    def last_seq(self) -> int | None:
        """Stream sequence of the last message, or None when nothing was published."""
        return self.first_seq + self.messages - 1 if self.messages else None


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="milliseconds")


async def _connect(servers: Sequence[str], connect_options: dict[str, Any] | None):
    options = {"connect_timeout": 5, "allow_reconnect": False, "name": "plgd-simulate"}
    options.update(connect_options or {})
    try:
        return await nats.connect(servers=list(servers), **options)
    except Exception as exc:
        raise PublishError(f"cannot connect to NATS {list(servers)}: {exc or type(exc).__name__}") from exc


def _api(nc: Any, servers: Sequence[str]) -> JetStreamApi:
    """The one JetStream API client (``jetstream/api.py``) over the simulator's connection."""
    return JetStreamApi(nc, ", ".join(strip_userinfo(s) for s in servers))


async def acreate_stream(*, servers: Sequence[str], stream: str = "EVENTS",
                         connect_options: dict[str, Any] | None = None) -> bool:
    """Create ``stream`` with the plgd bundle settings unless it exists (docs/wire-format.md §1.5;
    :data:`BUNDLE_STREAM_CONFIG`: subjects ``plgd.>``, limits retention, file
    storage, discard old, duplicate window 10 min), through the JetStream API
    ``$JS.API.STREAM.CREATE.<stream>``. Returns True if created, False if it already existed.

    :raises PublishError: cannot connect, or the server refused the stream.
    """
    nc = await _connect(servers, connect_options)
    try:
        api = _api(nc, servers)
        try:
            await api.stream_info(stream)
            return False
        except StreamNotFoundError:
            pass
        try:
            await api.create_stream({**BUNDLE_STREAM_CONFIG, "name": stream})
        except JetStreamError as exc:
            raise PublishError(f"cannot create stream {stream!r}: {exc}") from exc
        return True
    finally:
        await nc.close()


def create_stream(*, servers: Sequence[str], stream: str = "EVENTS",
                  connect_options: dict[str, Any] | None = None) -> bool:
    """Sync wrapper of :func:`acreate_stream`."""
    return asyncio.run(acreate_stream(servers=servers, stream=stream, connect_options=connect_options))


async def _stored_last_seq(api: JetStreamApi, stream: str) -> int:
    return int((await api.stream_info(stream))["state"]["last_seq"])


async def _wait_stored(api: JetStreamApi, stream: str, last_seq: int, deadline_ns: int, what: str) -> int:
    """Poll stream info until the stream's last sequence reaches ``last_seq``; return the time.
    Fails at ``deadline_ns``, or when the sequence stops advancing for ``_STALL_SECONDS`` (the
    server did not store some messages)."""
    progress, progress_at = -1, time.time_ns()
    while True:
        current = await _stored_last_seq(api, stream)
        now = time.time_ns()
        if now >= deadline_ns:  # also when all is stored, but only now: too late for the window
            if current >= last_seq:
                raise PublishError(f"{what}: stream {stream!r} stored up to sequence {last_seq} only at "
                                   f"{_iso(now)}, after {_iso(deadline_ns)}")
            raise PublishError(
                f"{what}: stream {stream!r} has stored up to sequence {current}, expected {last_seq} "
                f"by {_iso(deadline_ns)}"
            )
        if current >= last_seq:
            return now
        if current != progress:
            progress, progress_at = current, now
        elif now - progress_at > _STALL_SECONDS * 1e9:
            raise PublishError(
                f"{what}: stream {stream!r} stopped at sequence {current} for {_STALL_SECONDS} s, expected "
                f"{last_seq}: {last_seq - current} messages were not stored (stream limits, or lost by the server)"
            )
        await asyncio.sleep(_POLL_SECONDS)


async def apublish(sim: Simulation, *, servers: Sequence[str], stream: str = "EVENTS",
                   wait_for_intervals: bool = True, connect_options: dict[str, Any] | None = None) -> PublishResult:
    """Publish every message of ``sim`` in order with core NATS and verify the stream.

    :param servers: NATS URLs (``nats://host:port``).
    :param stream: the JetStream stream that captures ``plgd.>`` (must exist; see ``create_stream``).
    :param wait_for_intervals: publish interval k only inside its wall-clock window (see the
        module docstring); the config's ``start_time_ns`` must then be in the future or inside
        interval 0. Without it, everything is published at once.
    :param connect_options: extra ``nats.connect`` keyword arguments (credentials, TLS).
    :returns: the :class:`PublishResult`: ``first_seq`` and the per-interval windows.
    :raises PublishError: cannot connect; stream missing or not bound to the subjects; an
        interval window already over or overflowed (its messages were not all stored before its
        end); the stream holds other than exactly our messages afterwards (another publisher,
        limits discarding messages, lost messages); a spot check of stored bytes failed.
    """
    log = sim.messages
    n = len(log)
    bounds = sim.interval_bounds()
    ranges = log.interval_ranges(sim.config.intervals)
    subjects, payloads = log.subjects, log.data
    nc = await _connect(servers, connect_options)
    t0 = time.perf_counter()
    windows: list[dict[str, Any]] = []
    try:
        api = _api(nc, servers)
        try:
            info = await api.stream_info(stream)
        except StreamNotFoundError:
            raise PublishError(
                f"stream {stream!r} does not exist on {list(servers)}; create it (plgd-simulate --create-stream)"
            ) from None
        bound = info["config"].get("subjects") or []
        if n and not any(subject_matches(f, subjects[0]) for f in bound):
            raise PublishError(
                f"stream {stream!r} (subjects {bound}) does not capture {subjects[0]!r}; "
                "it must be bound to 'plgd.>'"
            )
        before_msgs, before_last = info["state"]["messages"], info["state"]["last_seq"]
        first_seq = before_last + 1
        for k, idx in enumerate(ranges):
            start_ns, end_ns = bounds[k]
            if wait_for_intervals:
                now = time.time_ns()
                if now >= end_ns:
                    raise PublishError(
                        f"interval {k} window [{_iso(start_ns)}, {_iso(end_ns)}) is already over "
                        f"(now {_iso(now)}); generate with a start_time_ns in the future, or publish with "
                        "wait_for_intervals=False (--no-wait)"
                    )
                if now < start_ns:
                    await asyncio.sleep(max(0.0, (start_ns - now) / 1e9 - 0.002))
                    while time.time_ns() < start_ns:
                        await asyncio.sleep(0.0002)
            published_from = time.time_ns()
            sent = idx.start
            for i in idx:
                await nc.publish(subjects[i], payloads[i])
                sent += 1
                if sent % _FLUSH_EVERY == 0:
                    await nc.flush()
                    if (first_seq + sent - 1) - await _stored_last_seq(api, stream) > _MAX_LAG:
                        await _wait_stored(api, stream, first_seq + sent - 1 - _MAX_LAG // 2,
                                           time.time_ns() + 60_000_000_000, f"interval {k}")
            await nc.flush()
            deadline = end_ns if wait_for_intervals else time.time_ns() + 120_000_000_000
            stored_by = await _wait_stored(
                api, stream, first_seq + idx.stop - 1, deadline,
                f"interval {k} overflowed its window [{_iso(start_ns)}, {_iso(end_ns)}) ({len(idx)} messages; "
                "use longer intervals or fewer messages)" if wait_for_intervals else f"interval {k}",
            ) if len(idx) else time.time_ns()
            windows.append({"interval": k, "window_start_ns": start_ns, "window_end_ns": end_ns,
                            "published_from_ns": published_from, "stored_by_ns": stored_by,
                            "messages": len(idx)})
        state = (await api.stream_info(stream))["state"]
        expected_last = first_seq + n - 1
        if state["last_seq"] != expected_last:
            raise PublishError(
                f"stream {stream!r} last sequence is {state['last_seq']}, expected {expected_last}: "
                f"{state['last_seq'] - expected_last:+d} messages from elsewhere or lost; "
                "stream sequences cannot be attributed (publish into a stream nothing else writes to)"
            )
        if state["messages"] - before_msgs != n:
            raise PublishError(
                f"stream {stream!r} gained {state['messages'] - before_msgs} messages, expected {n} "
                "(stream limits discarding messages?)"
            )
        for i in sorted({0, n // 2, n - 1}) if n else ():
            msg = await api.get_message(stream, first_seq + i)
            if msg.subject != subjects[i] or (msg.data or b"") != payloads[i]:
                raise PublishError(
                    f"stream {stream!r} sequence {first_seq + i} holds {msg.subject!r}, expected message {i} "
                    f"{subjects[i]!r} with the same bytes"
                )
    finally:
        await nc.close()
    return PublishResult(stream=stream, first_seq=first_seq, messages=n, wait_for_intervals=wait_for_intervals,
                         windows=windows, publish_seconds=time.perf_counter() - t0)


def publish(sim: Simulation, *, servers: Sequence[str], stream: str = "EVENTS", wait_for_intervals: bool = True,
            connect_options: dict[str, Any] | None = None) -> PublishResult:
    """Sync wrapper of :func:`apublish` (same parameters, result and errors). Raises
    RuntimeError if called from a running event loop (use ``await apublish(...)`` there)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(apublish(sim, servers=servers, stream=stream, wait_for_intervals=wait_for_intervals,
                                    connect_options=connect_options))
    raise RuntimeError("publish() cannot run inside an event loop; use 'await apublish(...)'")
