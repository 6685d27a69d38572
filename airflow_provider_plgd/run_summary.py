"""The ETL run summary: fetch XComs plus the JSON summaries that the Spark applications write.

Each Spark application writes ``{root}/_runs/{app}/interval={interval_id}.json`` (``app`` is
``decode``, ``dedupe`` or ``rebuild``; see ``airflow_provider_plgd.spark.summary``). This module reads them with
fsspec, so the root may be a local path or any fsspec URL.
"""

from __future__ import annotations

import json
import time
from typing import Any

from airflow_provider_plgd.layout import Layout
from airflow_provider_plgd.times import interval_end_epoch

APPS = ("decode", "dedupe", "rebuild")


def run_summary_path(root: str | Layout, app: str, interval_id: str) -> str:
    """Return where application ``app`` writes its summary for ``interval_id`` (a path or URL string)."""
    return Layout.at(root).run_summary(app, interval_id)


def read_app_summary(root: str | Layout, app: str, interval_id: str) -> dict[str, Any] | None:
    """Read one application's summary; ``None`` when that application has not written one."""
    path = run_summary_path(root, app, interval_id)
    from airflow_provider_plgd.storage import to_fs

    fs, fs_path = to_fs(path)
    if not fs.exists(fs_path):
        return None
    with fs.open(fs_path, "r") as fh:
        return json.load(fh)


def collect_run_summary(root: str, stream: str, interval_id: str) -> dict[str, Any]:
    """Check the interval ledger's chain (``ledger.reconcile``), with the holes before the
    interval (``chain.holes_before``), and gather the Spark summaries.

    :param root: the storage root (local path or fsspec URL).
    :param stream: the stream name.
    :param interval_id: the staging interval ID.
    :return: ``{"interval_id", "fetched": {event_type: staged count}} (non-zero), "fetched_total", "chain" (the ledger's numbers), "problems" (list of
        str), "reconciled" (bool: every stage accounted for every message), "decode", "dedupe",
        "rebuild" (the apps' summaries or None), "lag_seconds" (now minus the interval end, s)}``.
    """
    from airflow_provider_plgd import chain, ledger

    apps = {app: read_app_summary(root, app, interval_id) for app in APPS}
    holes = [f"interval {h.interval_id} ({h.messages} messages) was never deduplicated"
             for h in chain.holes_before(root, stream, interval_id)]
    checked = ledger.reconcile(root, stream, interval_id, apps, holes)
    interval_end = interval_end_epoch(interval_id)
    return {
        "interval_id": interval_id,
        "fetched": checked["per_event_type"],
        "fetched_total": checked["chain"].get("staged"),
        "chain": checked["chain"],
        "problems": checked["problems"],
        "reconciled": checked["reconciled"],
        **apps,
        "lag_seconds": None if interval_end is None else round(time.time() - interval_end, 3),
    }
