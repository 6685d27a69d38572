"""The ETL's ``plan`` and ``summary`` steps as plain functions (``etl.plan_interval``, ``etl.summarize_interval``).

``plan_interval`` runs against a fake hook (the one fake: fixed counts, no server) and a real
storage root under ``tmp_path``: the tests read back the interval ledger it writes and the
``--py-files`` zip it builds. ``summarize_interval`` reads ledgers and application summaries
written with the project's own writers (``ledger.write_json``, ``spark.summary.write_summary``).
"""

from __future__ import annotations

import json
import logging
import zipfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_plgd import spark_deps, times
from airflow_provider_plgd.etl import DEFAULT_PARAMS, plan_interval, run_params_used, summarize_interval
from airflow_provider_plgd.etl.plan import IntervalPlan
from airflow_provider_plgd.exceptions import LedgerError, UntrustedRunParamError
from airflow_provider_plgd.plgd.event_types import EVENT_TYPES
from airflow_provider_plgd.run_params import RunParams, check_run_params, run_spark_conf_policy
from airflow_provider_plgd.spark.summary import summary_path, write_summary
from airflow_provider_plgd.tables import ledger
from airflow_provider_plgd.tables.layout import Layout

try:  # Airflow 3.x
    from airflow.sdk.exceptions import AirflowFailException
except ImportError:  # pragma: no cover - Airflow 2.11
    from airflow.exceptions import AirflowFailException  # type: ignore[no-redef]

UTC = timezone.utc
START, END = datetime(2026, 3, 1, 10, tzinfo=UTC), datetime(2026, 3, 1, 11, tzinfo=UTC)
INTERVAL = "20260301T100000Z_20260301T110000Z"
OWNER_A, OWNER_B = "e1407479-3136-56c0-9908-bb02fb0339e2", "5f3c1f4e-0c8a-4d3e-9a2b-7d9f0e6a1b2c"


class FakeHook:
    """Stands in for ``JetStreamHook``: the interval is complete and the stream holds fixed counts."""

    def __init__(self, stream: str, ranges: list[tuple[int, int, int]], scope_total: int | None = None) -> None:
        self.stream, self.ranges = stream, ranges
        self.scope_total = sum(c for _, _, c in ranges) if scope_total is None else scope_total
        self.calls: list[tuple[str, Any, dict[str, Any]]] = []

    def require_interval_complete(self, start, end, **kwargs):
        self.calls.append(("require_interval_complete", (start, end), kwargs))
        return {"complete": True}

    def count_ranges(self, read_filters, **kwargs):
        self.calls.append(("count_ranges", list(read_filters), kwargs))
        first = self.ranges[0][0] if self.ranges else 41
        stop = self.ranges[-1][1] if self.ranges else 41
        return {"stream": self.stream, "created": "2026-01-01T00:00:00Z", "state": {"messages": 100},
                "first_seq": first, "end_seq_exclusive": stop, "total": sum(c for _, _, c in self.ranges),
                "scope_total": self.scope_total, "read_total": sum(c for _, _, c in self.ranges),
                "ranges": [{"first_seq": a, "end_seq_exclusive": b, "count": c} for a, b, c in self.ranges]}

    def get_settings(self):
        return type("Settings", (), {"servers": ["nats://fake:4222"]})()


@pytest.fixture
def root(tmp_path, monkeypatch) -> str:
    """A local storage root; the --py-files zip goes to a private folder beside it."""
    monkeypatch.setenv(spark_deps.PY_FILES_DIR_ENV, str(tmp_path / "py_files"))
    (tmp_path / "root").mkdir()
    return str(tmp_path / "root")


def author(root: str, **params: Any) -> RunParams:
    """The DAG author's checked params (``build_etl_dag`` computes them from its ``params``)."""
    return check_run_params({**DEFAULT_PARAMS, "storage_root": root, **params},
                            spark_conf_policy=run_spark_conf_policy(None), storage_roots=[root],
                            jetstream_conn_id="plgd_jetstream_default")


def plan(root: str, hook: FakeHook, lineage: list | None = None, dag_params: dict[str, Any] | None = None,
         **params: Any) -> dict[str, Any]:
    """Plan with the run's ``params``; the DAG author's are ``dag_params`` (default: the same as the run's)."""
    made: list[str] = []

    def hook_factory(stream: str) -> FakeHook:
        made.append(stream)
        return hook

    result = plan_interval({**DEFAULT_PARAMS, "storage_root": root, **params}, start=START, end=END,
                           dag_id="plgd_events_etl", jetstream_conn_id="plgd_jetstream_default",
                           spark_conf_policy=run_spark_conf_policy(None), allowed_roots=[root],
                           author=author(root, **(params if dag_params is None else dag_params)),
                           fetch_range_messages=5, hook_factory=hook_factory,
                           report_lineage=None if lineage is None else lambda *a: lineage.append(a))
    assert made == [params.get("stream", "EVENTS")]
    assert IntervalPlan.from_dict(result.as_dict()) == result  # the XCom edge keeps every field
    return result.as_dict()


def stream_json(root: str, stream: str = "EVENTS") -> dict[str, Any]:
    return json.loads(Path(Layout.of(root).ledger_interval_dir(stream, INTERVAL), "stream.json").read_text())


# ---------------------------------------------------------------------------------------------
# plan_interval


def test_plan_interval_writes_the_ledger_builds_the_zip_and_returns_the_plan_xcom(root):
    hook, lineage = FakeHook("EVENTS", [(10, 16, 6), (16, 20, 3)]), []
    planned = plan(root, hook, lineage, settle_seconds=30, max_fetch_tasks=4)

    assert planned == {
        "storage_root": root, "interval_id": INTERVAL, "snapshot_time": "2026-03-01T11:00:00+00:00",
        "ledger": f"{root}/_ledger/EVENTS/interval={INTERVAL}", "owners": "all", "messages": 9,
        "fetch_ranges": [{"ledger_range": 0}, {"ledger_range": 1}], "py_files": planned["py_files"],
        "spark_skip": None,
    }
    zip_path = Path(planned["py_files"])
    assert zip_path.parent == Path(root).parent / "py_files"
    assert "airflow_provider_plgd/etl/plan.py" in zipfile.ZipFile(zip_path).namelist()
    # the hook: completeness with the run's settle time, then one count over plgd.> cut into ranges
    assert hook.calls[0] == ("require_interval_complete", (START, END), {"settle_seconds": 30.0})
    name, filters, kwargs = hook.calls[1]
    assert (name, filters) == ("count_ranges", [ledger.SCOPE_FILTER])
    # the interval's bounds as unix ns (times.Interval)
    assert kwargs == {"start_time": times.to_ns(START), "end_time": times.to_ns(END), "range_messages": 5, "max_ranges": 4,
                      "scope_filter": ledger.SCOPE_FILTER}
    assert lineage == [(["nats://fake:4222"], "EVENTS", Layout.of(root))]
    record = stream_json(root)
    assert record["total"] == 9 and record["fetch_ranges"] == 2 and record["owners"] is None
    assert record["ranges"] == [{"index": 0, "first_seq": 10, "end_seq_exclusive": 16, "count": 6},
                                {"index": 1, "first_seq": 16, "end_seq_exclusive": 20, "count": 3}]
    assert record["deleted_in_range"] == 1  # 10 sequences hold 9 messages
    assert record["read_filters"] == [ledger.SCOPE_FILTER] and record["event_types"] == list(EVENT_TYPES)
    assert record["spark_skip"] is None


def test_plan_interval_for_spark_connect_builds_no_py_files_zip(root, tmp_path):
    """A DAG on Spark Connect plans with ``build_py_files=False``: the applications ship their code
    with ``addArtifacts``, so no zip is built and the XCom's ``py_files`` is None."""
    hook = FakeHook("EVENTS", [(10, 16, 6)])
    planned = plan_interval({**DEFAULT_PARAMS, "storage_root": root}, start=START, end=END,
                            dag_id="plgd_events_etl", jetstream_conn_id="plgd_jetstream_default",
                            spark_conf_policy=run_spark_conf_policy(None), allowed_roots=[root], author=author(root),
                            fetch_range_messages=5, hook_factory=lambda stream: hook, build_py_files=False)
    assert planned.py_files is None and planned.as_dict()["py_files"] is None
    assert IntervalPlan.from_dict(planned.as_dict()) == planned  # the XCom edge keeps the None
    assert not list(tmp_path.rglob("*.zip"))  # no zip anywhere, neither beside nor on the root
    assert (planned.messages, planned.fetch_ranges, stream_json(root)["total"]) == (6, 1, 6)  # planned the same


def test_plan_interval_with_selected_owners_and_event_types(root):
    hook = FakeHook("EVENTS", [(1, 5, 4)], scope_total=10)
    planned = plan(root, hook, owners=[OWNER_A], event_types="devicesregistered")

    assert planned["owners"] == 1 and planned["messages"] == 4
    assert hook.calls[1][1] == [ledger.owner_filter(OWNER_A)]
    record = stream_json(root)
    assert record["owners"] == [OWNER_A] and record["event_types"] == ["devicesregistered"]
    assert record["not_requested"] == 6


def test_plan_interval_of_an_empty_interval_without_snapshot_skips_spark(root):
    planned = plan(root, FakeHook("EVENTS", []))

    assert planned["messages"] == 0 and planned["fetch_ranges"] == []
    reason = "the stream holds no message for the interval and there is no snapshot yet"
    assert planned["spark_skip"] == reason and stream_json(root)["spark_skip"] == reason


def test_plan_interval_refuses_a_rerun_with_fewer_messages_without_retries(root):
    plan(root, FakeHook("EVENTS", [(1, 8, 7)]))
    with pytest.raises(AirflowFailException, match=r"^FewerMessagesError: .*7.*5") as err:
        plan(root, FakeHook("EVENTS", [(3, 8, 5)]))
    assert type(err.value.__cause__).__name__ == "FewerMessagesError"
    assert stream_json(root)["total"] == 7  # the ledger of the first run stays

    assert plan(root, FakeHook("EVENTS", [(3, 8, 5)]), accept_fewer_messages=True)["messages"] == 5
    assert stream_json(root)["total"] == 5


def test_plan_interval_refuses_a_hostile_owner_before_reading_or_writing(root, tmp_path):
    hook = FakeHook("EVENTS", [(1, 2, 1)])
    with pytest.raises(UntrustedRunParamError, match=r"owner_id.*'a\.\*'"):
        plan_interval({**DEFAULT_PARAMS, "storage_root": root, "owners": ["a.*"]}, start=START, end=END,
                      dag_id="d", jetstream_conn_id="plgd_jetstream_default",
                      spark_conf_policy=run_spark_conf_policy(None), allowed_roots=[root], author=author(root),
                      hook_factory=lambda stream: hook)
    assert hook.calls == [] and list(Path(root).iterdir()) == []


def test_plan_interval_refuses_a_storage_root_nobody_allowed(root, tmp_path):
    with pytest.raises(UntrustedRunParamError, match="is not a root this DAG allows"):
        plan_interval({**DEFAULT_PARAMS, "storage_root": str(tmp_path / "elsewhere")}, start=START, end=END,
                      dag_id="d", jetstream_conn_id="no_such_connection",
                      spark_conf_policy=run_spark_conf_policy(None), allowed_roots=[root], author=author(root),
                      hook_factory=lambda stream: pytest.fail("no hook before the params are checked"))
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize(("setting", "value", "dag", "shown"), [
    ("stream", "KV_settings", "'EVENTS'", "'KV_settings'"), ("lookback_intervals", 0, "24", "0"),
    ("max_content_bytes", 1, "4194304", "1"), ("owners", [OWNER_A], "all owners", repr([OWNER_A])),
    ("event_types", ["devicesregistered"], "all event types", "['devicesregistered']"),
])
def test_plan_interval_refuses_a_run_that_changes_the_pipeline_identity_before_any_io(root, setting, value, dag,
                                                                                      shown):
    """Cases 2-4 of "No silent loss, round 4": another stream, decode limit, lookback or a selection on
    the DAG's own root; refused without retries, before the hook or the storage root is touched."""
    import re

    hook = FakeHook("EVENTS", [(1, 2, 1)])
    with pytest.raises(AirflowFailException, match=rf"^PipelineIdentityError: .*\n  {setting}: the DAG author's "
                                                   rf"{re.escape(dag)}, this run {re.escape(shown)}\n"):
        plan(root, hook, dag_params={}, **{setting: value})
    assert hook.calls == [] and list(Path(root).iterdir()) == []


def test_plan_interval_records_the_identity_and_refuses_a_dag_that_changed_it(root):
    plan(root, FakeHook("EVENTS", [(1, 3, 2)]))
    recorded = json.loads(Path(root, "_ledger", "pipeline.json").read_text())
    assert recorded == {"version": 1, "storage_root": root, "stream": "EVENTS", "owners": None,
                        "event_types": sorted(EVENT_TYPES), "lookback_intervals": 24, "max_content_bytes": 4194304}
    before = stream_json(root)
    hook = FakeHook("EVENTS", [(1, 3, 2)])
    # the DAG author edits the DAG file (lookback 6) and the root keeps the tables of lookback 24
    with pytest.raises(AirflowFailException, match=r"^PipelineIdentityError: .*recorded in .*pipeline.json.*\n"
                                                   r"  lookback_intervals: recorded .*24, this run 6"):
        plan(root, hook, lookback_intervals=6)
    assert hook.calls == [] and stream_json(root) == before


def test_plan_interval_lets_a_run_write_a_narrower_view_to_another_allowed_root(tmp_path, monkeypatch):
    monkeypatch.setenv(spark_deps.PY_FILES_DIR_ENV, str(tmp_path / "py_files"))
    own, views = str(tmp_path / "lake"), str(tmp_path / "views")
    view = f"{views}/owner-a"
    planned = plan_interval({**DEFAULT_PARAMS, "storage_root": view, "owners": [OWNER_A]}, start=START, end=END,
                            dag_id="d", jetstream_conn_id="plgd_jetstream_default",
                            spark_conf_policy=run_spark_conf_policy(None), allowed_roots=[own, views],
                            author=author(own), hook_factory=lambda stream: FakeHook("EVENTS", [(1, 3, 2)])).as_dict()
    assert planned["storage_root"] == view and planned["owners"] == 1
    assert json.loads(Path(view, "_ledger", "pipeline.json").read_text())["owners"] == [OWNER_A]
    assert not Path(own).exists()


# ---------------------------------------------------------------------------------------------
# summarize_interval


def write_interval(root: str, *, decoded: int = 3, kept: int = 3, duplicates: int = 0,
                   id_conflicts: int | None = None) -> None:
    """A ledger of 3 messages in one range, staged by one fetch task (2 of owner A, 1 of owner B),
    and the decode, dedupe and rebuild summaries, written with the project's writers."""
    counted = FakeHook("EVENTS", [(1, 4, 3)]).count_ranges([ledger.SCOPE_FILTER])
    record = ledger.PlanRecord.of(counted, interval_id=INTERVAL, owners=None, event_types=list(EVENT_TYPES),
                                  read_filters=[ledger.SCOPE_FILTER], bounds={"start": START.isoformat()}).as_dict()
    record["spark_skip"] = None
    base = Layout.of(root).ledger_interval_dir("EVENTS", INTERVAL)
    ledger.write_ledger_file(f"{base}/stream.json", record)
    event_types = {"devicesregistered": {"count": 2, "bytes": 10, "batches": 1, "files": 1, "first_seq": 1,
                                         "last_seq": 2},
                   "resourcechanged": {"count": 1, "bytes": 5, "batches": 1, "files": 1, "first_seq": 3, "last_seq": 3}}
    ledger.write_ledger_file(f"{base}/fetch/{ledger.range_record_name(0)}",
                      ledger.FetchRecord(interval_id=INTERVAL, stream="EVENTS",
                                         range=ledger.PlanRange.from_dict(record["ranges"][0]), staged=3, skipped={},
                                         event_types=event_types, run_version=None, owners=2).as_dict())
    for app, summary in {
        "decode": {"fetched": 3, "decoded": decoded, "quarantined": 3 - decoded,
                   "per_reason": {"bad_cbor": 3 - decoded} if decoded < 3 else {}},
        "dedupe": {"input": decoded, "output": kept, "duplicates": duplicates, "within_batch_duplicates": duplicates,
                   "cross_batch_duplicates": 0, **({} if id_conflicts is None else {"id_conflicts": id_conflicts})},
        "rebuild": {"version": "20260301T110000Z", "rows": {"resources": 1}},
    }.items():
        write_summary(summary_path(Layout.of(root), app, INTERVAL), summary)


def test_summarize_interval_returns_the_reconciled_chain_with_counts_per_event_type(root, caplog):
    write_interval(root, decoded=2, kept=1, duplicates=1)
    params = {**DEFAULT_PARAMS, "owners": [OWNER_A], "max_fetch_tasks": 3}
    with caplog.at_level(logging.INFO, logger="airflow_provider_plgd.etl"):
        result = summarize_interval(Layout.of(root), "EVENTS", INTERVAL, params).as_dict()

    assert result["fetched"] == {"devicesregistered": 2, "resourcechanged": 1}  # nothing per owner
    assert result["reconciled"] is True and result["problems"] == []
    assert result["interval_id"] == INTERVAL and result["fetched_total"] == 3
    assert result["params"] == run_params_used(params, root)
    assert result["params"]["max_fetch_tasks"] == 3 and result["params"]["storage_root"] == root
    chain = result["chain"]
    assert (chain["stream_total"], chain["staged"], chain["owners_per_range"], chain["decoded"], chain["quarantined"],
            chain["kept"], chain["duplicates_within_interval"]) == (3, 3, [2], 2, 1, 1, 1)
    assert result["decode"]["per_reason"] == {"bad_cbor": 1}
    assert result["rebuild"]["version"] == "20260301T110000Z"
    written = json.loads(Path(Layout.of(root).ledger_interval_dir("EVENTS", INTERVAL), "summary.json").read_text())
    assert written["reconciled"] is True and written["chain"] == chain
    lines = [r.getMessage() for r in caplog.records if r.name == "airflow_provider_plgd.etl"]
    assert "  fetched event_type=devicesregistered count=2" in lines
    assert "  fetched event_type=resourcechanged count=1" in lines
    assert "Snapshot 20260301T110000Z rows: {'resources': 1}" in lines
    assert "Reconciled: True; lag " in lines[-1]


def test_summarize_interval_raises_ledger_error_when_the_chain_does_not_add_up(root, caplog):
    write_interval(root, decoded=3, kept=2, duplicates=0)  # dedupe lost one event
    with caplog.at_level(logging.INFO, logger="airflow_provider_plgd.etl"), pytest.raises(LedgerError) as err:
        summarize_interval(Layout.of(root), "EVENTS", INTERVAL, DEFAULT_PARAMS)

    problem = "dedupe: 3 read != 2 kept + 0 duplicates dropped"
    assert str(err.value) == f"interval {INTERVAL} does not reconcile: {problem}"
    assert err.value.interval_id == INTERVAL and err.value.problems == [problem]
    written = json.loads(Path(Layout.of(root).ledger_interval_dir("EVENTS", INTERVAL), "summary.json").read_text())
    assert written["reconciled"] is False and written["problems"] == [problem]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [f"Does not reconcile: {problem}"]


def test_summarize_interval_counts_id_conflicts_among_the_kept_rows(root):
    """Rows kept under a message ID that another content also has (a Nats-Msg-Id reused outside
    JetStream's duplicate window) are part of the kept rows: more of them than rows kept is a problem."""
    write_interval(root, decoded=3, kept=3, id_conflicts=1)
    result = summarize_interval(Layout.of(root), "EVENTS", INTERVAL, DEFAULT_PARAMS).as_dict()
    assert result["reconciled"] is True and result["chain"]["id_conflicts_kept"] == 1
    write_interval(root, decoded=3, kept=3, id_conflicts=4)
    with pytest.raises(LedgerError) as err:
        summarize_interval(Layout.of(root), "EVENTS", INTERVAL, DEFAULT_PARAMS)
    assert err.value.problems == ["dedupe: 4 ID conflicts kept, not within the 3 rows kept"]


def test_summarize_interval_without_a_ledger_names_where_the_plan_writes_it(root):
    with pytest.raises(LedgerError, match=rf"interval {INTERVAL} does not reconcile: no ledger at "
                                          rf"{root}/_ledger/EVENTS/interval={INTERVAL} \(the plan task writes it\)"):
        summarize_interval(Layout.of(root), "EVENTS", INTERVAL, DEFAULT_PARAMS)


def test_summarize_interval_expires_the_staging_of_reconciled_intervals_past_the_retention(root, caplog):
    """``build_etl_dag(staging_retention=…)``: after an interval reconciles, the staging of every
    reconciled interval staged longer ago than the retention is removed (a Delta commit) and
    vacuumed; an interval that did not reconcile keeps its staging, and so does another DAG's batch."""
    from deltalake import DeltaTable

    from airflow_provider_plgd.fetch.stager import Stager
    from airflow_provider_plgd.tables import staging, staging_commits

    failed = "20260301T090000Z_20260301T100000Z"
    other = "seq-000000000001-000000000009"  # a batch of another DAG (no ledger)
    for iid in (INTERVAL, failed, other):
        stager = Stager(stream="EVENTS", spill_dir=None)
        stager.add(OWNER_A, "devicesregistered", [(1, "s", 1, None, b"x"), (2, "s", 2, None, b"y")])
        records = stager.write(Layout.of(root).staging_table("EVENTS"), iid, staging.batch_file_prefix(OWNER_A, "w"))
        staging_commits.commit_batches(Layout.of(root), "EVENTS", iid, OWNER_A, ["devicesregistered"], records, 1)
    ledger.write_ledger_file(f"{Layout.of(root).ledger_interval_dir('EVENTS', failed)}/summary.json",
                      {"version": ledger.LEDGER_VERSION, "reconciled": False})
    write_interval(root, decoded=2, kept=1, duplicates=1)
    kept = summarize_interval(Layout.of(root), "EVENTS", INTERVAL, DEFAULT_PARAMS, staging_retention_seconds=3600).as_dict()
    assert kept["staging_expired"] is None and len(staging.staged_intervals(Layout.of(root), "EVENTS")) == 3
    with caplog.at_level(logging.INFO, logger="airflow_provider_plgd.etl"):
        done = summarize_interval(Layout.of(root), "EVENTS", INTERVAL, DEFAULT_PARAMS, staging_retention_seconds=0).as_dict()
    assert done["staging_expired"]["intervals"] == [INTERVAL] and done["staging_expired"]["rows"] == 2
    rows = DeltaTable(Layout.of(root).staging_table("EVENTS")).to_pyarrow_table().to_pylist()
    assert sorted({r["interval_id"] for r in rows}) == sorted([failed, other])
    assert any("Expired the staging of 1 reconciled interval(s)" in r.getMessage() for r in caplog.records)
