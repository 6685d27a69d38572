"""Helpers for tests and benchmarks that run real ``spark-submit`` in local mode.

* :func:`spark_submit_env`: the environment ``spark-submit`` needs from a virtualenv (the venv's
  ``bin`` on ``PATH`` so that it finds ``SPARK_HOME`` in the pyspark package, and the venv's
  python for the driver and the Python workers).
* :func:`spark_lock`: one Spark job at a time on a small shared machine (an exclusive ``flock``).
* :data:`FAST_LOCAL_SPARK_CONF`: Spark settings for short runs on small data.
* :func:`spark_app_module`: a Spark application script imported in this process (its
  ``parse_args``/``main``), from a source checkout or an installed provider.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType

from airflow_provider_plgd.spark_deps import spark_app_path

#: The lock file that serialises Spark jobs and DAG runs of tests and benchmarks on one machine.
#: Extra Spark settings (``build_etl_dag(spark_conf=…)``) for short runs on small data with
#: ``local[*]`` (the demo, the tests and the benchmarks), where the provider is installed in the Python that runs the Spark apps:
#:
#: * the driver JVM (which also runs the executors in local mode) only JIT-compiles with C1 and
#:   uses the serial GC: a short ``spark-submit`` spends most of its CPU time compiling and
#:   collecting, not running the job (M1);
#: * no whole-stage code generation and no adaptive re-planning: on tiny decode or dedupe runs
#:   they cost more than they save (M2).
#:
#: M1-M2: the figures are in docs/performance.md, "Measurements behind design choices".
#:
#: Not a default: C1-only, non-generated code is slower on long jobs over large data, and
#: ``--conf spark.driver.extraJavaOptions`` replaces the value from ``spark-defaults.conf``.
FAST_LOCAL_SPARK_CONF: dict[str, str] = {
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "spark.sql.shuffle.partitions": "2",
    # tiny inputs: compiling whole-stage code and re-planning stages cost more than they save
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.adaptive.enabled": "false",
}


SPARK_LOCK = "/tmp/spark.lock"
#: Set to ``1`` when the caller already holds :data:`SPARK_LOCK` (``flock /tmp/spark.lock pytest``).
LOCK_HELD_ENV = "PLGD_SPARK_LOCK_HELD"


def spark_app_module(name: str) -> ModuleType:
    """Import the Spark application script ``name`` (``decode_events``, ``dedupe_events`` or
    ``rebuild_snapshots``) as ``airflow_provider_plgd.spark_apps.<name>``, from the file
    :func:`~airflow_provider_plgd.spark_deps.spark_app_path` names: the one ``spark-submit`` would
    run (a checkout's ``spark_apps/`` or the installed ``airflow_provider_plgd/spark_apps/``).

    :raises FileNotFoundError: no such application.
    """
    module_name = f"airflow_provider_plgd.spark_apps.{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, spark_app_path(name))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


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
