"""The one helper that builds each sync hook method from its async one (``jetstream/blocking.py``)."""

from __future__ import annotations

import asyncio
import inspect
import warnings

import pytest

from airflow_provider_plgd.hooks.jetstream import JetStreamHook
from airflow_provider_plgd.jetstream.blocking import blocking


class Counter:
    def __init__(self) -> None:
        self.closed = False

    async def aadd(self, a: int, *, b: int = 1) -> int:
        await asyncio.sleep(0)
        return a + b

    async def aitems(self, n: int):
        try:
            for i in range(n):
                await asyncio.sleep(0)
                yield i
        finally:
            self.closed = True

    add = blocking(aadd)
    items = blocking(aitems)


class Doubled(Counter):
    async def aadd(self, a: int, *, b: int = 1) -> int:
        return 2 * (a + b)


def test_a_sync_method_runs_the_instances_async_method_with_the_same_arguments():
    assert Counter().add(2, b=5) == 7
    assert Doubled().add(2, b=5) == 14  # looked up on the instance: an override (or a patch) is used
    assert (Counter.add.__name__, Counter.add.__qualname__) == ("add", "Counter.add")
    assert str(inspect.signature(Counter.add)) == "(self, a: 'int', *, b: 'int' = 1) -> 'int'"


def test_a_sync_generator_yields_one_item_at_a_time_and_closing_it_closes_the_async_one():
    counter = Counter()
    items = counter.items(5)
    assert (next(items), next(items)) == (0, 1) and counter.closed is False
    items.close()
    assert counter.closed is True
    assert list(Counter().items(3)) == [0, 1, 2]


def test_inside_an_event_loop_it_names_the_async_method_and_leaves_no_coroutine_behind():
    async def call() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a created, never awaited coroutine would warn
            with pytest.raises(RuntimeError, match=r"Counter\.add\(\) is synchronous; .*'await hook\.aadd\(\.\.\.\)'"):
                Counter().add(1)
            with pytest.raises(RuntimeError, match=r"JetStreamHook\.count_ranges\(\) is synchronous"):
                JetStreamHook().count_ranges(["plgd.>"], start_time=0, end_time=1, range_messages=1, max_ranges=1)

    asyncio.run(call())


def test_only_async_methods_named_a_name_are_accepted():
    async def count() -> int:
        return 1

    def aplain() -> int:
        return 1

    for bad, shown in ((count, "'count'"), (aplain, "'aplain'")):
        with pytest.raises(TypeError, match=f"needs an async method named 'a<name>', got {shown}"):
            blocking(bad)


def test_every_sync_method_of_the_hook_is_built_by_the_helper():
    """Each ``a<name>`` coroutine or async generator of the hook has its sync ``<name>`` twin."""
    pairs: dict[str, str] = {}
    for cls in JetStreamHook.__mro__:
        for name, value in vars(cls).items():
            if name.startswith("a") and (inspect.iscoroutinefunction(value) or inspect.isasyncgenfunction(value)):
                pairs.setdefault(name[1:], name)
    pairs.pop("get_settings")  # the sync lookup is its own (Airflow's sync connection API)
    assert sorted(pairs) == ["count_interval", "count_messages", "count_ranges", "get_interval_status", "get_stream_info",
                             "iter_batches", "list_owners", "list_subjects", "publish",
                             "require_interval_complete", "stream_info"]
    for sync_name, async_name in pairs.items():
        method = getattr(JetStreamHook, sync_name)
        assert method.__wrapped__ is getattr(JetStreamHook, async_name), sync_name
