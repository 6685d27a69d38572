"""Sync methods built from async ones: the one helper behind every sync method of the hooks.

``stream_info = blocking(astream_info)`` gives the hook a sync ``stream_info`` that runs
``self.astream_info(...)`` (looked up on the instance, so a subclass or a patched async method is
used) on a private event loop: ``asyncio.run`` for a coroutine, one item at a time
(:func:`iterate_in_loop`) for an async generator. Called from inside a running event loop it
raises ``RuntimeError`` naming the async method to await instead.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

_P = ParamSpec("_P")
_R = TypeVar("_R")
_S = TypeVar("_S")
_T = TypeVar("_T")


def no_running_loop(name: str, owner: str = "JetStreamHook") -> None:
    """Raise ``RuntimeError`` when an event loop runs in this thread (a sync method cannot block it).

    :param name: the sync method's name (the message names ``a{name}`` as the method to await).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(f"{owner}.{name}() is synchronous; inside an event loop use 'await hook.a{name}(...)'")


def iterate_in_loop(agen: AsyncGenerator[_T, None]) -> Iterator[_T]:
    """Iterate the async generator ``agen`` from sync code, one item at a time, on a private event
    loop (none may be running in this thread). Memory stays that of one item; closing this
    generator (or leaving a ``for`` loop) closes ``agen`` (and so deletes its consumer)."""
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                item = loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
            yield item
    finally:
        try:
            loop.run_until_complete(agen.aclose())
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


@overload
def blocking(amethod: Callable[Concatenate[_S, _P], AsyncIterator[_T]]) -> Callable[Concatenate[_S, _P], Iterator[_T]]:
    ...


@overload
def blocking(amethod: Callable[Concatenate[_S, _P], Awaitable[_R]]) -> Callable[Concatenate[_S, _P], _R]:
    ...


def blocking(amethod: Callable[..., Any]) -> Callable[..., Any]:
    """The sync twin of the async method ``amethod`` (named ``a<name>``), to assign as ``<name>``.

    Same arguments, result (an iterator for an async generator) and errors; its docstring points
    to ``amethod``'s.

    :raises TypeError: ``amethod`` is neither a coroutine function nor an async generator function,
        or its name does not start with ``a``.
    """
    aname = getattr(amethod, "__name__", repr(amethod))
    is_gen = inspect.isasyncgenfunction(amethod)
    if not (is_gen or inspect.iscoroutinefunction(amethod)) or not aname.startswith("a") or len(aname) < 2:
        raise TypeError(f"blocking() needs an async method named 'a<name>', got {aname!r}")
    name = aname[1:]
    if is_gen:

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            no_running_loop(name, type(self).__name__)
            return iterate_in_loop(getattr(self, aname)(*args, **kwargs))
    else:

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            no_running_loop(name, type(self).__name__)
            return asyncio.run(getattr(self, aname)(*args, **kwargs))

    functools.update_wrapper(method, amethod)  # inspect.signature shows amethod's
    method.__name__ = name
    method.__qualname__ = amethod.__qualname__[: -len(aname)] + name
    method.__doc__ = f"Sync :meth:`{aname}` (same arguments, result and errors; not inside an event loop)."
    return method
