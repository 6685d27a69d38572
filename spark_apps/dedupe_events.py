"""Spark application: the decoded ``events`` of one interval -> ``events_deduped`` (one row per message ID).

Usage (``--py-files`` from ``airflow_provider_plgd.spark_deps.build_py_files_zip``)::

    spark-submit --master local[2] --py-files plgd_py_files.zip spark_apps/dedupe_events.py \\
        --root /data/plgd --interval-id 20260101T000000Z_20260101T010000Z \\
        [--lookback-intervals 24] [--previous-intervals ID,ID,...] [--summary-path ...]

On Spark Connect (docs/spark-connect.md), the same arguments, as a plain Python program whose
``main`` ships the code with ``addArtifacts``::

    SPARK_REMOTE=sc://host:15002 python spark_apps/dedupe_events.py --root ... --interval-id ...

Input: the interval's rows of the Delta table ``{root}/events`` (committed by ``decode_events``;
the files its log names). Output, each table in one Delta transaction that replaces the
interval's rows (``delta_tables.commit_files``):

* ``{root}/msgid_index`` (internal; files ``interval_id=../bucket=../part-*.parquet``): columns
  ``msg_id`` and ``content_digest``, every distinct pair of the interval (kept or dropped), one
  sorted file per bucket of the msg-ID hash (``dedupe_job.MSGID_BUCKETS``). The compact index that
  later intervals look back at. Committed first.
* ``{root}/events_deduped`` (files ``interval_id=../event_type=../part-*.parquet``): the ``events``
  rows (same columns, ``airflow_provider_plgd.spark.schemas.EVENTS_SCHEMA``) with exactly one row
  per message: per ``(msg_id, content_digest)``. Committed second.
* the run summary ``{root}/_runs/dedupe/interval={id}.json``.

How (:mod:`airflow_provider_plgd.spark.dedupe_job`): everything runs on the executors, and the
driver holds only file lists and counts, whatever the interval's size. Python tasks read the key
columns (``msg_id``, ``stream``, ``stream_seq``, ``subject``, ``event_type``) with pyarrow and
shuffle them by msg-ID bucket; one task per bucket reads that bucket's lookback index files,
decides with pyarrow (:mod:`airflow_provider_plgd.spark.dedupe_decision`) and writes the bucket's
index file; the positions of the dropped rows are shuffled to the tasks that copy each decoded
file minus its dropped rows (so the same stored message staged twice is handled too). The wide
rows never become JVM rows. ``docs/performance.md`` has the measurements.

The message ID is the ``msg_id`` column that decode computed with
``airflow_provider_plgd.plgd.msgid.message_id`` (the one home of the rule: the
``Nats-Msg-Id`` header when present, else derived). A header ID only stands in for the message
(JetStream drops a repeated ID only within its ``duplicate_window``), so a message is its
``msg_id`` *and* its content digest (``airflow_provider_plgd.spark.content_digest``: the decoded
columns). Rows without a ``msg_id`` (none are expected) are all kept and counted.

Rules
-----
* **Within the batch**, of the rows sharing a ``msg_id`` and content digest the one with the
  lowest ``stream_seq`` is kept (ties: ``stream``, then ``subject``, then the row's place in the interval's files):
  deterministic, unlike ``dropDuplicates``.
* **Across batches**, a ``(msg_id, content_digest)`` that appears in the index of one of the previous
  ``--lookback-intervals`` intervals (default 24, i.e. a day of hourly runs: covers JetStream
  redelivery and publisher retries) is dropped here, all its copies. Only the indexes of those
  intervals are read, never the history of events. An index entry without a digest (written
  before it existed) matches every content of its ID.
* **ID conflicts**: a row kept although another content holds its ``msg_id`` (in the batch or
  the lookback) stays and is counted in ``id_conflicts``.
* **Previous intervals** are, by default, the intervals committed to ``msgid_index`` that sort
  before this one (interval IDs sort by start time: ``YYYYMMDDTHHMMSSZ_...``; sequence-range IDs
  ``seq-``/``durable-`` sort by sequence and are only compared with IDs of the same kind), the
  last N of them. ``--previous-intervals`` names them explicitly instead (comma-separated).
* **Reruns**: the interval itself is never part of its lookback, and both outputs are replaced,
  so a rerun produces the same rows. Intervals must be deduplicated in order (the DAG runs with
  ``max_active_runs=1``): an interval deduplicated before an earlier one cannot see the earlier
  one's messages.

Summary keys: ``input``, ``output``, ``within_batch_duplicates``, ``cross_batch_duplicates``,
``null_msg_id``, ``id_conflicts`` (part of ``output``), ``buckets``, ``exact_copies`` (some rows repeat ``(msg_id, stream, stream_seq)``),
``phase_seconds``, ``per_event_type`` (``{event_type: {"input", "output", "within_batch",
"cross_batch"}}``), ``previous_intervals``, ``seconds``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from airflow_provider_plgd.spark import app_args
from airflow_provider_plgd.spark.dedupe_job import DEFAULT_LOOKBACK, run
from airflow_provider_plgd.spark.session import run_app
from airflow_provider_plgd.tables.layout import validate_partition_value


def parse_args(argv: Sequence[str] | None = None) -> app_args.DedupeArgs:
    """Parse the command line (see the module docstring).

    :raises SystemExit: bad arguments (argparse), including a negative lookback.
    """
    parser = argparse.ArgumentParser(
        prog="dedupe_events", description="Deduplicate one interval of plgd events by message ID."
    )
    parser.add_argument("--lookback-intervals", type=int, default=DEFAULT_LOOKBACK,
                        help=f"previous intervals whose message IDs are dropped here (default {DEFAULT_LOOKBACK})")
    parser.add_argument("--previous-intervals", type=app_args.name_list, default=None,
                        help="explicit comma-separated previous interval IDs (default: the last "
                             "--lookback-intervals committed events_deduped intervals before this one)")
    app_args.add_common_args(parser, "storage root holding events/, events_deduped/, msgid_index/, _runs/ "
                                     "(path or URL)")
    ns = parser.parse_args(argv)
    if ns.lookback_intervals < 0:
        parser.error(f"--lookback-intervals must be >= 0, got {ns.lookback_intervals}")
    try:
        previous = (None if ns.previous_intervals is None else
                    tuple(validate_partition_value(i, "previous interval") for i in ns.previous_intervals))
    except ValueError as err:
        parser.error(str(err))
    return app_args.DedupeArgs(**app_args.common_args(parser, ns),
                               lookback_intervals=ns.lookback_intervals, previous_intervals=previous)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Entry point (``session.run_app``): parse ``argv`` (default ``sys.argv[1:]``), run, stop
    Spark; return the summary. Exceptions propagate (spark-submit exits non-zero)."""
    return run_app("plgd-dedupe-events", parse_args, run, argv)


if __name__ == "__main__":
    main()
