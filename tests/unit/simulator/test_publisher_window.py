"""The publisher's window check: messages stored only after their interval's window ended are an
overflow, also when every one of them is stored by the first look (the flow control inside the
publish loop may already have waited for them)."""

from __future__ import annotations

import asyncio
import time

import pytest

from airflow_provider_plgd.exceptions import PublishError
from airflow_provider_plgd.simulator import publisher


class StoredApi:
    """A stream-info answer (the one fake): the stream has stored up to ``last_seq``."""

    def __init__(self, last_seq: int) -> None:
        self.last_seq = last_seq

    async def stream_info(self, stream: str) -> dict:
        return {"state": {"last_seq": self.last_seq}}


def test_all_stored_but_after_the_window_is_an_overflow():
    over = time.time_ns() - 1_000_000  # the window ended 1 ms ago
    with pytest.raises(PublishError, match=r"interval 0 overflowed .* stored up to sequence 5000 only at"):
        asyncio.run(publisher._wait_stored(StoredApi(5000), "EVENTS", 5000, over, "interval 0 overflowed its window"))


def test_all_stored_inside_the_window_returns_the_time():
    before = time.time_ns()
    stored_by = asyncio.run(publisher._wait_stored(StoredApi(10), "EVENTS", 10, before + 60 * 10**9, "interval 0"))
    assert before <= stored_by <= time.time_ns()
