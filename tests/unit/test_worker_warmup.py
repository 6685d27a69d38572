"""airflow_provider_plgd.spark.worker_warmup and the apps' ``WORKER_MODULES``, with a fake SparkContext.

The real warm-up runs in every spark-submit of the integration tests (``--warm-up-workers`` is
on by default); its effect is measured in bench/bench_decode.py.
"""

from __future__ import annotations

import importlib
import sys

import pytest

from airflow_provider_plgd.spark import worker_warmup
from airflow_provider_plgd.spark_apps import decode_events, dedupe_events, rebuild_snapshots


class FakeRDD:
    def __init__(self, sc, items, slices):
        self.sc, self.items, self.slices = sc, list(items), slices

    def mapPartitions(self, fn):  # noqa: N802 - PySpark's name
        self.sc.calls.append(("mapPartitions", self.slices))
        self.fn = fn
        return self

    def collect(self):
        if self.sc.fail:
            raise RuntimeError("SparkContext was shut down")
        return [x for part in range(self.slices) for x in self.fn(iter(self.items[part::self.slices]))]


class FakeContext:
    """Records the job the warm-up submits (one fake at a time: Spark itself)."""

    def __init__(self, parallelism=3, fail=False):
        self.defaultParallelism = parallelism
        self.fail = fail
        self.calls = []
        self.results = None

    def setJobDescription(self, text):  # noqa: N802 - PySpark's name
        self.calls.append(("description", text))

    def parallelize(self, items, slices):
        self.calls.append(("parallelize", list(items), slices))
        rdd = FakeRDD(self, items, slices)
        original = rdd.collect

        def collect():
            self.results = original()
            return self.results

        rdd.collect = collect
        return rdd


def test_one_task_per_slot_imports_the_modules():
    sys.modules.pop("colorsys", None)
    sc = FakeContext(parallelism=3)
    worker_warmup.start_python_workers(sc, ["colorsys", "json"]).join(timeout=10)
    assert ("parallelize", [0, 1, 2], 3) in sc.calls
    assert ("description", "plgd: start the Python workers") in sc.calls
    assert sc.results == [2, 2, 2]  # each task imported both modules
    assert "colorsys" in sys.modules


def test_a_failed_warm_up_is_a_warning_not_an_error(caplog):
    sc = FakeContext(fail=True)
    with caplog.at_level("WARNING", logger="plgd.spark"):
        worker_warmup.start_python_workers(sc, ["json"]).join(timeout=10)
    assert "warming up the Python workers failed" in caplog.text
    assert "SparkContext was shut down" in caplog.text


def test_a_single_string_is_refused():
    with pytest.raises(TypeError, match="'pyarrow'"):
        worker_warmup.start_python_workers(FakeContext(), "pyarrow")


@pytest.mark.parametrize("app", [decode_events, dedupe_events, rebuild_snapshots])
def test_worker_modules_of_every_app_import(app):
    # a typo would only log a warning at run time, so check the names here
    assert app.WORKER_MODULES
    for name in app.WORKER_MODULES:
        importlib.import_module(name)


@pytest.mark.parametrize("value", ["on", "off"])
def test_apps_accept_warm_up_workers(value):
    args = decode_events.parse_args(["--staging-root", "/r", "--output-root", "/o", "--interval-id", "x",
                                     "--warm-up-workers", value])
    assert args.warm_up_workers == value
