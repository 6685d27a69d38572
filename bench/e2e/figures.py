"""The console tables of :mod:`bench.e2e.run` (per size, growth, speed-up) and the run-time
estimate that decides whether a size fits before a deadline."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from bench.e2e.stages import SPARK_STAGES

MB = 1024 * 1024


def print_size(r: dict[str, Any]) -> None:
    """Print the stage table of one size."""
    n = r["events"]
    d = r["dag"]
    print(f"\n=== {n:,} events ({r['payload_bytes'] / 1e6:.0f} MB payload), interval {r['interval']['id']} ===")
    print(f"{'stage':<9} {'wall s':>8} {'events/s':>10} {'peak RSS MB':>12} {'(JVM':>7} {'SparkPy':>8} "
          f"{'Airflow)':>9}  Spark: submit s = app s + JVM s; Airflow s")
    for name, s in r["stages"].items():
        rss = s["peak_rss"]
        line = (f"{name:<9} {s['wall_s']:>8.1f} {s['events_per_s'] or 0:>10,.0f} {rss['total'] / MB:>12,.0f} "
                f"{rss['jvm'] / MB:>7,.0f} {rss['spark_py'] / MB:>8,.0f} {rss['airflow'] / MB:>9,.0f}")
        sp = s.get("spark")
        if sp and sp.get("app_s") is not None and sp.get("submit_wall_s") is not None:
            line += (f"  {sp['submit_wall_s']:.1f} = {sp['app_s']:.1f} app ({sp['app_share']:.0%}) + "
                     f"{sp['jvm_s']:.1f} JVM ({sp['jvm_share']:.0%}); {sp['airflow_s']:.1f}")
        if s["tasks"] > 1:
            line += f"  [{s['tasks']} tasks]"
        print(line)
    print(f"{'DAG':<9} {d['wall_s']:>8.1f} {d['events_per_s']:>10,.0f} {d['peak_rss']['total'] / MB:>12,.0f}"
          f"   (airflow dags test process; {d['airflow_gaps_s']:.1f} s outside tasks: CLI start, parsing, "
          f"scheduling; both cores {d['machine_busy']:.0%} busy)")
    c = r["ceilings"]
    print(f"ceilings: raw read {c['read']['rate']:,.0f} msgs/s ({c['read']['seconds']:.1f} s), single-core decode "
          f"{c['decode']['row_rate']:,.0f} rows/s ({c['decode']['seconds']:.1f} s); sum {c['sum_s']:.1f} s")
    print(f"end-to-end / ceilings: {r['ratio_to_ceilings']:.2f}x (goal <= 3x; task span only: "
          f"{r['ratio_span_to_ceilings']:.2f}x); nats-server peak RSS {(r['nats_peak_rss'] or 0) / MB:,.0f} MB; "
          f"load {r['load_before']['loadavg']} -> {r['load_after']['loadavg']}")


def growth(small: dict[str, Any], large: dict[str, Any]) -> dict[str, Any]:
    """Growth from ``small`` to ``large``: per stage and end to end, ``time ratio / size ratio`` (1.0 = linear).

    :return: ``{"from", "to", "size_ratio", "dag": {...}, "stages": {stage: {"time_ratio", "vs_linear"}}}``.
    """
    size_ratio = large["events"] / small["events"]

    def one(a: float, b: float) -> dict[str, float]:
        ratio = b / a if a else float("nan")
        return {"small_s": round(a, 2), "large_s": round(b, 2), "time_ratio": round(ratio, 2),
                "vs_linear": round(ratio / size_ratio, 2)}

    return {"from": small["events"], "to": large["events"], "size_ratio": round(size_ratio, 3),
            "dag": one(small["dag"]["wall_s"], large["dag"]["wall_s"]),
            "stages": {k: one(small["stages"][k]["wall_s"], large["stages"][k]["wall_s"])
                       for k in large["stages"] if k in small["stages"]}}


def print_growth(g: dict[str, Any]) -> None:
    """Print the growth table."""
    print(f"\n=== growth {g['from']:,} -> {g['to']:,} events (x{g['size_ratio']:.2f}); 1.00 = linear ===")
    print(f"{'stage':<9} {'small s':>8} {'large s':>8} {'x time':>7} {'vs linear':>10}")
    for name, s in [*g["stages"].items(), ("DAG", g["dag"])]:
        print(f"{name:<9} {s['small_s']:>8.1f} {s['large_s']:>8.1f} {s['time_ratio']:>7.2f} {s['vs_linear']:>10.2f}")


def _fixed_seconds(r: dict[str, Any]) -> float:
    """The size-independent part of one size's time (s): the non-Spark stages other than fetch,
    Airflow's gaps between tasks, and the JVM and Airflow parts of the Spark stages."""
    fixed = r["dag"]["airflow_gaps_s"]
    for name, s in r["stages"].items():
        if name in ("sensor", "plan", "summary"):
            fixed += s["wall_s"]
        elif "spark" in s and s["spark"].get("app_s") is not None and s["spark"].get("submit_wall_s") is not None:
            fixed += s["wall_s"] - s["spark"]["app_s"]
    return fixed


def estimate_seconds(small: dict[str, Any], events: int, margin: float = 1.3) -> float:
    """Estimated seconds of a size of ``events`` from a measured one: fixed part + the rest scaled
    linearly (DAG and ceilings), times ``margin``, plus 60 s for loading, publishing and ``db migrate``."""
    fixed = _fixed_seconds(small)
    variable = small["dag"]["wall_s"] - fixed + small["ceilings"]["sum_s"]
    return 60 + margin * (fixed + variable * events / small["events"])


def fit_deadline(small: dict[str, Any], size: int, fallback: int | None, deadline: str) -> int | None:
    """``size`` if its estimate (:func:`estimate_seconds`) ends before ``deadline`` (``HH:MM`` UTC
    today), else ``fallback`` if that one fits, else None (skip). Prints the decision."""
    hh, mm = (int(x) for x in deadline.split(":"))
    now = datetime.now(timezone.utc)
    limit = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
    for candidate in (size, fallback):
        if candidate is None:
            continue
        est = estimate_seconds(small, candidate)
        fits = now.timestamp() + est <= limit.timestamp()
        print(f"[e2e] {candidate:,} events: estimated {est / 60:.1f} min, deadline {deadline} UTC: "
              f"{'runs' if fits else 'does not fit'}", flush=True)
        if fits:
            return candidate
    return None


def print_speedup(one: dict[str, Any], two: dict[str, Any]) -> dict[str, Any]:
    """Print and return each Spark stage's time with 1 and with 2 workers and the speed-up
    (time with 1 / time with 2): task wall time and the application's own time (run summary
    ``seconds``: SparkSession up to committed output, without JVM start)."""
    out: dict[str, Any] = {}
    print(f"\n=== {one['events']:,} events: 1 worker vs 2 workers (1 core each) ===")
    print(f"{'stage':<9} {'1w wall s':>10} {'2w wall s':>10} {'speed-up':>9} {'1w app s':>9} {'2w app s':>9} {'speed-up':>9}")
    for stage in SPARK_STAGES:
        a, b = one["stages"].get(stage), two["stages"].get(stage)
        if not a or not b:
            continue
        app_a, app_b = (a.get("spark") or {}).get("app_s"), (b.get("spark") or {}).get("app_s")
        row = {"wall_1": a["wall_s"], "wall_2": b["wall_s"], "wall_speedup": round(a["wall_s"] / b["wall_s"], 2),
               "app_1": app_a, "app_2": app_b,
               "app_speedup": round(app_a / app_b, 2) if app_a and app_b else None}
        out[stage] = row
        app = (f"{app_a:>9.1f} {app_b:>9.1f} {row['app_speedup']:>8.2f}x" if row["app_speedup"] else
               f"{'-':>9} {'-':>9} {'-':>9}")
        print(f"{stage:<9} {a['wall_s']:>10.1f} {b['wall_s']:>10.1f} {row['wall_speedup']:>8.2f}x {app}")
    return out
