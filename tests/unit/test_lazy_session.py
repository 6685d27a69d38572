"""airflow_provider_plgd.spark.common.LazySparkSession with a fake SparkContext and a fake session builder.

The real one runs in every spark-submit of the integration tests: decode ``--reader arrow`` never
builds the SQL session there, ``--reader spark`` and dedupe's Spark decision do.
"""

from __future__ import annotations

from airflow_provider_plgd.spark.common import LazySparkSession


class FakeContext:
    _jsc = "jsc"
    _jvm = "jvm"

    def __init__(self):
        self.stopped = False

    def stop(self):
        self.stopped = True


class FakeSession:
    def __init__(self):
        self.read = "the DataFrameReader"
        self.stopped = False

    def stop(self):
        self.stopped = True


def test_context_and_jvm_without_building_the_session():
    sc, built = FakeContext(), []
    spark = LazySparkSession(sc, lambda: built.append(1) or FakeSession())
    assert spark.sparkContext is sc and spark._sc is sc
    assert (spark._jsc, spark._jvm) == ("jsc", "jvm")
    spark.stop()
    assert sc.stopped and built == []


def test_sql_attributes_build_the_session_once_and_stop_stops_it():
    sc, sessions = FakeContext(), []

    def build():
        sessions.append(FakeSession())
        return sessions[-1]

    spark = LazySparkSession(sc, build)
    assert spark.read == "the DataFrameReader"
    assert spark.read == "the DataFrameReader"
    assert len(sessions) == 1 and spark.session is sessions[0]
    spark.stop()
    assert sessions[0].stopped and not sc.stopped


def test_dunder_lookups_do_not_build_the_session():
    spark = LazySparkSession(FakeContext(), lambda: (_ for _ in ()).throw(AssertionError("built")))
    assert not hasattr(spark, "__wrapped__")
    assert repr(spark).startswith("<airflow_provider_plgd.spark.common.LazySparkSession")
