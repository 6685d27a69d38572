"""The two ways of running the DAG's Spark stages in ``bench.e2e.run``: classic ``spark-submit``
(the default) and a Spark Connect server (``--ways classic connect``).

On Connect the DAG is ``build_etl_dag(spark_connect_conn_id=...)`` (``dags/plgd_events_etl.py``
reads ``PLGD_ETL_SPARK_CONNECT_CONN_ID``) against a local server
(:class:`plgd_devtools.spark_connect.SparkConnectServer`, ``local[*]``, started once before the
sizes, its Python workers on ``--executor-python``): the three Spark tasks are client processes
(``python spark_apps/<app>.py``), and a stage's "JVM" part (process wall - app seconds) is then
the client's start instead: Python imports, the connection, shipping the code with
``addArtifacts``, closing the session. The server's start is a service's start, printed apart.
The server's memory is not in the RSS columns (it is no child of ``airflow dags test``): its peak
is ``connect_server_peak_rss``.
"""

from __future__ import annotations

import json
from typing import Any

MB = 1024 * 1024
#: The connection ID of the Connect way (an ``AIRFLOW_CONN_*`` variable of the DAG run).
CONNECT_CONN_ID = "plgd_spark_connect"


def connect_env(env: dict[str, str], port: int) -> dict[str, str]:
    """``env`` (the DAG run's environment) for the Connect way: the ``spark_connect`` connection to
    ``127.0.0.1:port`` and the DAG's switch; no ``PLGD_ETL_SPARK_CONF`` (a DAG on Connect takes none:
    the server's settings apply)."""
    out = dict(env)
    out[f"AIRFLOW_CONN_{CONNECT_CONN_ID.upper()}"] = json.dumps(
        {"conn_type": "spark_connect", "host": "127.0.0.1", "port": port})
    out["PLGD_ETL_SPARK_CONNECT_CONN_ID"] = CONNECT_CONN_ID
    out.pop("PLGD_ETL_SPARK_CONF", None)
    for key in ("SPARK_REMOTE", "SPARK_CONNECT_AUTHENTICATE_TOKEN"):
        out.pop(key, None)
    return out


def _split(stage: dict[str, Any]) -> tuple[float, float | None, float | None, float | None]:
    sp = stage.get("spark") or {}
    return stage["wall_s"], sp.get("app_s"), sp.get("jvm_s"), sp.get("airflow_s")


def compare(by_way: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Print and return one size's table, classic against Connect: per Spark stage the task's wall
    time = app + start (JVM and SparkSession, or the Connect client's start) + Airflow; then the
    DAG's wall time, the ceilings' sum and the ratio (goal <= 1.5x on Connect).

    :param by_way: ``{"classic": run_size result, "connect": run_size result}`` (either may be missing).
    :return: ``{"events", "stages": {stage: {way: {"wall_s", "app_s", "start_s", "airflow_s"}}},
        "dag": {way: {"wall_s", "ceilings_s", "ratio"}}}``.
    """
    first = next(iter(by_way.values()))
    out: dict[str, Any] = {"events": first["events"], "stages": {}, "dag": {}}
    print(f"\n=== {first['events']:,} events: classic spark-submit against Spark Connect ===")
    print(f"{'stage':<9} {'way':<8} {'wall s':>7} {'app s':>7} {'start s':>8} {'Airflow s':>10}   "
          "(start: JVM + SparkSession on classic; the client's start on Connect)")
    for stage in ("decode", "dedupe", "rebuild"):
        for way, r in by_way.items():
            if stage not in r["stages"]:
                continue
            wall, app, start, airflow = _split(r["stages"][stage])
            out["stages"].setdefault(stage, {})[way] = {"wall_s": wall, "app_s": app, "start_s": start,
                                                        "airflow_s": airflow}
            cells = " ".join(f"{v:>{w}.1f}" if v is not None else f"{'-':>{w}}"
                             for v, w in ((app, 7), (start, 8), (airflow, 10)))
            print(f"{stage:<9} {way:<8} {wall:>7.1f} {cells}")
    for way, r in by_way.items():
        ceilings = r["ceilings"]["sum_s"]
        out["dag"][way] = {"wall_s": r["dag"]["wall_s"], "ceilings_s": ceilings, "ratio": r["ratio_to_ceilings"],
                           "span_ratio": r["ratio_span_to_ceilings"]}
        extra = ""
        if r.get("connect_server_peak_rss"):
            extra = f"; Connect server peak RSS {r['connect_server_peak_rss'] / MB:,.0f} MB"
        print(f"{'DAG':<9} {way:<8} {r['dag']['wall_s']:>7.1f}   ceilings {ceilings:.1f} s: "
              f"{r['ratio_to_ceilings']:.2f}x (task span {r['ratio_span_to_ceilings']:.2f}x; goal <= 1.5x){extra}")
    return out
