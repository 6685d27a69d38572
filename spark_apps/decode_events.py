"""Spark application: one interval of the staging Delta table -> the Delta tables ``events`` + ``quarantine``.

Usage (``--py-files`` from ``airflow_provider_plgd.spark_deps.build_py_files_zip``)::

    spark-submit --master local[2] --py-files plgd_py_files.zip spark_apps/decode_events.py \\
        --root /data/plgd --stream EVENTS --interval-id 20260101T000000Z_20260101T010000Z \\
        [--owners o1,o2] [--event-types resourcechanged,...] \\
        [--max-content-bytes 4194304] [--summary-path /data/plgd/_runs/decode/interval=....json]

On Spark Connect (docs/spark-connect.md), the same arguments, as a plain Python program whose
``main`` ships the code with ``addArtifacts``::

    SPARK_REMOTE=sc://host:15002 python spark_apps/decode_events.py --root ... --interval-id ...

``--max-content-bytes`` (default 4 MiB, ``codec.DEFAULT_MAX_DECODED_BYTES``) caps the decoded
(snappy-decompressed) size of each event and so of its resource content; a payload over it is
quarantined as ``content_too_large`` before anything is decompressed (decode bombs).

Steps:

1. The files of the interval come from the staging table's Delta log
   (``airflow_provider_plgd.tables.staging.staged_files``; ``--event-types`` by partition, ``--owners`` by
   the files' ``owner_id`` statistics). With ``--ledger`` (the ETL DAG) they are checked against
   the interval ledger first (:func:`decode_job.ledger_files`): the fetch records must account for
   every message of the plan, and the files must be exactly the plan's run's with the recorded
   rows per range and event type, else the run fails before anything is written.
   The driver cuts each file into row ranges of about 10,000 rows by its row count in the log (no
   data file is opened on the driver) and packs them into a few tasks of decreasing size
   (``task_plan.plan_tasks``); each task reads its files' footers and its row groups with pyarrow.
2. One pass (``executor_tasks.run_tasks`` with ``decode_job.make_rdd_task``): each task decodes its
   staging batches once (``airflow_provider_plgd.spark.decode_batch``) and writes the decoded rows
   and the quarantined rows itself with pyarrow (``parquet_io.ArrowPartitionedWriter``) into the
   two table folders, under file names unique to this run; it returns one small record per
   written file (path, rows, bytes, partition values, Parquet statistics). Bad payloads never fail the job and are never
   dropped. (Why not
   ``persist`` + two Spark writes: caching the wide union and Spark's Parquet writer for the ~180
   leaf columns together cost more JVM CPU per row than the decode itself, each several times
   pyarrow's write; figures: docs/performance.md, "Measurements behind design choices", M9.)
3. The driver checks ``fetched`` (the rows the log names; with ``--owners``: the rows of those
   owners the tasks read) ``==`` the rows the tasks read ``== decoded + quarantined`` (sums of the
   written files) and fails before committing if not; then commits each table in one Delta
   transaction that replaces the interval's rows (``delta_tables.commit_files``):
   ``{root}/events`` (files ``interval_id=../event_type=../part-*.parquet``) and
   ``{root}/quarantine`` (``interval_id=../part-*.parquet``). A rerun replaces both
   intervals' rows with the same rows (under new file names); files of failed runs are never named
   by the log.
4. The run summary (JSON) is written last: ``fetched``, ``decoded``, ``quarantined``,
   ``per_event_type``, ``per_reason``, ...

Column reference: ``docs/events.md``; schemas: ``airflow_provider_plgd/spark/schemas.py``; the
job itself: :mod:`airflow_provider_plgd.spark.decode_job`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from airflow_provider_plgd.spark import app_args
from airflow_provider_plgd.spark.decode_batch import DEFAULT_MAX_CONTENT_BYTES
from airflow_provider_plgd.spark.decode_job import run
from airflow_provider_plgd.spark.session import run_app


def parse_args(argv: Sequence[str] | None = None) -> app_args.DecodeArgs:
    """Parse the command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="decode_events", description="Decode one interval of the plgd staging table into events + quarantine."
    )
    parser.add_argument("--stream", default="EVENTS", help="JetStream stream name (default EVENTS)")
    parser.add_argument("--owners", type=app_args.name_list, action="append", default=None,
                        help="only the rows of these owners (comma-separated; repeatable)")
    parser.add_argument("--event-types", type=app_args.name_list, action="append", default=None,
                        help="only these event_type partitions (comma-separated; repeatable)")
    parser.add_argument("--ledger", action="store_true",
                        help="check the interval's staging files against the interval ledger under "
                             "--root (airflow_provider_plgd.tables.ledger; the ETL DAG passes it): files of another "
                             "run, a missing range or another count fail the run before anything is written")
    parser.add_argument("--max-content-bytes", type=_positive_bytes, default=DEFAULT_MAX_CONTENT_BYTES,
                        help="cap on the decoded (snappy-decompressed) size of one event, and so of its "
                             "resource content, in bytes; over it the row is quarantined as "
                             f"content_too_large (default {DEFAULT_MAX_CONTENT_BYTES} = 4 MiB)")
    app_args.add_common_args(parser, "storage root that holds staging/{stream}, and receives events/, "
                                     "quarantine/ and _runs/ (path or URL)")
    ns = parser.parse_args(argv)
    return app_args.DecodeArgs(**app_args.common_args(parser, ns), stream=ns.stream,
                               owners=app_args.flatten_lists(ns.owners),
                               event_types=app_args.flatten_lists(ns.event_types), ledger=ns.ledger,
                               max_content_bytes=ns.max_content_bytes)


def _positive_bytes(value: str) -> int:
    """argparse type of ``--max-content-bytes``: a positive integer number of bytes."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of bytes, got {value!r}")
    return number


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Entry point (``session.run_app``): parse ``argv`` (default ``sys.argv[1:]``), run, stop
    Spark; return the summary. Exceptions propagate (spark-submit exits non-zero)."""
    return run_app("plgd-decode-events", parse_args, run, argv)


if __name__ == "__main__":
    main()
