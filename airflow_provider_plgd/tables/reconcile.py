"""The whole chain of one interval checked against its ledger (:func:`reconcile`, the ``summary``
task): stream = staged + skipped per range; staged = decoded + quarantined; decoded = kept +
duplicates (within the interval + seen before), ID conflicts among the kept; no hole before the
interval. It writes ``summary.json`` beside the ledger records
(:mod:`.ledger`), which :func:`is_reconciled` reads: the rule of the staging expiry
(:func:`expire_staging`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_plgd.exceptions import LedgerError
from airflow_provider_plgd.plgd.event_types import EVENT_TYPES
from airflow_provider_plgd.tables import staging_commits, storage
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.tables.ledger import (
    ALL_OWNERS,
    LEDGER_VERSION,
    SUMMARY_FILE,
    FetchRecord,
    read_records,
    read_summary,
    write_ledger_file,
)
from airflow_provider_plgd.tables.ledger_accounting import staged_counts
from airflow_provider_plgd.times import IntervalId

log = logging.getLogger(__name__)


def selection_text(plan: Mapping[str, Any]) -> dict[str, Any]:
    """What a plan record selected, bounded for logs and XCom: ``{"owners": "all" | [≤ 20 names],
    "owners_count": None (all) | n, "event_types": "all N" | [names], "event_types_count"}``."""
    owners, types = plan.get("owners"), list(plan.get("event_types") or [])
    return {
        "owners": ALL_OWNERS if owners is None else list(owners)[:20],
        "owners_count": None if owners is None else len(owners),
        "event_types": f"all {len(types)}" if set(types) >= set(EVENT_TYPES) else types,
        "event_types_count": len(types),
    }


def is_reconciled(layout: Layout, stream: str, interval_id: IntervalId | str) -> bool:
    """True when the interval's ``summary.json`` says its whole chain reconciled (the interval is
    committed, so its staging may expire: ``staging_commits.expire_intervals``)."""
    summary = read_summary(layout, stream, interval_id)
    return bool(summary and summary.get("reconciled") is True)


def reconcile(layout: Layout, stream: str, interval_id: IntervalId | str, apps: Mapping[str, Mapping[str, Any] | None],
              holes: Sequence[str] = ()) -> dict[str, Any]:
    """Check the whole chain of one interval and write ``summary.json``.

    :param apps: the run summaries of ``decode``, ``dedupe`` and ``rebuild`` (``run_summary``).
    :param holes: one line per earlier interval with messages that is not in the tables
        (``chain.holes_before``): each is a problem.
    A summary written before the plan's ``run_version`` (``written_ms``) is an earlier run's: a
    problem. ``summary.json`` keeps the plan's ``run_version``: the status view tells a summary of
    the newest run from an earlier run's by it.

    :return: ``{"version", "interval_id", "stream", "chain": {...numbers...}, "run_version", "per_event_type":
        {event_type: staged} (non-zero only), "problems": [str], "reconciled": bool}``;
        ``reconciled`` is False when any problem was found (the caller fails the run).
    """
    plan, records = read_records(layout, stream, interval_id)
    if plan is None:
        return {"version": LEDGER_VERSION, "interval_id": str(interval_id), "stream": stream, "chain": {},
                "per_event_type": {}, "reconciled": False,
                "problems": [f"no ledger at {layout.ledger_interval_dir(stream, interval_id)} (the plan task writes it)"]}
    problems: list[str] = []
    try:
        counts = staged_counts(plan, records)
    except LedgerError as exc:
        problems += exc.problems
        counts = {}
    staged = sum(counts.values())
    per_event_type: dict[str, int] = {}
    for (_, event_type), n in sorted(counts.items()):
        per_event_type[event_type] = per_event_type.get(event_type, 0) + n
    current = sorted((r for r in records if isinstance(r, FetchRecord)), key=lambda r: r.range.index)
    skipped: dict[str, int] = {}
    for record in records:
        for reason, n in (record.as_dict().get("skipped") or {}).items():
            skipped[reason] = skipped.get(reason, 0) + int(n)
    # the newest run's summaries only: one written before this run's plan is an earlier run's
    started = plan.run_version
    document = plan.as_dict()  # the numbers summary.json repeats (a plan of an earlier version too)
    current_apps: dict[str, Mapping[str, Any] | None] = dict(apps)
    for app, summary in apps.items():
        written = (summary or {}).get("written_ms")
        if started is not None and written is not None and int(written) < int(started):
            problems.append(f"{app}: the run summary is an earlier run's (written at {int(written)} ms, before this "
                            f"run's plan at {int(started)} ms): this run's {app} did not finish")
            current_apps[app] = None
    apps = current_apps
    decode, dedupe = apps.get("decode") or {}, apps.get("dedupe") or {}
    if document.get("spark_skip") and not decode and not dedupe:
        # an empty interval whose Spark tasks were skipped (etl.spark_skip_reason): nothing to decode
        # or deduplicate, and the fetch must have staged nothing (checked below: 0 = 0)
        decode = {"fetched": 0, "decoded": 0, "quarantined": 0, "per_reason": {}, "skipped": document["spark_skip"]}
        dedupe = {"input": 0, "output": 0, "duplicates": 0, "within_batch_duplicates": 0,
                  "cross_batch_duplicates": 0, "skipped": document["spark_skip"]}
    if not decode and not any(p.startswith("decode:") for p in problems):
        problems.append("decode: no run summary")
    else:
        if int(decode.get("fetched", -1)) != staged:
            problems.append(f"decode read {decode.get('fetched')} staged messages, the fetch staged {staged}")
        if int(decode.get("decoded", 0)) + int(decode.get("quarantined", 0)) != int(decode.get("fetched", -1)):
            problems.append(f"decode: {decode.get('fetched')} read != {decode.get('decoded')} decoded + "
                            f"{decode.get('quarantined')} quarantined")
    problems += [f"the chain has a hole before this interval: {h}" for h in holes]
    if not dedupe and not any(p.startswith("dedupe:") for p in problems):
        problems.append("dedupe: no run summary")
    elif decode:
        if int(dedupe.get("input", -1)) != int(decode.get("decoded", -2)):
            problems.append(f"dedupe read {dedupe.get('input')} events, decode wrote {decode.get('decoded')}")
        if int(dedupe.get("output", 0)) + int(dedupe.get("duplicates", 0)) != int(dedupe.get("input", -1)):
            problems.append(f"dedupe: {dedupe.get('input')} read != {dedupe.get('output')} kept + "
                            f"{dedupe.get('duplicates')} duplicates dropped")
        if (int(dedupe.get("within_batch_duplicates", 0)) + int(dedupe.get("cross_batch_duplicates", 0))
                != int(dedupe.get("duplicates", 0))):
            problems.append(f"dedupe: {dedupe.get('duplicates')} duplicates dropped != "
                            f"{dedupe.get('within_batch_duplicates')} within the interval + "
                            f"{dedupe.get('cross_batch_duplicates')} seen before")
        # rows kept although their message ID was taken by another content: part of the kept rows
        if not 0 <= int(dedupe.get("id_conflicts", 0)) <= int(dedupe.get("output", 0)):
            problems.append(f"dedupe: {dedupe.get('id_conflicts')} ID conflicts kept, not within the "
                            f"{dedupe.get('output')} rows kept")
    if not document.get("spark_skip") and not apps.get("rebuild") and not any(p.startswith("rebuild:") for p in problems):
        problems.append("rebuild: no run summary (no snapshot includes this interval)")
    chain = {
        "holes": list(holes),
        "stream_total": document["total"],
        "fetch_ranges": len(document.get("ranges") or []),
        "owners_per_range": [r.owners for r in current],
        "unrouted": sum(r.unrouted for r in current),
        "not_requested_owners_messages": document.get("not_requested", 0),
        "deleted_in_range": document.get("deleted_in_range", 0),
        "staged": staged,
        "skipped": skipped,
        "decoded": decode.get("decoded"),
        "quarantined": decode.get("quarantined"),
        "quarantined_per_reason": decode.get("per_reason"),
        "dedupe_input": dedupe.get("input"),
        "kept": dedupe.get("output"),
        "duplicates_within_interval": dedupe.get("within_batch_duplicates"),
        "duplicates_seen_before": dedupe.get("cross_batch_duplicates"),
        "id_conflicts_kept": dedupe.get("id_conflicts"),
        "snapshot_version": (apps.get("rebuild") or {}).get("version"),
        "spark_skipped": document.get("spark_skip"),
        "selection": selection_text(document),
    }
    result = {"version": LEDGER_VERSION, "interval_id": str(interval_id), "stream": stream, "chain": chain,
              "run_version": started, "problems": problems, "reconciled": not problems}
    write_ledger_file(storage.join_path(layout.ledger_interval_dir(stream, interval_id), SUMMARY_FILE), result)
    return {**result, "per_event_type": dict(sorted(per_event_type.items()))}


def expire_staging(layout: Layout, stream: str, retention_seconds: float) -> dict[str, Any] | None:
    """Expire the staging of reconciled intervals (:func:`is_reconciled`) staged more than
    ``retention_seconds`` (s) ago (``staging_commits.expire_intervals``: one Delta commit, then
    vacuum), and log what was done. Housekeeping: a failure is logged as a warning and returns
    None (the next run tries again).

    :return: ``{"intervals", "files", "rows", "vacuumed"}``, or None when nothing was expired or
        the expiry failed.
    """
    try:
        done = staging_commits.expire_intervals(layout, stream, retention_seconds=retention_seconds,
                                                committed=lambda iid: is_reconciled(layout, stream, iid))
    except Exception as exc:  # housekeeping: the next run tries again
        log.warning("Staging of stream %s was not expired (the next run tries again): %s: %s", stream,
                    type(exc).__name__, exc)
        return None
    if not done.intervals:
        return None
    log.info("Expired the staging of %s reconciled interval(s) older than %s s: %s (%s files, %s rows; vacuum "
             "deleted %s files)", len(done.intervals), retention_seconds, ", ".join(done.intervals[:20]),
             done.files, done.rows, done.vacuumed)
    return {"intervals": list(done.intervals), "files": done.files, "rows": done.rows, "vacuumed": done.vacuumed}
