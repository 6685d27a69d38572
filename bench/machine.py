"""Machine load readings shared by the benchmarks (Linux ``/proc/stat``).

The figures of a benchmark on a shared machine are only comparable with the load they ran under;
each bench prints how busy the CPUs were during its measurement.
"""

from __future__ import annotations


def proc_stat() -> tuple[int, int]:
    """Return ``(total, idle)`` jiffies of all CPUs since boot, from the first line of ``/proc/stat``.

    Idle counts the ``idle`` and ``iowait`` columns (source: proc(5)).

    :raises OSError: ``/proc/stat`` cannot be read (not Linux).
    """
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    return sum(values), values[3] + values[4]


def busy_since(start: tuple[int, int]) -> float:
    """Return the busy share of all CPUs (0.0 .. 1.0, rounded to 3 places) since ``start``.

    :param start: an earlier :func:`proc_stat` reading.
    """
    total, idle = proc_stat()
    return round(1.0 - (idle - start[1]) / max(1, total - start[0]), 3)
