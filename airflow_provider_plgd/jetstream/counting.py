"""Counting what a stream holds, exactly, on the server: one algorithm for every count.

One role of :class:`~airflow_provider_plgd.hooks.jetstream.JetStreamHook` (the Airflow face;
``acount_interval``, ``acount_ranges`` and ``acount_messages`` call these functions over a
:class:`~airflow_provider_plgd.jetstream.api.JetStreamApi`).

* A time bound becomes a stream sequence: the first sequence stored at or after it, the starting
  sequence of an ephemeral ``by_start_time`` consumer (``delivered.stream_seq + 1``; NATS
  "JetStream consumers": ``DeliverByStartTime``) — :func:`seq_at`.
* The messages matching a filter in ``[b[i], b[i+1])`` are ``num_pending`` of a filtered consumer
  at ``b[i]`` minus that of one at ``b[i+1]``; every boundary is read between two readings at the
  last boundary, until those agree (no matching message arrived in between), so each difference
  is exact; deleted messages are not counted — :func:`count_boundaries`. Cost: one consumer per
  boundary, never one per owner or subject.
* A range is cut into pieces of at most a number of matching messages by equal sequence widths,
  counted as above, cutting again only the pieces still too large, then merging neighbours
  that fit together — :func:`split_range` (the partitions of the Spark data source).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

from airflow_provider_plgd.exceptions.jetstream import JetStreamTimeoutError
from airflow_provider_plgd.jetstream.api import JetStreamApi, StreamState

#: Seconds after which the server deletes our ephemeral counting consumers if we vanish.
COUNT_INACTIVE_THRESHOLD_S = 10.0
#: Readings of a count before it gives up (``JetStreamTimeoutError``).
MAX_READINGS = 20
#: Stream state fields a count reports (``state`` of ``$JS.API.STREAM.INFO``).
STATE_KEYS = tuple(StreamState().as_dict())


async def seq_at(api: JetStreamApi, stream: str, ns: int | None, default: int) -> int:
    """The first stream sequence stored at or after server time ``ns`` (unix ns; None: ``default``)."""
    if ns is None:
        return default
    made = await api.create_consumer(stream, None, start_ns=ns, inactive_threshold_s=COUNT_INACTIVE_THRESHOLD_S,
                                     kind="count")
    try:
        return int((made.get("delivered") or {}).get("stream_seq") or 0) + 1
    finally:
        await api.delete_consumer(stream, made["name"])


async def count_boundaries(api: JetStreamApi, stream: str, subject_filter: str | Sequence[str] | None,
                           boundaries: Sequence[int]) -> list[int]:
    """Stored messages matching ``subject_filter`` (None: all; a list: any of them) in each
    ``[boundaries[i], boundaries[i+1])`` (see the module docstring).

    :raises JetStreamTimeoutError: matching messages kept arriving (``MAX_READINGS`` readings).
    """
    names: list[str] = []
    try:
        for seq in boundaries:
            made = await api.create_consumer(stream, subject_filter, start_seq=seq,
                                             inactive_threshold_s=COUNT_INACTIVE_THRESHOLD_S, kind="count")
            names.append(made["name"])
        for _ in range(MAX_READINGS):
            before = await api.consumer_pending(stream, names[-1])
            readings = [await api.consumer_pending(stream, name) for name in names[:-1]]
            after = await api.consumer_pending(stream, names[-1])
            if before == after:
                readings.append(after)
                return [max(0, a - b) for a, b in itertools.pairwise(readings)]
        raise JetStreamTimeoutError(
            f"counting {subject_filter or 'all subjects'} of stream {stream} in sequences "
            f"[{boundaries[0]}, {boundaries[-1]}): matching messages kept arriving during {MAX_READINGS} readings"
        )
    finally:
        for name in names:
            await api.delete_consumer(stream, name)


def _range_head(stream: str, info: dict, first: int, stop: int) -> dict[str, Any]:
    """The fields every count reports: the stream, its ``created`` time and state (from ``info``), the range."""
    return {"stream": stream, "created": info.get("created"), "state": StreamState.of_info(info).as_dict(),
            "first_seq": first, "end_seq_exclusive": stop}


async def resolve_range(api: JetStreamApi, stream: str, info: dict, *, start_ns: int | None, end_ns: int | None,
                        start_seq: int | None, end_seq: int | None) -> tuple[int, int]:
    """The stream-sequence range ``[first, stop)`` of the bounds ``[start_ns, end_ns)`` (server time,
    unix ns) and ``[start_seq, end_seq]`` (both given: their intersection), never past the stream's
    last sequence in ``info`` (its ``$JS.API.STREAM.INFO`` answer); ``stop >= first``."""
    last = int((info.get("state") or {}).get("last_seq") or 0)
    first = max(start_seq or 1, await seq_at(api, stream, start_ns, 1))
    stop = min(last + 1, (end_seq + 1) if end_seq is not None else last + 1, await seq_at(api, stream, end_ns, last + 1))
    return first, max(stop, first)


async def split_range(api: JetStreamApi, stream: str, subject_filter: str | Sequence[str] | None, first: int,
                      stop: int, max_messages: int) -> list[tuple[int, int, int]]:
    """Cut ``[first, stop)`` into contiguous ranges that each hold at most ``max_messages`` (>= 1)
    stored messages matching ``subject_filter``, each with its exact count (see the module
    docstring). Counts only fall while a range is cut (JetStream never stores a message at an
    earlier sequence), so the bound holds even if messages are removed meanwhile.

    :return: ``[(first_seq, end_seq_exclusive, count)]`` in sequence order, covering ``[first,
        stop)`` (empty when ``stop <= first``); neighbours are merged while together they hold at
        most ``max_messages``, so a range without a matching message is alone.
    :raises JetStreamTimeoutError: as :func:`count_boundaries`.
    """
    if stop <= first:
        return []
    total = (await count_boundaries(api, stream, subject_filter, [first, stop]))[0]
    ranges = [(first, stop, total)]
    while any(c > max_messages for _, _, c in ranges):
        cuts: set[int] = set()
        for a, b, c in ranges:
            cuts.update((a, b))
            if c > max_messages:
                n = min(b - a, -(-c // max_messages))
                cuts.update(a + (b - a) * i // n for i in range(1, n))
        bounds = sorted(cuts)
        counts = await count_boundaries(api, stream, subject_filter, bounds)
        ranges = [(a, b, c) for (a, b), c in zip(itertools.pairwise(bounds), counts, strict=True)]
    merged: list[tuple[int, int, int]] = []
    for a, b, c in ranges:
        if merged and merged[-1][2] + c <= max_messages:
            merged[-1] = (merged[-1][0], b, merged[-1][2] + c)
        else:
            merged.append((a, b, c))
    return merged


async def count_interval(api: JetStreamApi, stream: str, filters: Sequence[str], *, start_ns: int | None,
                         end_ns: int | None, start_seq: int | None, end_seq: int | None, concurrency: int,
                         with_total: bool) -> dict[str, Any]:
    """The body of ``JetStreamHook.acount_interval`` (arguments checked there; same return value)."""
    info = await api.stream_info(stream)
    first, stop = await resolve_range(api, stream, info, start_ns=start_ns, end_ns=end_ns, start_seq=start_seq,
                                      end_seq=end_seq)
    gate = asyncio.Semaphore(max(1, int(concurrency)))

    async def count(subject_filter: str) -> int:
        if stop <= first:
            return 0
        async with gate:
            return (await count_boundaries(api, stream, subject_filter or None, [first, stop]))[0]

    wanted = list(dict.fromkeys(filters))
    results = await asyncio.gather(count("") if with_total else asyncio.sleep(0), *(count(f) for f in wanted))
    return {
        **_range_head(stream, info, first, stop),
        "total": results[0],
        "counts": dict(zip(wanted, results[1:], strict=True)),
    }


async def count_ranges(api: JetStreamApi, stream: str, read_filters: Sequence[str], *, start_ns: int, end_ns: int,
                       range_messages: int, max_ranges: int, scope_filter: str) -> dict[str, Any]:
    """The body of ``JetStreamHook.acount_ranges`` (arguments checked there; same return value)."""
    info = await api.stream_info(stream)
    first, stop = await resolve_range(api, stream, info, start_ns=start_ns, end_ns=end_ns, start_seq=None,
                                      end_seq=None)
    read: str | list[str] = read_filters[0] if len(read_filters) == 1 else list(read_filters)
    if stop <= first:
        total = scope_total = 0
        counts, cuts = [0], [first, first]
    else:
        whole = await asyncio.gather(count_boundaries(api, stream, None, [first, stop]),
                                     count_boundaries(api, stream, scope_filter, [first, stop]),
                                     count_boundaries(api, stream, read, [first, stop]))
        total, scope_total, read_total = (w[0] for w in whole)
        n = max(1, min(max_ranges, -(-read_total // range_messages), stop - first))
        cuts = [first + (stop - first) * i // n for i in range(n)] + [stop]
        counts = [read_total] if n == 1 else await count_boundaries(api, stream, read, cuts)
    return {
        **_range_head(stream, info, first, stop),
        "total": total,
        "scope_total": scope_total,
        "read_total": sum(counts),
        "ranges": [{"first_seq": a, "end_seq_exclusive": b, "count": c}
                   for (a, b), c in zip(itertools.pairwise(cuts), counts, strict=True)],
    }
