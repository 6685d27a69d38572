"""Per-stage figures of one DAG run: task-instance times from the Airflow metadata DB + RSS samples.

Source of the times: the ``task_instance`` table of the run's SQLite metadata DB (``start_date``,
``end_date``, ``state``, ``map_index``; Airflow writes them for ``airflow dags test`` runs too).
Source of the Spark application time: the run summaries the apps write to
``{root}/_runs/{app}/interval={interval_id}.json`` (``seconds``: from after the SparkSession is
up to the committed output; :mod:`airflow_provider_plgd.tables.run_summary`).
"""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone
from typing import Any

from .sampler import TreeSampler

#: Stages in DAG order: (stage name, task IDs). ``plan`` includes the small ``fetch_ranges`` task.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sensor", ("wait_for_interval",)),
    ("plan", ("plan", "fetch_ranges")),
    ("fetch", ("fetch",)),
    ("decode", ("decode",)),
    ("dedupe", ("dedupe",)),
    ("rebuild", ("rebuild",)),
    ("summary", ("summary",)),
)
#: Stages that run a Spark application (stage name == app name of its run summary).
SPARK_STAGES = ("decode", "dedupe", "rebuild")
#: The application script of each Spark stage (``spark_apps/<script>``).
SPARK_SCRIPTS = {"decode": "decode_events.py", "dedupe": "dedupe_events.py", "rebuild": "rebuild_snapshots.py"}


def _epoch(value: Any) -> float | None:
    """A metadata-DB timestamp (``YYYY-MM-DD HH:MM:SS[.ffffff][+00:00]``, UTC) as unix seconds."""
    if value is None:
        return None
    dt = value if isinstance(value, datetime) else datetime.fromisoformat(str(value).replace(" ", "T"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def read_task_instances(db_path: str, dag_id: str = "plgd_events_etl") -> list[dict[str, Any]]:
    """Task instances of ``dag_id``: ``[{"task_id", "map_index", "state", "start", "end"}]`` (unix s).

    :raises sqlite3.Error: the DB cannot be read.
    """
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT task_id, map_index, state, start_date, end_date FROM task_instance WHERE dag_id = ?",
            (dag_id,),
        ).fetchall()
    finally:
        con.close()
    return [
        {"task_id": t, "map_index": m, "state": s, "start": _epoch(a), "end": _epoch(b)}
        for t, m, s, a, b in rows
    ]


def stage_figures(
    tis: list[dict[str, Any]],
    sampler: TreeSampler,
    events: int,
    app_summaries: dict[str, dict[str, Any] | None],
) -> dict[str, dict[str, Any]]:
    """Figures per stage (:data:`STAGES` order).

    :param tis: from :func:`read_task_instances`.
    :param sampler: the sampler that watched the ``airflow dags test`` process tree.
    :param events: messages published for the interval (the events/s numerator of every stage).
    :param app_summaries: ``{"decode"|"dedupe"|"rebuild": run summary dict or None}``.
    :return: ``{stage: {"tasks", "start", "end" (unix s), "wall_s", "task_s" (sum of task
        durations), "events_per_s", "peak_rss" {total, jvm, spark_py, airflow: bytes},
        "spark" (Spark stages only): {"submit_wall_s", "app_s", "jvm_s", "airflow_s",
        "jvm_share", "app_share"}}}``. ``jvm_s`` = spark-submit wall - app seconds (JVM and
        SparkSession start, Python imports, shutdown); ``airflow_s`` = task wall - spark-submit
        wall (operator set-up, templating, log handling). Stages without task instances are left out.
    """
    out: dict[str, dict[str, Any]] = {}
    for stage, task_ids in STAGES:
        mine = [ti for ti in tis if ti["task_id"] in task_ids and ti["start"] and ti["end"]]
        if not mine:
            continue
        start, end = min(ti["start"] for ti in mine), max(ti["end"] for ti in mine)
        wall = end - start
        fig: dict[str, Any] = {
            "tasks": len(mine),
            "states": sorted({str(ti["state"]) for ti in mine}),
            "start": start,
            "end": end,
            "wall_s": round(wall, 3),
            "task_s": round(sum(ti["end"] - ti["start"] for ti in mine), 3),
            "events_per_s": round(events / wall, 1) if wall > 0 else None,
            "peak_rss": sampler.peak(start, end),
        }
        if stage in SPARK_STAGES:
            submits = [p for p in sampler.top_submits() if p.app == SPARK_SCRIPTS[stage] and start - 1 <= p.start <= end]
            submit_wall = sum(p.last_seen - p.start for p in submits) if submits else None
            app_s = (app_summaries.get(stage) or {}).get("seconds")
            spark: dict[str, Any] = {"submit_wall_s": None if submit_wall is None else round(submit_wall, 3),
                                     "app_s": app_s, "submits": [
                                         {"pid": p.pid, "app": p.app, "start": p.start,
                                          "wall_s": round(p.last_seen - p.start, 3)} for p in submits]}
            if submit_wall is not None and app_s is not None:
                spark["jvm_s"] = round(submit_wall - app_s, 3)
                spark["airflow_s"] = round(wall - submit_wall, 3)
                spark["app_share"] = round(app_s / wall, 3) if wall > 0 else None
                spark["jvm_share"] = round((submit_wall - app_s) / wall, 3) if wall > 0 else None
            fig["spark"] = spark
        out[stage] = fig
    return out
