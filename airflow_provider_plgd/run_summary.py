"""The ETL run summary: fetch XComs plus the JSON summaries that the Spark applications write.

Each Spark application writes ``{root}/_runs/{app}/interval={interval_id}.json`` (``app`` is
``decode``, ``dedupe`` or ``rebuild``; see ``spark_apps/common.py``). This module reads them with
fsspec, so the root may be a local path or any fsspec URL.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any

import fsspec

APPS = ("decode", "dedupe", "rebuild")


def run_summary_path(root: str, app: str, interval_id: str) -> str:
    """Return where application ``app`` writes its summary for ``interval_id`` (a path or URL string)."""
    return f"{str(root).rstrip('/')}/_runs/{app}/interval={interval_id}.json"


def read_app_summary(root: str, app: str, interval_id: str) -> dict[str, Any] | None:
    """Read one application's summary; ``None`` when that application has not written one."""
    path = run_summary_path(root, app, interval_id)
    fs, fs_path = fsspec.core.url_to_fs(path)
    if not fs.exists(fs_path):
        return None
    with fs.open(fs_path, "r") as fh:
        return json.load(fh)


def collect_run_summary(root: str, interval_id: str, fetched: list[dict[str, Any]] | dict | None) -> dict[str, Any]:
    """Combine the fetch XComs and the Spark summaries of one interval.

    :param root: the storage root (local path or fsspec URL).
    :param interval_id: the staging interval ID.
    :param fetched: the XCom values of the (mapped) fetch tasks. Each is a summary dict of the
        fetch operator with a ``batches`` list of ``{owner_id, event_type, count, bytes, ...}``, or
        such a batch itself.
    :return: ``{"interval_id", "fetched": {owner: {event_type: count}}, "fetched_total",
        "fetched_bytes", "decode", "dedupe", "rebuild", "reconciled", "lag_seconds"}``;
        ``reconciled`` is True when fetched == decoded + quarantined.
    """
    per_owner: dict[str, dict[str, int]] = defaultdict(dict)
    total = total_bytes = 0
    items = fetched if isinstance(fetched, list) else [fetched] if fetched else []
    for item in items:
        if not item:
            continue
        for batch in item.get("batches", [item]):
            owner, event_type = batch.get("owner_id"), batch.get("event_type")
            count = int(batch.get("count", 0))
            per_owner[str(owner)][str(event_type)] = per_owner[str(owner)].get(str(event_type), 0) + count
            total += count
            total_bytes += int(batch.get("bytes", 0))
    apps = {app: read_app_summary(root, app, interval_id) for app in APPS}
    decode = apps["decode"] or {}
    reconciled = None
    if decode:
        reconciled = total == int(decode.get("decoded", 0)) + int(decode.get("quarantined", 0))
    interval_end = _interval_end_epoch(interval_id)
    return {
        "interval_id": interval_id,
        "fetched": {owner: dict(sorted(counts.items())) for owner, counts in sorted(per_owner.items())},
        "fetched_total": total,
        "fetched_bytes": total_bytes,
        **apps,
        "reconciled": reconciled,
        "lag_seconds": None if interval_end is None else round(time.time() - interval_end, 3),
    }


def _interval_end_epoch(interval_id: str) -> float | None:
    """The end of a time-bounded interval ID (``<start>_<end>``, each ``%Y%m%dT%H%M%S[.%f]Z``) in epoch seconds."""
    from datetime import datetime, timezone

    try:
        end = interval_id.split("_", 1)[1].rstrip("Z")
        fmt = "%Y%m%dT%H%M%S.%f" if "." in end else "%Y%m%dT%H%M%S"
        return datetime.strptime(end, fmt).replace(tzinfo=timezone.utc).timestamp()
    except (IndexError, ValueError):
        return None
