"""The ETL's ``summary`` step: reconcile the interval's ledger chain, log it, return its numbers.

:func:`summarize_interval` is the ``summary`` task's work as a plain function; the task adds the
Airflow context (``plan``'s XCom, the lineage report).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from airflow_provider_plgd.etl.params import run_params_used
from airflow_provider_plgd.exceptions import LedgerError
from airflow_provider_plgd.tables import reconcile
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.tables.run_summary import RunSummary, collect_run_summary

_log = logging.getLogger(__package__)  # the ETL's one logger: "airflow_provider_plgd.etl"

#: How long the staging of a reconciled interval is kept by default (``build_etl_dag(staging_retention=…)``).
DEFAULT_STAGING_RETENTION = timedelta(days=7)


def summarize_interval(layout: Layout, stream: str, interval_id: str, params: Mapping[str, Any], *,
                       staging_retention_seconds: float | None = None) -> RunSummary:
    """Check the interval ledger's whole chain, log it (:func:`log_run_summary`) and return its numbers.

    When it reconciles and ``staging_retention_seconds`` is given, expire staging
    (``reconcile.expire_staging``): every reconciled interval staged more than that long ago loses
    its staging rows. That is housekeeping: a failure there is logged as a warning and does not
    fail the run (the next run tries again).

    :param layout: the storage root (``plan``'s ``storage_root``).
    :param stream: the stream name; ``interval_id``: the interval (``times.interval_id``).
    :param params: the run's params (their :data:`~airflow_provider_plgd.etl.params.SUMMARY_PARAMS`
        go into ``params`` of the result, :func:`run_params_used`).
    :param staging_retention_seconds: how long a reconciled interval's staging is kept (s); None: forever.
    :return: :func:`airflow_provider_plgd.tables.run_summary.collect_run_summary`'s summary with ``params``
        and ``staging_expired`` (``{"intervals": [ids], "files", "rows", "vacuumed"}``, or None when
        nothing was expired or no retention is set); its ``as_dict()`` is the ``summary`` task's XCom.
    :raises LedgerError: the chain does not reconcile (``problems``: every problem; the message
        names the interval and the first 20).
    """
    used = run_params_used(params, layout.root)
    result = dataclasses.replace(collect_run_summary(layout, stream, interval_id), params=used)
    log_run_summary(result.as_dict())
    if not result.reconciled:
        raise LedgerError(f"interval {result.interval_id} does not reconcile: "
                          + "; ".join(result.problems[:20]),
                          interval_id=result.interval_id, problems=list(result.problems))
    if staging_retention_seconds is not None:
        result = dataclasses.replace(result,
                                     staging_expired=reconcile.expire_staging(layout, stream, staging_retention_seconds))
    return result


def log_run_summary(result: Mapping[str, Any], log: logging.Logger | None = None) -> None:
    """Log one run's summary (the dict of :func:`airflow_provider_plgd.tables.run_summary.collect_run_summary`).

    Lines: what the stream holds (the ledger) and what was staged and skipped; messages staged per
    event type (non-zero counts); the owners and event types covered and the other params
    the run used (``params``: :func:`run_params_used`); decoded and quarantined rows (per reason);
    duplicates dropped by dedupe (within the interval / against earlier intervals); snapshot rows
    per table; every problem of the ledger's chain (ERROR); whether it reconciled; lag in seconds
    (now minus the interval end).

    :param result: the summary dict.
    :param log: the logger (default: this module's).
    """
    log = log or _log
    chain = result.get("chain") or {}
    log.info("Interval %s: the stream holds %s messages (owners with messages per fetch range %s, %s unrouted, "
             "%s of owners not requested); %s staged, skipped %s", result.get("interval_id"),
             chain.get("stream_total"), chain.get("owners_per_range"), chain.get("unrouted"),
             chain.get("not_requested_owners_messages"), result.get("fetched_total"), chain.get("skipped") or {})
    for event_type, count in (result.get("fetched") or {}).items():
        log.info("  fetched event_type=%s count=%s", event_type, count)
    decode = result.get("decode") or {}
    selection = chain.get("selection") or {}
    log.info("Covered owners: %s; event types: %s", selection.get("owners"), selection.get("event_types"))
    if result.get("params"):
        log.info("Params of this run: %s", ", ".join(f"{k}={v!r}" for k, v in result["params"].items()))
    if chain.get("spark_skipped") and not decode:
        log.info("Decode, dedupe and rebuild skipped: %s", chain["spark_skipped"])
    else:
        log.info("Decoded %s, quarantined %s (by reason: %s)", decode.get("decoded"), decode.get("quarantined"),
                 decode.get("per_reason") or {})
        dedupe = result.get("dedupe") or {}
        log.info("Duplicates dropped %s (within the interval %s, seen in earlier intervals %s); %s events kept "
                 "(%s of them under a message ID that another content also has)",
                 dedupe.get("duplicates"), dedupe.get("within_batch_duplicates"),
                 dedupe.get("cross_batch_duplicates"), dedupe.get("output"), dedupe.get("id_conflicts", 0))
        rebuild = result.get("rebuild") or {}
        if rebuild.get("unchanged"):
            log.info("Snapshot %s unchanged (its events are in the latest snapshot %s)", rebuild.get("version"),
                     rebuild.get("latest"))
        else:
            log.info("Snapshot %s rows: %s", rebuild.get("version"), rebuild.get("rows"))
    if chain.get("deleted_in_range"):
        log.warning("%s stream sequences of the interval's range hold no message (deleted from the stream)",
                    chain["deleted_in_range"])
    for problem in result.get("problems") or []:
        log.error("Does not reconcile: %s", problem)
    log.info("Reconciled: %s; lag %s s after the interval end", result.get("reconciled"), result.get("lag_seconds"))

