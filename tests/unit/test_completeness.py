"""The completeness rule of mirrors and sourced streams, on STREAM.INFO answers shaped as nats-server
2.15 sends them (``mirror`` / ``sources``: ``StreamSourceInfo{name, external, lag, active, error}``).
The behaviour against real servers and a cut leafnode: ``tests/integration/test_mirror.py``."""

from __future__ import annotations

import pytest

from airflow_provider_plgd import times
from airflow_provider_plgd.exceptions import IntervalNotCompleteError, StreamSourceStaleError
from airflow_provider_plgd.jetstream.completeness import (
    IntervalStatus,
    Upstream,
    confirm_status,
    judge_interval,
    require_interval_complete,
)

S = 1_000_000_000
END = 1_800_000_000 * S


def info(now_ns: int, *, last_seq: int = 5, last_ts: int = END - S, mirror: dict | None = None,
         sources: list | None = None) -> dict:
    out = {"ts": times.ns_to_rfc3339(now_ns), "state": {"last_seq": last_seq, "last_ts": times.ns_to_rfc3339(last_ts)}}
    if mirror is not None:
        out["mirror"] = mirror
    if sources is not None:
        out["sources"] = sources
    return out


def up(name: str = "EVENTS", *, lag: int = 0, active_s: float = 0.5, error: dict | None = None) -> dict:
    si = {"name": name, "external": {"api": "$JS.hub.API", "deliver": ""}, "lag": lag,
          "active": -1 if active_s < 0 else int(active_s * S)}
    if error:
        si["error"] = error
    return si


@pytest.mark.parametrize(("upstream", "complete"), [
    (up(active_s=0.5), True),  # heard from 0.5 s ago, 9.5 s after end + settle, nothing pending
    (up(active_s=9.0), True),  # last contact 1 s after end + settle
    (up(active_s=11.0), False),  # last contact before end + settle: the link may have been cut since
    (up(active_s=-1), False),  # never in contact
    (up(lag=3, active_s=0.5), False),  # in contact, still 3 messages behind
])
def test_settled_needs_the_mirror_current_after_end_plus_settle(upstream, complete):
    now = END + 20 * S  # settle 10 s: settled on this server's clock since 10 s
    status = judge_interval(info(now, mirror=upstream), end_ns=END, settle_seconds=10)
    assert (status.complete, status.reason) == (complete, "settled" if complete else None)
    assert status.waiting_for == (() if complete else ("EVENTS",))
    assert status.upstreams[0].current is complete and status.upstreams[0].required is True
    assert status.stale is False  # default limit: 1 h


def test_sources_are_reported_but_not_waited_for():
    """A sourced stream stamps each message when it arrives: a late one belongs to a later interval."""
    stream_info = info(END + 20 * S, sources=[up("A", active_s=0.5), up("B", active_s=-1), up("C", lag=7)])
    status = judge_interval(stream_info, end_ns=END, settle_seconds=10, source_wait_seconds=0)
    assert (status.complete, status.reason, status.waiting_for, status.stale) == \
        (True, "settled", (), False)
    assert [(u.kind, u.name, u.current, u.required) for u in status.upstreams] == \
        [("source", "A", True, False), ("source", "B", False, False), ("source", "C", False, False)]


def test_a_newer_message_completes_even_with_the_link_down():
    """The mirror stores the origin's messages in order with the origin's timestamps."""
    status = judge_interval(info(END + S, last_ts=END, mirror=up(active_s=3600)), end_ns=END, settle_seconds=60)
    assert (status.complete, status.reason) == (True, "newer_message")


def test_stale_past_the_limit_names_each_upstream():
    now = END + 100 * S
    stream_info = info(now, mirror=up(active_s=95, error={"code": 503, "description": "no responders"}))
    assert judge_interval(stream_info, end_ns=END, settle_seconds=10, source_wait_seconds=91).stale is False
    status = judge_interval(stream_info, end_ns=END, settle_seconds=10, source_wait_seconds=90)
    assert status.stale is True and status.complete is False
    with pytest.raises(StreamSourceStaleError) as err:
        require_interval_complete(status, "EVENTS_MIRROR", END - 60 * S)
    assert isinstance(err.value, IntervalNotCompleteError)
    assert err.value.upstreams == [{"kind": "mirror", "name": "EVENTS", "api": "$JS.hub.API", "lag": 0,
                                    "active_ns": 95 * S, "contact_ns": END + 5 * S, "error": "no responders"}]
    assert (f"mirror 'EVENTS' via $JS.hub.API: lag 0, last contact {times.ns_to_rfc3339(END + 5 * S)} (95.0 s "
            "before the server's time), error: no responders") in str(err.value)
    with pytest.raises(ValueError, match="source_wait_seconds must be a number of seconds >= 0, got -1"):
        judge_interval(stream_info, end_ns=END, settle_seconds=10, source_wait_seconds=-1)


def test_a_settled_decision_holds_only_if_confirmed():
    """Right after a mirror consumer is re-created, ``active`` is reset before the backlog arrives
    (``lag`` still the old 0): the second reading sees new messages and the decision is withdrawn."""
    now = END + 20 * S
    first = judge_interval(info(now, mirror=up()), end_ns=END, settle_seconds=10)
    assert first.reason == "settled"
    same = judge_interval(info(now + 2 * S, mirror=up()), end_ns=END, settle_seconds=10)
    assert confirm_status(first, same).complete is True
    moved = judge_interval(info(now + 2 * S, last_seq=8, mirror=up()), end_ns=END, settle_seconds=10)
    assert (confirm_status(first, moved).complete, confirm_status(first, moved).reason) == (False, None)
    newer = judge_interval(info(now + 2 * S, last_seq=9, last_ts=END + S, mirror=up()), end_ns=END,
                            settle_seconds=10)
    assert confirm_status(first, newer).reason == "newer_message"
    with pytest.raises(IntervalNotCompleteError, match="a message arrived while the decision was confirmed"):
        require_interval_complete(confirm_status(first, moved), "EVENTS_MIRROR")


def test_a_plain_stream_is_unchanged():
    status = judge_interval(info(END + 10 * S), end_ns=END, settle_seconds=10)
    assert (status.complete, status.reason, status.upstreams) == (True, "settled", ())


def test_the_status_is_a_typed_value_and_a_dict_only_at_the_json_edge():
    """``as_dict`` is JSON (lists, plain values) and ``from_dict`` gives the same value back; a dict
    with a missing or unknown key is refused, naming the keys."""
    import json

    status = judge_interval(info(END + 20 * S, mirror=up(active_s=11.0)), end_ns=END, settle_seconds=10)
    assert isinstance(status, IntervalStatus) and isinstance(status.upstreams[0], Upstream)
    as_json = json.loads(json.dumps(status.as_dict()))
    assert as_json["waiting_for"] == ["EVENTS"] and as_json["upstreams"][0]["contact_ns"] == END + 9 * S
    assert IntervalStatus.from_dict(as_json) == status
    with pytest.raises(ValueError, match=r"needs the keys .*'complete'.* got \['reason'\]"):
        IntervalStatus.from_dict({"reason": None})
    with pytest.raises(ValueError, match="'surprise'"):
        IntervalStatus.from_dict({**as_json, "surprise": 1})
