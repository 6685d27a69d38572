"""spark.executor_tasks without Spark: the choice of implementation, the task slots from the
settings, and the shuffle's partition rule (the Spark paths run in tests/integration/
test_spark_connect.py and the classic application tests). The one fake: a session with a ``conf``."""

from __future__ import annotations

import pytest

from airflow_provider_plgd.spark import executor_tasks as et


class _Conf:
    def __init__(self, values):
        self.values = values

    def get(self, key, default=None):
        return self.values.get(key, default)


class ClassicSession:
    def __init__(self, **conf):
        self.conf = _Conf(conf)


ConnectSession = type("SparkSession", (ClassicSession,), {"__module__": "pyspark.sql.connect.session"})


def test_the_implementation_follows_the_session_and_the_setting():
    assert et.executor_api(ClassicSession()) == "rdd"
    assert et.executor_api(ConnectSession()) == "dataframe"
    assert et.executor_api(ClassicSession(**{et.EXECUTOR_API_CONF: " DataFrame "})) == "dataframe"
    with pytest.raises(ValueError, match="no RDD API"):
        et.executor_api(ConnectSession(**{et.EXECUTOR_API_CONF: "rdd"}))
    with pytest.raises(ValueError, match="'pandas'"):
        et.executor_api(ClassicSession(**{et.EXECUTOR_API_CONF: "pandas"}))


def test_task_slots_from_the_settings():
    assert et.default_parallelism(ConnectSession(**{"spark.default.parallelism": "12"})) == 12
    assert et.default_parallelism(ConnectSession(**{et.PARALLELISM_CONF: "3", "spark.default.parallelism": "12"})) == 3
    with pytest.raises(ValueError, match="positive integer, got '0'"):
        et.default_parallelism(ConnectSession(**{et.PARALLELISM_CONF: "0"}))
    with pytest.raises(ValueError, match="got 'many'"):
        et.default_parallelism(ClassicSession(**{"spark.default.parallelism": "many"}))


def test_shuffle_partitions_like_partition_by():
    assert [et.Shuffle(4, iter).target(k) for k in (0, 5, -1, 11)] == [0, 1, 3, 3]
    copy_of = {7: 2}
    shuffle = et.Shuffle(3, iter, partition_of=lambda k: copy_of.get(k, 0))
    assert [shuffle.target(k) for k in (7, 8)] == [2, 0]
    with pytest.raises(ValueError, match="at least 1 partition, got 0"):
        et.Shuffle(0, iter)


def test_no_tasks_no_job():
    assert et.run_tasks(ClassicSession(), [], iter) == []
