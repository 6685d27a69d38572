"""Start the Python workers of a Spark application early, while the driver plans its work.

PySpark starts its Python daemon at the first Python task and forks one worker per task slot;
each worker then imports what its task needs (pyarrow, protobuf, the plgd codec). Those imports,
plus the daemon's boot, come before the first row of every application (figures:
docs/performance.md, "Measurements behind design choices", M5).

:func:`start_python_workers` submits a small job from a background thread right after the
SparkContext exists: ``defaultParallelism`` tasks that only import the application's modules.
It runs while the driver plans (lists manifests, reads Parquet footers; dedupe decides on the
driver for seconds), so the first real tasks find warm workers; ``spark.python.worker.reuse``
(on by default) keeps them between jobs. Nothing waits for it: Spark's FIFO scheduler runs the
jobs in the order they were submitted, so when the driver plans for only a moment (decode,
M6) its job may come first and the warm-up tasks run after it; either way, whatever of the
warm-up is not yet done counts in the application's own time.

Sources: PySpark's ``daemon.py`` and ``PythonWorkerFactory``; ``spark.python.worker.reuse`` in
the Spark configuration reference.
"""

from __future__ import annotations

import logging
import threading
from typing import Sequence

log = logging.getLogger("plgd.spark")


def start_python_workers(sc, modules: Sequence[str]) -> threading.Thread:
    """Run a job of ``sc.defaultParallelism`` tasks that import ``modules``, from a background thread.

    :param sc: the application's ``pyspark.SparkContext``.
    :param modules: importable module names (strings), e.g. ``("pyarrow.parquet", "airflow_provider_plgd.spark.decode_batch")``.
    :return: the started daemon thread (``join()`` it to wait for the warm-up; nothing needs to).
        A failure of the warm-up job (e.g. Spark stopped meanwhile) is logged as a warning and
        otherwise ignored: a real problem, such as a missing module, fails the real job with
        Spark's own error.
    :raises TypeError: ``modules`` is a single string instead of a sequence of names.
    """
    if isinstance(modules, str):
        raise TypeError(f"modules must be a sequence of module names, got the string {modules!r}")
    names = [str(m) for m in modules]

    def warm(_items):
        import importlib

        for name in names:
            importlib.import_module(name)
        yield len(names)

    def job() -> None:
        try:
            slots = max(1, int(sc.defaultParallelism))
            sc.setJobDescription("plgd: start the Python workers")
            sc.parallelize(range(slots), slots).mapPartitions(warm).collect()
        except Exception as exc:  # noqa: BLE001 - only a warm-up; the real job reports real errors
            log.warning("warming up the Python workers failed (the application goes on): %s", exc)

    thread = threading.Thread(target=job, name="plgd-python-workers", daemon=True)
    thread.start()
    return thread
