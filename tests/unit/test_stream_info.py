"""The typed stream info (``jetstream.stream_info.StreamInfo``) built from a ``$JS.API.STREAM.INFO``
answer, and the completeness rule judging it the same as the answer's dict."""

from __future__ import annotations

import pytest

from airflow_provider_plgd.exceptions import JetStreamAPIError
from airflow_provider_plgd.jetstream.api import StreamState
from airflow_provider_plgd.jetstream.completeness import judge_interval, upstreams
from airflow_provider_plgd.jetstream.stream_info import SourceLink, StreamInfo
from tests.unit.test_completeness import END, S, info, up

ANSWER = {
    "config": {"name": "EVENTS", "subjects": ["plgd.>"], "retention": "limits"},
    "created": "2026-01-01T00:00:00Z", "ts": "2026-03-01T11:00:05Z",
    "state": {"messages": 9, "bytes": 900, "first_seq": 3, "last_seq": 11, "first_ts": "2026-03-01T10:00:00Z",
              "last_ts": "2026-03-01T10:59:00Z", "num_deleted": 0, "consumer_count": 2},
    "mirror": {"name": "HUB", "external": {"api": "$JS.hub.API"}, "lag": 4, "active": 2 * S,
               "error": {"code": 503, "description": "no responders"}},
    "sources": [{"name": "B", "lag": 0, "active": -1}, None],
}


def test_the_answer_becomes_the_fields_used():
    got = StreamInfo.from_api(ANSWER)
    assert got == StreamInfo(
        name="EVENTS", subjects=("plgd.>",), created="2026-01-01T00:00:00Z", server_time="2026-03-01T11:00:05Z",
        state=StreamState(messages=9, bytes=900, first_seq=3, last_seq=11, first_ts="2026-03-01T10:00:00Z",
                          last_ts="2026-03-01T10:59:00Z", num_deleted=0),
        links=(SourceLink("mirror", "HUB", "$JS.hub.API", 4, 2 * S, "no responders"),
               SourceLink("source", "B", None, 0, None, None)))
    assert got.server_time_ns == 1_772_362_805 * S
    assert StreamInfo.of(got) is got and StreamInfo.of(ANSWER) == got
    bare = StreamInfo.from_api({"state": {}})
    assert (bare.name, bare.subjects, bare.server_time_ns, bare.links, bare.state.head) == (None, (), None, (), 0)


@pytest.mark.parametrize("answer", [
    info(END + 20 * S, sources=[up("A", active_s=0.5), up("B", active_s=-1), up("C", lag=7)]),
    info(END + 95 * S, mirror=up(active_s=95, error={"code": 503, "description": "no responders"})),
    info(END - S, last_seq=0),
    info(END + S, last_ts=END + S),
])
def test_completeness_judges_the_typed_info_as_the_answer(answer):
    typed = StreamInfo.from_api(answer)
    assert judge_interval(typed, end_ns=END, settle_seconds=10, source_wait_seconds=30) == \
        judge_interval(answer, end_ns=END, settle_seconds=10, source_wait_seconds=30)
    assert upstreams(typed) == upstreams(answer)


def test_an_upstream_without_server_time_is_refused():
    with pytest.raises(JetStreamAPIError, match="no server time"):
        upstreams(StreamInfo.from_api({"state": {}, "mirror": {"name": "HUB", "lag": 0}}))
