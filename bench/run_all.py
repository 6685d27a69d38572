"""Run every benchmark in turn, each in its own process (``make bench``); they print their figures.

Benchmarks print figures and never pass or fail on timing. Pass ``--quick`` for smaller sizes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

#: (module, arguments for a full run, arguments for --quick)
BENCHMARKS = [
    ("bench.bench_hook_read", [], ["--messages", "50000"]),
    ("bench.bench_fetch", [], ["--sizes", "100000"]),
    ("bench.bench_datasource", [], ["--messages", "100000", "--repeat", "1"]),
    ("bench.bench_owners", [], ["--owners", "8,1000", "--messages", "2000"]),  # 8 vs 100k owners by default
    ("bench.bench_decode", [], ["--messages", "100000"]),
    ("bench.bench_rebuild", [], ["--events", "100000"]),
    ("bench.bench_maintenance", [], ["--intervals", "8", "--steady", "1", "--repeat", "3"]),
    ("bench.bench_executor_tasks", [], ["--repeat", "1"]),
    ("bench.e2e.run", [], ["--events", "100000", "--also"]),  # the whole DAG; 1M + 100k take ~15 min
]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; return the number that exited non-zero."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    args = parser.parse_args(argv)
    failed = 0
    for module, full, quick in BENCHMARKS:
        print(f"==> {module}", flush=True)
        rc = subprocess.call([sys.executable, "-m", module, *(quick if args.quick else full)])
        failed += rc != 0
    return failed


if __name__ == "__main__":
    sys.exit(main())
