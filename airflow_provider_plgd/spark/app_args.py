"""argparse pieces shared by the three applications' command lines."""

from __future__ import annotations

import argparse
from typing import Iterable

from airflow_provider_plgd import times


def name_list(value: str) -> list[str]:
    """argparse ``type`` for a comma-separated list: ``"a,b, c"`` -> ``["a", "b", "c"]`` (empties dropped)."""
    return [item.strip() for item in str(value).split(",") if item.strip()]


def flatten_lists(values: Iterable[list[str] | str] | None) -> list[str] | None:
    """Flatten an ``action="append"``/``nargs`` list of :func:`name_list` results; None or [] -> None."""
    if not values:
        return None
    flat = [v for group in values for v in (group if isinstance(group, list) else [group])]
    return flat or None


def add_interval_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--interval-id`` (required), ``--summary-path`` and ``--log-level``."""
    parser.add_argument("--interval-id", required=True,
                        help="staging interval ID (airflow_provider_plgd.times.interval_id)")
    parser.add_argument("--summary-path", default=None,
                        help="where to write the run summary JSON "
                             "(default {output_root}/_runs/{app}/interval={interval_id}.json)")
    parser.add_argument("--log-level", default="INFO", help="Python log level (default INFO)")


def time_interval(interval_id: str) -> times.Interval:
    """The :class:`~airflow_provider_plgd.times.Interval` of a time ``--interval-id``, checked once where
    the arguments enter: a time interval ID in its one spelling (``times.interval_id``; so also safe
    in a path).

    :raises ValueError: a sequence or durable ID, or not an interval ID in its one spelling.
    """
    window = times.Interval.from_id(interval_id)
    if window.id != interval_id:
        raise ValueError(f"interval ID {interval_id!r} is not in its one spelling {window.id!r}")
    return window
