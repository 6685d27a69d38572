"""Before and after in one run (``bench.e2e.run --compare-rev <git rev>``).

Each size runs the whole DAG on a ``git worktree`` of the given revision ("before") and on the
current tree ("after"), interleaved (before, after, before, after, ...: a machine that slows down
during the run slows both alike) on the same traffic (the cached, deterministic messages of
:mod:`bench.e2e.traffic`). Each figure is the median of its runs; the ratio is after / before
(below 1.0: the current tree is faster).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def add_worktree(rev: str, where: Path) -> str:
    """Check ``rev`` out (detached) at ``where`` with ``git worktree add``; return its commit.

    :raises subprocess.CalledProcessError: an unknown revision (git's message on stderr).
    """
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"], check=True,
                            capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), commit], check=True,
                   capture_output=True, text=True)
    return commit


def remove_worktree(where: Path) -> None:
    """Remove the worktree of :func:`add_worktree` (its folder and git's record of it)."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)], check=False,
                   capture_output=True)
    shutil.rmtree(where, ignore_errors=True)


def figures(run: dict[str, Any]) -> dict[str, float]:
    """The compared figures of one run: the DAG's wall time and each stage's wall time (s)."""
    out = {"dag wall": float(run["dag"]["wall_s"]), "tasks": float(run["dag"]["tasks_s"])}
    out.update({f"stage {name}": float(stage["wall_s"]) for name, stage in run["stages"].items()})
    return out


def summarize(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """``{figure: {"before", "after" (medians, s), "ratio" (after / before)}}`` of the runs of one size."""
    b = [figures(r) for r in before]
    a = [figures(r) for r in after]
    table = {}
    for name in b[0]:
        mb = statistics.median(f[name] for f in b if name in f)
        ma = statistics.median(f[name] for f in a if name in f)
        table[name] = {"before": round(mb, 3), "after": round(ma, 3), "ratio": round(ma / mb, 3) if mb else 0.0}
    return table


def print_table(size: int, rev: str, table: dict[str, dict[str, float]]) -> None:
    print(f"\n[e2e] {size:,} events: {rev} (before) against the current tree (after), medians")
    print(f"{'figure':<22}{'before s':>12}{'after s':>12}{'after/before':>14}")
    for name, row in table.items():
        print(f"{name:<22}{row['before']:>12.2f}{row['after']:>12.2f}{row['ratio']:>14.3f}")


def compare_revision(args: argparse.Namespace, sizes: list[int], base: Path,
                     run_size: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """Run every size ``args.compare_rounds`` times on each tree, interleaved; print and return
    ``{"rev", "commit", "sizes": [{"events", "before": [run], "after": [run], "table"}]}``."""
    where = base / "compare-rev"
    commit = add_worktree(args.compare_rev, where)
    print(f"[e2e] before: {args.compare_rev} ({commit[:12]}) at {where}; after: {REPO}", flush=True)
    result: dict[str, Any] = {"rev": args.compare_rev, "commit": commit, "sizes": []}
    try:
        for size in sizes:
            runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
            for i in range(max(1, args.compare_rounds)):
                for side, tree in (("before", where), ("after", REPO)):
                    print(f"[e2e] {size:,} events, round {i + 1}, {side}", flush=True)
                    runs[side].append(run_size(args, size, base / f"n{size}-{side}-{i}", tree=tree))
            table = summarize(runs["before"], runs["after"])
            print_table(size, args.compare_rev, table)
            result["sizes"].append({"events": size, **runs, "table": table})
    finally:
        remove_worktree(where)
    return result
