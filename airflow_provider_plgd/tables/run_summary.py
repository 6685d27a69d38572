"""The ETL run summary: fetch XComs plus the JSON summaries that the Spark applications write.

Each Spark application writes ``{root}/_runs/{app}/interval={interval_id}.json`` (``app`` is
``decode``, ``dedupe`` or ``rebuild``; see ``airflow_provider_plgd.spark.summary``). This module reads them with
fsspec, so the root may be a local path or any fsspec URL.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from airflow_provider_plgd.tables import chain, reconcile
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.tables.storage import to_fs
from airflow_provider_plgd.times import IntervalId, interval_end_epoch

APPS = ("decode", "dedupe", "rebuild")


def read_app_summary(layout: Layout, app: str, interval_id: IntervalId | str) -> dict[str, Any] | None:
    """Read one application's summary; ``None`` when that application has not written one."""
    path = layout.run_summary(app, interval_id)
    fs, fs_path = to_fs(path)
    if not fs.exists(fs_path):
        return None
    with fs.open(fs_path, "r") as fh:
        return json.load(fh)


@dataclass(frozen=True)
class RunSummary:
    """One run's summary: the interval ledger's chain checked, and the Spark applications'
    summaries (:func:`collect_run_summary`); :meth:`as_dict` is the ``summary`` task's XCom.

    :ivar interval_id: the interval. :ivar fetched: messages staged per event type (non-zero).
    :ivar fetched_total: messages staged. :ivar chain: the ledger's numbers (``reconcile.reconcile``).
    :ivar problems: what does not add up. :ivar reconciled: every stage accounted for every message.
    :ivar decode: the decode application's summary (its JSON), or None; ``dedupe``, ``rebuild`` alike.
    :ivar lag_seconds: now minus the interval end (s), or None for a sequence interval.
    :ivar params: the params the run used (``etl.params.run_params_used``), or None.
    :ivar staging_expired: ``{"intervals", "files", "rows", "vacuumed"}`` of the staging expiry, or None.
    """

    interval_id: str
    fetched: dict[str, int]
    fetched_total: int | None
    chain: dict[str, Any]
    problems: tuple[str, ...]
    reconciled: bool
    decode: dict[str, Any] | None
    dedupe: dict[str, Any] | None
    rebuild: dict[str, Any] | None
    lag_seconds: float | None
    params: dict[str, Any] | None = None
    staging_expired: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """``{"interval_id", "fetched", "fetched_total", "chain", "problems" (list), "reconciled",
        "decode", "dedupe", "rebuild", "lag_seconds"}``, plus ``params`` and ``staging_expired``
        with ``params`` (the ``summary`` task's summary)."""
        value: dict[str, Any] = {
            "interval_id": self.interval_id, "fetched": dict(self.fetched), "fetched_total": self.fetched_total,
            "chain": self.chain, "problems": list(self.problems), "reconciled": self.reconciled,
            "decode": self.decode, "dedupe": self.dedupe, "rebuild": self.rebuild, "lag_seconds": self.lag_seconds,
        }
        if self.params is not None:  # the summary task's (etl.summary.summarize_interval)
            value["params"] = self.params
            value["staging_expired"] = self.staging_expired
        return value


def collect_run_summary(layout: Layout, stream: str, interval_id: IntervalId | str) -> RunSummary:
    """Check the interval ledger's chain (``reconcile.reconcile``), with the holes before the
    interval (``chain.holes_before``), and gather the Spark summaries.

    :param layout: the storage root (local path or fsspec URL).
    :param stream: the stream name.
    :param interval_id: the staging interval ID.
    :return: the :class:`RunSummary` (without ``params`` and ``staging_expired``).
    """
    apps = {app: read_app_summary(layout, app, interval_id) for app in APPS}
    holes = [f"interval {h.interval_id} ({h.messages} messages) was never deduplicated"
             for h in chain.holes_before(layout, stream, interval_id)]
    checked = reconcile.reconcile(layout, stream, interval_id, apps, holes)
    interval_end = interval_end_epoch(interval_id)
    return RunSummary(
        interval_id=str(interval_id), fetched=checked["per_event_type"], fetched_total=checked["chain"].get("staged"),
        chain=checked["chain"], problems=tuple(checked["problems"]), reconciled=bool(checked["reconciled"]),
        decode=apps["decode"], dedupe=apps["dedupe"], rebuild=apps["rebuild"],
        lag_seconds=None if interval_end is None else round(time.time() - interval_end, 3))
