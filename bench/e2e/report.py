"""Markdown tables of a ``bench.e2e.run --json`` file, for ``docs/performance.md``.

Usage: ``python -m bench.e2e.report e2e.json`` (prints to stdout). Input: the JSON that
:func:`bench.e2e.run.main` writes; raises ``KeyError`` when it lacks a section.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MB = 1024 * 1024


def stage_table(r: dict[str, Any]) -> str:
    """One size: per stage wall s, events/s, peak RSS MB, and Spark's split (app s / JVM s / Airflow s)."""
    lines = [
        f"**{r['events']:,} events** ({r['payload_bytes'] / 1e6:.0f} MB of payloads; "
        f"load average {r['load_before']['loadavg'][0]} -> {r['load_after']['loadavg'][0]})",
        "",
        "| stage | wall s | events/s | peak RSS MB (JVM + Spark Python + Airflow) | Spark: app s / JVM s / Airflow s |",
        "|---|---:|---:|---|---|",
    ]
    for name, s in r["stages"].items():
        rss = s["peak_rss"]
        sp = s.get("spark") or {}
        split = ""
        if sp.get("app_s") is not None and sp.get("jvm_s") is not None:
            split = (f"{sp['app_s']:.1f} ({sp['app_share']:.0%}) / {sp['jvm_s']:.1f} ({sp['jvm_share']:.0%}) / "
                     f"{max(0.0, sp['airflow_s']):.1f}")  # < 0 only by the 0.2 s sampling period
        tasks = f" ({s['tasks']} tasks)" if s["tasks"] > 1 else ""
        lines.append(f"| {name}{tasks} | {s['wall_s']:.1f} | {s['events_per_s'] or 0:,.0f} | "
                     f"{rss['total'] / MB:,.0f} ({rss['jvm'] / MB:,.0f} + {rss['spark_py'] / MB:,.0f} + "
                     f"{rss['airflow'] / MB:,.0f}) | {split} |")
    d, c = r["dag"], r["ceilings"]
    lines += [
        f"| **DAG** (`airflow dags test`) | **{d['wall_s']:.1f}** | **{d['events_per_s']:,.0f}** | "
        f"{d['peak_rss']['total'] / MB:,.0f} | {d['airflow_gaps_s']:.1f} s outside tasks |",
        "",
        f"Ceilings on the same data: raw read {c['read']['rate']:,.0f} msgs/s ({c['read']['seconds']:.1f} s), "
        f"single-core decode {c['decode']['row_rate']:,.0f} rows/s ({c['decode']['seconds']:.1f} s); sum "
        f"{c['sum_s']:.1f} s. **End-to-end / ceilings = {r['ratio_to_ceilings']:.1f}x** (goal <= 3x; tasks only "
        f"{r['ratio_span_to_ceilings']:.1f}x). Both cores {d['machine_busy']:.0%} busy during the DAG run.",
    ]
    return "\n".join(lines)


def growth_table(g: dict[str, Any]) -> str:
    """Growth per stage: seconds at both sizes, time ratio, and time ratio / size ratio (1.00 = linear)."""
    lines = [
        f"**Growth {g['from']:,} -> {g['to']:,} events (x{g['size_ratio']:.2f})**",
        "",
        "| stage | small s | large s | x time | / x size (1.00 = linear) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, s in [*g["stages"].items(), ("**DAG**", g["dag"])]:
        lines.append(f"| {name} | {s['small_s']:.1f} | {s['large_s']:.1f} | {s['time_ratio']:.2f} | "
                     f"{s['vs_linear']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the tables of the JSON file ``argv[0]``."""
    argv = sys.argv[1:] if argv is None else argv
    data = json.loads(Path(argv[0]).read_text())
    for r in data["sizes"]:
        print(stage_table(r) + "\n")
    if data.get("growth"):
        print(growth_table(data["growth"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
