"""Helpers for tests and benchmarks that run real ``spark-submit`` in local mode.

* :func:`spark_submit_env`: the environment ``spark-submit`` needs from a virtualenv (the venv's
  ``bin`` on ``PATH`` so that it finds ``SPARK_HOME`` in the pyspark package, and the venv's
  python for the driver and the Python workers).
* :func:`spark_lock`: one Spark job at a time on a small shared machine (an exclusive ``flock``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

#: The lock file that serialises Spark jobs and DAG runs of tests and benchmarks on one machine.
SPARK_LOCK = "/tmp/spark.lock"
#: Set to ``1`` when the caller already holds :data:`SPARK_LOCK` (``flock /tmp/spark.lock pytest``).
LOCK_HELD_ENV = "PLGD_SPARK_LOCK_HELD"


def spark_submit_env(base: Mapping[str, str] | None = None, *, python: str | None = None) -> dict[str, str]:
    """Return a copy of ``base`` (default ``os.environ``) set up for ``spark-submit`` from a venv.

    ``PATH`` starts with the directory of ``python``; ``PYSPARK_PYTHON`` and
    ``PYSPARK_DRIVER_PYTHON`` name it; ``PYTHONHASHSEED=0`` makes Python workers hash alike.

    :param python: the interpreter (default ``sys.executable``, the venv's python under pytest).
    """
    python = python or sys.executable
    env = dict(os.environ if base is None else base)
    env["PATH"] = f"{Path(python).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYSPARK_PYTHON"] = python
    env["PYSPARK_DRIVER_PYTHON"] = python
    env["PYTHONHASHSEED"] = "0"
    return env


@contextlib.contextmanager
def spark_lock(path: str = SPARK_LOCK) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` for the ``with`` block (blocks until free).

    Skipped when ``PLGD_SPARK_LOCK_HELD=1`` says the caller already holds it, which would
    otherwise deadlock. Unlocked explicitly at the end: a process forked inside the block (e.g.
    OpenLineage's process pool) shares the lock's open file description, and closing our copy
    alone would leave the lock held by that child.
    """
    if os.environ.get(LOCK_HELD_ENV) == "1":
        yield
        return
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
