"""The retention rule: refuse a batch whose messages the stream no longer holds.

A stream's limits (``max_age``, ``max_msgs``, ``max_bytes``) or a purge remove its oldest
messages; a fetch that reaches an interval after that would commit a short batch. The rule below
tells from the stream state alone whether messages of the bounds may be gone (docs/reliability.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_plgd.exceptions import MessagesExpiredError
from airflow_provider_plgd.jetstream.api import StreamState
from airflow_provider_plgd.times import ns_to_rfc3339, parse_rfc3339_ns


def check_retained(state: StreamState | Mapping[str, Any], stream: str, bounds: Mapping[str, Any], *,
                   when: str) -> None:
    """Fail when the stream no longer holds every message of ``bounds`` (time or seq bounds).

    Rule (``state`` = the ``state`` of ``$JS.API.STREAM.INFO``: ``first_seq``, ``first_ts``,
    ``last_ts``, ``messages``): nothing was removed while ``first_seq <= 1``. Otherwise the
    sequences ``1 .. first_seq - 1`` are gone, and their server times are at most ``first_ts``
    (the oldest retained message; ``last_ts`` when the stream is empty). So

    * time bounds ``[start, end)``: messages may be missing when ``start < first_ts`` (or
      ``start <= last_ts`` for an empty stream): the time range ``[start, min(end, first_ts))``,
      among sequences ``1 .. first_seq - 1`` (conservative: the removed messages may all have
      been older than ``start``, which the stream can no longer tell);
    * sequence bounds ``[start_seq, end_seq]``: missing exactly when ``start_seq < first_seq``:
      sequences ``start_seq .. min(end_seq, first_seq - 1)``.

    :param state: the stream state (``jetstream.api.StreamState``, or its dict as in ``JetStreamHook.astream_info``).
    :param stream: the stream name (for the message).
    :param bounds: the operator's bounds (``kind`` ``"time"`` with ``start_ns``/``end_ns``, or
        ``"seq"`` with ``start_seq``/``end_seq``); other kinds are not checked.
    :param when: ``"before the fetch"`` / ``"during the fetch"``, for the message.
    :raises MessagesExpiredError: messages of the bounds may have been removed.
    """
    if not isinstance(state, StreamState):
        state = StreamState.from_dict(state)
    first_seq = int(state.first_seq or 0)
    if first_seq <= 1 or bounds.get("kind") not in ("time", "seq"):
        return
    removed_last = first_seq - 1
    fix = ("the stream's retention (max_age, max_msgs, max_bytes) removed them, or it was purged; "
           "re-publish the range or accept the gap by fetching later bounds; a retry fails the same way")
    if bounds["kind"] == "seq":
        start_seq, end_seq = int(bounds["start_seq"]), int(bounds["end_seq"] or removed_last)
        if start_seq >= first_seq:
            return
        last_missing = min(end_seq, removed_last)
        raise MessagesExpiredError(
            f"stream {stream!r} no longer holds stream sequences {start_seq}..{last_missing} of the requested "
            f"range [{start_seq}, {end_seq}] (noticed {when}): its first retained sequence is {first_seq}; "
            f"nothing was committed. {fix}",
            stream=stream, first_seq=first_seq, missing_first_seq=start_seq, missing_last_seq=last_missing,
        )
    start_ns, end_ns = int(bounds["start_ns"]), int(bounds["end_ns"])
    messages = int(state.messages or 0)
    if messages > 0:
        horizon = parse_rfc3339_ns(state.first_ts)
        if horizon is None or start_ns >= horizon:
            return
        oldest = f"its oldest retained message (seq {first_seq}) is from {ns_to_rfc3339(horizon)}"
    else:
        horizon = parse_rfc3339_ns(state.last_ts)
        if horizon is None or start_ns > horizon:
            return
        horizon += 1  # the last removed message itself may be in the interval
        oldest = f"it is empty, and its last message (seq {removed_last}) was from {ns_to_rfc3339(horizon - 1)}"
    missing_end = min(end_ns, horizon)
    raise MessagesExpiredError(
        f"stream {stream!r} no longer holds every message of the interval [{ns_to_rfc3339(start_ns)}, "
        f"{ns_to_rfc3339(end_ns)}) (noticed {when}): {oldest}, and stream sequences 1..{removed_last} "
        f"were removed, so messages from [{ns_to_rfc3339(start_ns)}, {ns_to_rfc3339(missing_end)}) "
        f"may be missing; nothing was committed. {fix}",
        stream=stream, first_seq=first_seq, missing_first_seq=1, missing_last_seq=removed_last,
        missing_start_ns=start_ns, missing_end_ns=missing_end,
    )
