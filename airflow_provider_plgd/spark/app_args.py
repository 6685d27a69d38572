"""The three applications' command lines: argparse pieces, and the frozen values they are parsed
into once (:class:`DecodeArgs`, :class:`DedupeArgs`, :class:`RebuildArgs`; the jobs take these,
never an ``argparse.Namespace``)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NoReturn, TypedDict

from airflow_provider_plgd import times
from airflow_provider_plgd.tables.layout import Layout, validate_partition_value


@dataclass(frozen=True)
class AppArgs:
    """What every application gets.

    :param layout: the storage root (``--root``, normalised once here: ``Layout.of``).
    :param interval_id: ``--interval-id``, checked to be safe in a path.
    :param summary_path: ``--summary-path`` or None (``layout.run_summary``).
    :param log_level: ``--log-level``.
    """

    layout: Layout
    interval_id: str
    summary_path: str | None
    log_level: str


@dataclass(frozen=True)
class DecodeArgs(AppArgs):
    """``decode_events``'s arguments. ``owners`` / ``event_types``: None means all (never empty)."""

    stream: str
    owners: tuple[str, ...] | None
    event_types: tuple[str, ...] | None
    ledger: bool
    max_content_bytes: int


@dataclass(frozen=True)
class DedupeArgs(AppArgs):
    """``dedupe_events``'s arguments. ``previous_intervals``: None means the last ``lookback_intervals``."""

    lookback_intervals: int
    previous_intervals: tuple[str, ...] | None


@dataclass(frozen=True)
class RebuildArgs(AppArgs):
    """``rebuild_snapshots``'s arguments.

    :param interval: the time interval of ``interval_id`` (its end is the snapshot time, ns).
    :param snapshots: where the snapshot tables are (``--snapshots-root``, default the ``layout``).
    """

    interval: times.Interval
    snapshots: Layout
    buckets: int
    vacuum_retention_hours: int

    @property
    def snapshot_time(self) -> int:
        """The snapshot time: the end of the interval, unix ns."""
        return self.interval.end_ns


def _refuse(parser: argparse.ArgumentParser, err: Exception) -> NoReturn:
    parser.error(str(err))


class CommonFields(TypedDict):
    """The keyword arguments of :class:`AppArgs` (:func:`common_args`)."""

    layout: Layout
    interval_id: str
    summary_path: str | None
    log_level: str


def common_args(parser: argparse.ArgumentParser, namespace: argparse.Namespace) -> CommonFields:
    """The :class:`AppArgs` fields of a parsed command line (``--root`` normalised once).

    :raises SystemExit: (``parser.error``) a root or interval ID that is refused, named.
    """
    try:
        layout = Layout.of(namespace.root)
        interval_id = validate_partition_value(namespace.interval_id, "interval_id")
    except ValueError as err:
        _refuse(parser, err)
    return {"layout": layout, "interval_id": interval_id, "summary_path": namespace.summary_path,
            "log_level": namespace.log_level}


def name_list(value: str) -> list[str]:
    """argparse ``type`` for a comma-separated list: ``"a,b, c"`` -> ``["a", "b", "c"]`` (empties dropped)."""
    return [item.strip() for item in str(value).split(",") if item.strip()]


def flatten_lists(values: Iterable[list[str] | str] | None) -> tuple[str, ...] | None:
    """Flatten an ``action="append"``/``nargs`` list of :func:`name_list` results; None or [] -> None (all)."""
    if not values:
        return None
    flat = tuple(v for group in values for v in (group if isinstance(group, list) else [group]))
    return flat or None


def add_common_args(parser: argparse.ArgumentParser, root_help: str) -> None:
    """Add ``--root`` (required), ``--interval-id`` (required), ``--summary-path`` and ``--log-level``."""
    parser.add_argument("--root", required=True, help=root_help)
    parser.add_argument("--interval-id", required=True,
                        help="staging interval ID (airflow_provider_plgd.times.interval_id)")
    parser.add_argument("--summary-path", default=None,
                        help="where to write the run summary JSON "
                             "(default {root}/_runs/{app}/interval={interval_id}.json)")
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
