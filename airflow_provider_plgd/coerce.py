"""Argument coercion: the one home of the helpers that turn a task argument, a rendered template,
a DAG param or an environment variable into a bool, an int, seconds or a list of strings.

A templated field renders to a string unless the DAG renders native objects, and a DAG param may
arrive as JSON text; these helpers accept both forms. Each raises ``ValueError`` naming ``what``
and the value. Pure Python (no Airflow), so every module can use them.
"""

from __future__ import annotations

import ast
from typing import Any

__all__ = ["as_list", "non_negative_seconds", "parse_bool", "positive_int", "token_list"]


def parse_bool(value: Any, what: str) -> bool:
    """A bool from a bool or a rendered template or DAG param (``"True"``/``"false"``/``"1"``/``"0"``).

    :raises ValueError: anything else (names ``what`` and the value).
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", "", "none"):
        return False
    raise ValueError(f"{what} must be true or false, got {value!r}")


def as_list(value: Any, what: str) -> list[str]:
    """A non-empty list from a list, a single string, or a rendered list (``"['a', 'b']"``, without
    native rendering).

    :raises ValueError: empty, or not a list (names ``what`` and the value).
    """
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            value = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise ValueError(f"{what} must be a list of strings, got {value!r}") from None
    elif isinstance(value, str):
        value = [value]
    if not value or not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} must be a non-empty list, got {value!r}")
    return [v for v in value]


def token_list(value: Any, what: str) -> list[str]:
    """A DAG param of owner IDs or event types as a list (checked by ``fetch.selection.Selection.of``).

    A single string is one value (not a list of characters); ``""``/``None``/``[]`` give ``[]``.

    :raises ValueError: a param that is neither a string nor a list (names ``what`` and the value).
    """
    if isinstance(value, str):
        return [value] if value else []
    if value is None or isinstance(value, (list, tuple)):
        return list(value or [])
    raise ValueError(f"{what} param must be a list of strings, got {value!r}")


def positive_int(value: Any, what: str) -> int:
    """An int >= 1 from an int or its text (a bool is refused).

    :raises ValueError: anything else (names ``what`` and the value).
    """
    try:
        if isinstance(value, bool):
            raise ValueError
        number = int(str(value).strip()) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a positive integer, got {value!r}") from None
    if number < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return number


def non_negative_seconds(value: Any, what: str) -> float:
    """A finite number of seconds >= 0 from a number or its text (a bool is refused).

    :raises ValueError: anything else, NaN or infinite (names ``what`` and the value).
    """
    try:
        if isinstance(value, bool):
            raise ValueError
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number of seconds >= 0, got {value!r}") from None
    if not 0 <= seconds < float("inf"):  # also NaN
        raise ValueError(f"{what} must be a number of seconds >= 0, got {value!r}")
    return seconds
