"""The chain monitor's rules (``etl.monitor``): which lags cross the author's thresholds, and the DAG's shape."""

from __future__ import annotations

import pickle
from datetime import datetime, timezone

import pytest

from airflow_provider_plgd.etl.monitor import build_monitor_dag, lag_problems
from airflow_provider_plgd.exceptions import ChainUnhealthyError
from airflow_provider_plgd.status import StreamLag

LAG = StreamLag("nats://n:4222", "EVENTS", last_seq=500, last_time="2026-01-01T02:00:00Z", messages=120, seconds=900.0)


def test_a_lag_counts_only_over_its_threshold():
    assert lag_problems(LAG, max_lag_messages=None, max_lag_seconds=None) == []
    assert lag_problems(LAG, max_lag_messages=120, max_lag_seconds=900) == []  # at the limit: fine
    assert lag_problems(LAG, max_lag_messages=119, max_lag_seconds=899.5) == [
        "lag: 120 messages behind the chain's head (at most 119)",
        "lag: 900 s behind the chain's head (at most 899.5 s)"]
    assert lag_problems(None, max_lag_messages=0, max_lag_seconds=0) == []  # no server: no lag to judge


def test_the_monitor_dag_and_its_error():
    dag = build_monitor_dag(start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), max_lag_messages=10)
    assert dag.task_ids == ["check_chain"] and not dag.catchup
    with pytest.raises(ValueError, match="max_lag_seconds"):
        build_monitor_dag(start_date=datetime(2026, 1, 1, tzinfo=timezone.utc), max_lag_seconds=-1)
    err = pickle.loads(pickle.dumps(ChainUnhealthyError("not healthy", ["hole: x"])))
    assert err.problems == ["hole: x"] and str(err) == "not healthy"
