"""Helpers for tests and benchmarks that run real ``spark-submit`` in local mode.

* :func:`spark_submit_env`: the environment ``spark-submit`` needs from a virtualenv (the venv's
  ``bin`` on ``PATH`` so that it finds ``SPARK_HOME`` in the pyspark package, and the venv's
  python for the driver and the Python workers).
* :func:`spark_lock`: one Spark job at a time on a small shared machine (an exclusive ``flock``),
  or ``PLGD_SPARK_SLOTS`` at a time (``make test``'s xdist workers).
* :data:`FAST_LOCAL_SPARK_CONF`: Spark settings for short runs on small data.
* :func:`spark_app_module`: a Spark application script imported in this process (its
  ``parse_args``/``main``), from a source checkout or an installed provider.
* :func:`fast_jvm_start_env`: the test harness's faster ``spark-submit`` starts (a class-data
  sharing archive of the driver JVM's classes, and a C1-only launcher JVM).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType

from airflow_provider_plgd.spark_deps import spark_app_path

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


#: The lock file that serialises Spark jobs and DAG runs of tests and benchmarks on one machine.
SPARK_LOCK = "/tmp/spark.lock"
#: Set to ``1`` when the caller already holds :data:`SPARK_LOCK` (``flock /tmp/spark.lock pytest``).
LOCK_HELD_ENV = "PLGD_SPARK_LOCK_HELD"
#: How many Spark jobs may run at once (default 1): ``make test`` sets it to its number of xdist
#: workers, so that the workers' Spark jobs run side by side; a slot is a lock file
#: (:data:`SPARK_LOCK`, then ``SPARK_LOCK.1``, ...).
SLOTS_ENV = "PLGD_SPARK_SLOTS"


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
def spark_lock(path: str = SPARK_LOCK, *, alone: bool = False) -> Iterator[None]:
    """Hold a Spark slot for the ``with`` block (blocks until one is free): an exclusive ``flock``
    on ``path`` or, when ``PLGD_SPARK_SLOTS=N`` allows N jobs at once, on one of ``path``,
    ``path.1`` ... ``path.{N-1}``. With one slot (the default) this is one ``flock`` on ``path``,
    as ``flock /tmp/spark.lock <command>`` takes it.

    :param alone: hold every slot: no other Spark job of the machine runs meanwhile (a test whose
        assertion depends on having the machine's cores). Slots are taken in order, so two such
        callers cannot deadlock.

    Skipped when ``PLGD_SPARK_LOCK_HELD=1`` says the caller already holds it, which would
    otherwise deadlock. Unlocked explicitly at the end: a process forked inside the block (e.g.
    OpenLineage's process pool) shares the lock's open file description, and closing our copy
    alone would leave the lock held by that child.
    """
    if os.environ.get(LOCK_HELD_ENV) == "1":
        yield
        return
    try:
        slots = max(1, int(os.environ.get(SLOTS_ENV, "1")))
    except ValueError:
        raise ValueError(f"{SLOTS_ENV}={os.environ[SLOTS_ENV]!r}: expected a whole number of Spark slots") from None
    paths = [path] + [f"{path}.{i}" for i in range(1, slots)]
    with contextlib.ExitStack() as stack:
        if alone or slots == 1:
            for slot in paths:
                stack.enter_context(_flocked(slot, blocking=True))
        else:
            _take_one_slot(stack, paths)
        yield


def _take_one_slot(stack: contextlib.ExitStack, paths: list[str]) -> None:
    delay = 0.05
    while True:
        for slot in paths:
            try:
                stack.enter_context(_flocked(slot, blocking=False))
                return
            except BlockingIOError:
                continue
        time.sleep(delay)
        delay = min(1.0, delay * 2)


@contextlib.contextmanager
def _flocked(path: str, *, blocking: bool) -> Iterator[None]:
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)

#: The JVM options of ``spark-submit``'s launcher JVM (``SPARK_LAUNCHER_OPTS``: the short Java
#: program that builds the driver's command line): the same short-run JIT and GC as the driver.
LAUNCHER_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: CDS messages off: a JVM whose class path differs from the archive's (e.g. a driver with another
#: ``SPARK_CONF_DIR``) runs without the archive, silently, instead of printing a warning.
_CDS_QUIET = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"
#: The application that loads the classes of a typical short run (session, SQL, Arrow Python
#: UDFs, a shuffle) while the driver JVM records them (``-XX:ArchiveClassesAtExit``).
_CDS_TRAINING_APP = """\
from pyspark.sql import SparkSession, functions as F
spark = SparkSession.builder.appName("plgd-cds-training").getOrCreate()
df = spark.range(200).withColumn("k", F.col("id") % 7)
def double(batches):
    for batch in batches:
        yield batch
df.mapInArrow(double, df.schema).groupBy("k").count().collect()
df.groupBy("k").applyInArrow(lambda t: t, df.schema).count()
spark.sparkContext.parallelize(range(10), 2).sum()
spark.stop()
"""


def _cds_key(python: str) -> str:
    """What the archive depends on: the JVM, the Spark jars and the interpreter that finds them."""
    java = shutil.which("java") or ""
    java_real = os.path.realpath(java) if java else ""
    try:
        import pyspark

        jars = Path(pyspark.__file__).parent / "jars"
        # a reinstalled pyspark has new jar files, which the JVM would refuse to map from the old archive
        spark = f"{pyspark.__version__}:{jars}:{jars.stat().st_mtime_ns if jars.exists() else 0}"
    except ImportError:
        spark = "none"
    stat = os.stat(java_real) if java_real else None
    parts = (java_real, str(stat.st_mtime_ns if stat else 0), spark, python)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def fast_jvm_start_env(cache_dir: str | os.PathLike[str] | None = None, *, python: str | None = None,
                       timeout: float = 300.0) -> dict[str, str]:
    """Return the environment variables that make each ``spark-submit`` start faster, for the tests.

    * ``SPARK_LAUNCHER_OPTS``: :data:`LAUNCHER_JAVA_OPTS` for the launcher JVM;
    * ``SPARK_SUBMIT_OPTS``: the driver JVM maps a dynamic class-data sharing archive (JDK 13+:
      ``-XX:SharedArchiveFile``) of the classes a short Spark run loads, so that it neither
      parses nor verifies them again (about 3 s less per ``spark-submit`` on 2 cores).

    The archive is built once per machine, JVM, pyspark and interpreter (a training run of
    ``spark-submit`` with ``-XX:ArchiveClassesAtExit``, under a file lock and the Spark lock, then
    renamed into place) in ``cache_dir`` (default ``$TMPDIR/plgd-spark-cds-<uid>``). When the build
    fails, only ``SPARK_LAUNCHER_OPTS`` is returned: the runs are slower, not different.
    Nothing of the Spark job changes: same JVM, same classes, same settings.

    :param python: the interpreter of the driver and workers (default ``sys.executable``).
    :param timeout: seconds for the training run.
    """
    python = python or sys.executable
    env = {"SPARK_LAUNCHER_OPTS": LAUNCHER_JAVA_OPTS}
    base = Path(cache_dir) if cache_dir else Path(tempfile.gettempdir()) / f"plgd-spark-cds-{os.getuid()}"
    base.mkdir(parents=True, exist_ok=True)
    archive = base / f"spark-{_cds_key(python)}.jsa"
    with open(base / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not archive.exists():
                _build_cds_archive(archive, python=python, timeout=timeout)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if archive.exists():
        env["SPARK_SUBMIT_OPTS"] = f"-XX:SharedArchiveFile={archive} {_CDS_QUIET}"
    return env


def cds_java_options(env: Mapping[str, str] | None = None) -> str:
    """The class-data sharing options of :func:`fast_jvm_start_env` in ``env`` (default
    ``os.environ``): its ``SPARK_SUBMIT_OPTS`` when that maps an archive (``-XX:SharedArchiveFile=``),
    else ``""`` (no archive was built, or its environment is not in use). For the JVMs that
    ``SPARK_SUBMIT_OPTS`` does not reach: a standalone cluster's daemons and executors."""
    opts = (os.environ if env is None else env).get("SPARK_SUBMIT_OPTS", "")
    return opts if "-XX:SharedArchiveFile=" in opts else ""


def _build_cds_archive(archive: Path, *, python: str, timeout: float) -> None:
    if shutil.which("java") is None:
        return
    with tempfile.TemporaryDirectory(prefix="plgd-cds-") as tmp:
        app = Path(tmp) / "train.py"
        app.write_text(_CDS_TRAINING_APP)
        partial = Path(tmp) / "spark.jsa"
        env = spark_submit_env(python=python)
        env.pop(LOCK_HELD_ENV, None)
        env["SPARK_SUBMIT_OPTS"] = f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds=off -Xlog:cds+dynamic=off"
        env["SPARK_LAUNCHER_OPTS"] = LAUNCHER_JAVA_OPTS
        driver_opts = FAST_LOCAL_SPARK_CONF["spark.driver.extraJavaOptions"]
        cmd = ["spark-submit", "--master", "local[2]", "--conf", "spark.ui.enabled=false",
               "--conf", f"spark.driver.extraJavaOptions={driver_opts}", str(app)]
        with spark_lock():
            try:
                proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, timeout=timeout)
            except (OSError, subprocess.TimeoutExpired):
                return
        if proc.returncode == 0 and partial.exists() and partial.stat().st_size > 0:
            shutil.move(str(partial), str(archive.with_suffix(".tmp")))
            os.replace(archive.with_suffix(".tmp"), archive)
