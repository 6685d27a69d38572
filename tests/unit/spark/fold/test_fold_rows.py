"""Unit tests of airflow_provider_plgd/spark/fold/: the state's JSON round trip and its errors, the
device rows of a folded state, the simulator's ground truth (decode_batch -> dedupe by msg_id ->
fold), the Arrow glue that the Spark UDF runs, one bucket's rebuild (snapshot_buckets), and a fold
rule for every event type. No Spark.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest

from airflow_provider_plgd.plgd import event_types
from airflow_provider_plgd.spark import fold, snapshot_buckets
from airflow_provider_plgd.spark.fold import dumps_state, fold_device, loads_state
from airflow_provider_plgd.tables.layout import Layout
from tests.unit.spark.fold.fold_events import DEV, END, OWNER, SEC, T0, changed, conn, link, md, ra, reg, resource, run

# ------------------------------------------------------------------------------------------
# State round trip and errors
# ------------------------------------------------------------------------------------------

def test_state_round_trip_keeps_bytes_and_is_canonical():
    st = run([changed(0, b"\x00\xff"), ra("resourceretrievepending", 1, correlation_id="r", valid_until=0,
                                         etags=[b"\x01"])])
    text = dumps_state(st)
    back = loads_state(text)
    assert back == st and dumps_state(back) == text
    assert resource(back)["latest"]["content_digest"] == fold._digest(b"\x00\xff")


def test_loads_state_rejects_garbage():
    with pytest.raises(ValueError, match="not valid JSON"):
        loads_state("{nope")
    with pytest.raises(ValueError, match="format"):
        loads_state('{"format": 99}')


def test_unknown_event_type_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown event type 'bogus'"):
        run([{"event_type": "bogus", "version": 0}])


# ------------------------------------------------------------------------------------------
# Device rows and the simulator's ground truth (decode_batch -> dedupe by msg_id -> fold)
# ------------------------------------------------------------------------------------------

def test_device_rows_columns_match_the_contract():
    from airflow_provider_plgd.plgd.tables import SNAPSHOT_TABLES

    st = run([
        reg("devicesregistered", T0),
        changed(0), ra("resourceupdatepending", 1, correlation_id="u", valid_until=0),
        md(0, conn("ONLINE", "c1")),
        ra("devicemetadataupdatepending", 1, correlation_id="t", valid_until=0,
           update_pending="twin_force_synchronization", update_pending_value=True),
        ra("resourcelinkspublished", 3, resources=[link("/a")]),
    ])
    rows = fold.device_rows(st, END)
    for table, columns in SNAPSHOT_TABLES.items():
        assert len(rows[table]) == 1, table
        assert list(rows[table][0]) == [c for c, _, _ in columns], table
    r = rows["resources"][0]
    assert r["etag"] == "ZXRhZzA=" and r["status"] == "OK" and r["content_json"] == '{"on":true}'
    assert r["update_pendings"] == [{"correlation_id": "u", "valid_until": 0, "version": 1,
                                     "timestamp": T0 + 2 * SEC}]
    m = rows["device_metadata"][0]
    assert m["update_pendings"][0]["twin_force_synchronization"] is True
    assert m["update_pendings"][0]["twin_enabled"] is None and m["connection_status"] == "ONLINE"
    lk = rows["device_links"][0]
    assert (lk["version"], lk["complete"], lk["missing_versions"]) == (3, False, [{"first": 0, "last": 2}])
    assert rows["owner_devices"][0] == {"owner_id": OWNER, "owner": "owner-a", "device_id": DEV,
                                        "registered_at": T0}
    # a tombstone has no rows
    st = run([reg("devicesunregistered", T0 + 100 * SEC)], st)
    assert all(v == [] for v in fold.device_rows(st, END).values())


def _sim_fold(config, batches=None):
    """Decode the simulator's messages per interval, keep the first copy of every msg_id, fold
    device by device with a JSON round trip of the state between batches (as the Spark app
    does), and yield (last interval of the batch, rows, expected rows at its end).

    :param batches: lists of interval indexes folded together, snapshot time = end of the last
        one (default: one batch per interval).
    """
    from collections import defaultdict

    import pyarrow as pa

    from airflow_provider_plgd import times
    from airflow_provider_plgd.plgd.tables import SNAPSHOT_SORT_KEYS
    from airflow_provider_plgd.simulator import expected_state, generate
    from airflow_provider_plgd.spark import decode_batch

    sim = generate(config)
    bounds = config.interval_bounds()
    seen: set[str] = set()
    states: dict[str, str] = {}
    for batch_intervals in batches or [[k] for k in range(len(bounds))]:
        by_device = defaultdict(list)
        for k in batch_intervals:
            start, end = bounds[k]
            msgs = [(seq, m) for seq, m in enumerate(sim.messages, start=1) if m.interval == k]
            batch = pa.RecordBatch.from_pydict({
                "stream": ["EVENTS"] * len(msgs),
                "stream_seq": [seq for seq, _ in msgs],
                "subject": [m.subject for _, m in msgs],
                "published_at": pa.array([start // 1000] * len(msgs), pa.timestamp("us", tz="UTC")),
                "msg_id": pa.nulls(len(msgs), pa.string()),
                "data": [m.data for _, m in msgs],
            })
            decoded = decode_batch.decode_batch(batch, times.interval_id(start, end)).to_pylist()
            for row in sorted((r for r in decoded if r["reason"] is None), key=lambda r: r["stream_seq"]):
                if row["msg_id"] in seen:
                    continue
                seen.add(row["msg_id"])
                for device in (row["device_ids"] if row["event_type"].startswith("devices") else [row["device_id"]]):
                    by_device[device].append(row)
        k = batch_intervals[-1]
        end = bounds[k][1]
        got = {t: [] for t in fold.SNAPSHOT_TABLE_NAMES}
        for device in sorted(set(by_device) | set(states)):
            state = loads_state(states[device]) if device in states else None
            state = fold_device(device, state, by_device.get(device, []), snapshot_time_ns=end)
            states[device] = dumps_state(state)
            for table, rows in fold.device_rows(state, end).items():
                got[table].extend(rows)
        for table, keys in SNAPSHOT_SORT_KEYS.items():
            got[table].sort(key=lambda r: tuple(r[c] for c in keys))
        yield k, got, expected_state(sim, k)


@pytest.mark.parametrize("config_kw", [
    dict(seed=3, intervals=3, duplicates=0.05, unregister=True, version_gaps=True, old_hub_snapshots=True, corrupt=2),
    dict(seed=5, owners=3, devices_per_owner=4, intervals=4, steps_per_interval=60, duplicates=0.1,
         unregister=True, version_gaps=True, old_hub_snapshots=True, leadrt="first"),
])
def test_folding_simulated_traffic_gives_expected_state(config_kw):
    from airflow_provider_plgd.simulator import SimulationConfig

    for k, got, expected in _sim_fold(SimulationConfig(**config_kw)):
        for table in expected:
            assert got[table] == expected[table], f"interval {k} table {table}"


def test_incremental_fold_equals_one_fold_of_everything():
    """Folding interval by interval (state round trip in between) gives the same tables as one
    fold of all intervals at the last snapshot time, and both equal the ground truth."""
    from airflow_provider_plgd.simulator import SimulationConfig

    config = SimulationConfig(seed=7, intervals=4, duplicates=0.1, unregister=True, version_gaps=True,
                              old_hub_snapshots=True)
    *_, (k_inc, incremental, expected) = _sim_fold(config)
    [(k_all, at_once, _)] = _sim_fold(config, batches=[list(range(config.intervals))])
    assert k_inc == k_all == config.intervals - 1
    for table in expected:
        assert at_once[table] == incremental[table] == expected[table], table
    assert all(expected[t] for t in expected), "scenario too small: a table is empty"


# ------------------------------------------------------------------------------------------
# Arrow glue (what the Spark UDF runs) and one bucket's rebuild (snapshot_buckets)
# ------------------------------------------------------------------------------------------

def test_fold_bucket_arrow_matches_device_rows():
    import pyarrow as pa

    from airflow_provider_plgd.spark import schemas
    from airflow_provider_plgd.tables import snapshot_store

    table_schemas = {t: snapshot_store.table_schema(t) for t in snapshot_store.ALL_TABLES}
    first = [reg("devicesregistered", T0), changed(0), md(0, conn("ONLINE", "c1")),
             ra("resourceupdatepending", 1, correlation_id="u", valid_until=END + SEC)]

    def events_table(rows):
        full = [{c: r.get(c) for c in schemas.EVENTS_SCHEMA.names} | {"_bucket": 3, "_device": DEV} for r in rows]
        schema = schemas.EVENTS_SCHEMA.append(pa.field("_bucket", pa.int32())).append(pa.field("_device", pa.string()))
        return pa.Table.from_pylist(full, schema=schema)

    empty_states = pa.table({"device_id": pa.array([], pa.string()), "next_expiry_ns": pa.array([], pa.int64()),
                             "state_json": pa.array([], pa.string()), "_bucket": pa.array([], pa.int32())})
    out = fold.fold_bucket_arrow(events_table(first), empty_states, snapshot_time_ns=END, table_schemas=table_schemas)
    assert out.schema == fold.fold_output_schema(table_schemas)
    by_table = Counter(out.column("table").to_pylist())
    assert by_table == {"_device_state": 1, "resources": 1, "device_metadata": 1, "owner_devices": 1, "_stats": 1}
    state_row = next(r for r in out.to_pylist() if r["table"] == "_device_state")["_device_state"]
    assert state_row["next_expiry_ns"] == END + SEC
    expected = fold.device_rows(loads_state(state_row["state_json"]), END)
    got_res = [r["resources"] for r in out.to_pylist() if r["table"] == "resources"]
    assert got_res == expected["resources"]
    stats = json.loads(next(r for r in out.to_pylist() if r["table"] == "_stats")["stats_json"])
    assert stats["applied"] == 3 and stats["devices"] == 1
    # second batch: no new events, only the state with a pending expiring before the next snapshot
    states = pa.table({"device_id": [DEV], "next_expiry_ns": [END + SEC], "state_json": [state_row["state_json"]],
                       "_bucket": pa.array([3], pa.int32())})
    out2 = fold.fold_bucket_arrow(events_table([]), states, snapshot_time_ns=END + 2 * SEC,
                                  table_schemas=table_schemas)
    res2 = [r["resources"] for r in out2.to_pylist() if r["table"] == "resources"]
    assert res2[0]["update_pendings"] == []
    # nothing at all -> empty table
    empty = fold.fold_bucket_arrow(events_table([]), empty_states, snapshot_time_ns=END, table_schemas=table_schemas)
    assert empty.num_rows == 0


def test_rebuild_bucket_refolds_touched_devices_and_copies_the_rest(tmp_path):
    """snapshot_buckets.rebuild_bucket (the executor task of rebuild_snapshots) on a local folder."""
    import pyarrow as pa

    from airflow_provider_plgd.spark import schemas
    from airflow_provider_plgd.tables import snapshot_store

    table_schemas = {t: snapshot_store.table_schema(t) for t in snapshot_store.ALL_TABLES}
    dev_b = "00000000-0000-0000-0000-00000000000b"
    ev_schema = schemas.EVENTS_SCHEMA.append(pa.field("_bucket", pa.int32())).append(pa.field("_device", pa.string()))

    def events(rows, bucket=7):
        full = [{c: r.get(c) for c in schemas.EVENTS_SCHEMA.names}
                | {"_bucket": bucket, "_device": r.get("device_id") or (r.get("device_ids") or [None])[0]}
                for r in rows]
        return pa.Table.from_pylist(full, schema=ev_schema)

    def files(result):
        return {r["table"]: [str(tmp_path / "snapshots" / r["table"] / r["file"])]
                for r in result.to_pylist() if r["file"]}

    def resources(result):
        import pyarrow.parquet as pq

        path = files(result)["resources"][0]
        return pq.read_table(path).sort_by([(k, "ascending") for k in snapshot_store.sort_keys("resources")]).to_pylist()

    first = snapshot_buckets.rebuild_bucket(
        events([changed(0), ra("resourcelinkspublished", 0, resources=[link("/a")]),
                changed(0, device=dev_b),
                ra("resourceupdatepending", 1, device=dev_b, correlation_id="p", valid_until=END + 5 * SEC)]),
        snapshots=Layout.of(str(tmp_path)), run_id="a", old_files={}, table_schemas=table_schemas, snapshot_time_ns=END)
    rows = {r["table"]: r for r in first.to_pylist()}
    assert rows["resources"]["file"] == "bucket=7/part-a.parquet"
    assert json.loads(rows["resources"]["stats"])["numRecords"] == 2
    assert rows["resources"]["rows"] == 2 and rows["device_links"]["rows"] == 1
    assert rows["owner_devices"]["file"] is None  # no registrations in this bucket
    assert rows["_device_state"]["next_expiry_ns"] == END + 5 * SEC
    assert json.loads(rows["_stats"]["stats_json"])["devices"] == 2 and rows["_stats"]["events"] == 4
    old = files(first)

    # only DEV has new events: dev_b's rows are copied, not refolded
    second = snapshot_buckets.rebuild_bucket(
        events([changed(1, b"new", sequence=99)]), snapshots=Layout.of(str(tmp_path)), run_id="b", old_files=old,
        table_schemas=table_schemas, snapshot_time_ns=END + SEC)
    stats = json.loads(next(r for r in second.to_pylist() if r["table"] == "_stats")["stats_json"])
    assert stats["devices"] == 1
    res = resources(second)
    assert [(r["device_id"], r["version"]) for r in res] == [(DEV, 1), (dev_b, 1)]
    assert res[1]["update_pendings"][0]["correlation_id"] == "p"

    # a marker row only (no events): dev_b's pending expires, so dev_b is refolded
    marker = events([{"device_id": None}])
    third = snapshot_buckets.rebuild_bucket(marker, snapshots=Layout.of(str(tmp_path)), run_id="c", old_files=files(second),
                                          table_schemas=table_schemas, snapshot_time_ns=END + 10 * SEC)
    stats = json.loads(next(r for r in third.to_pylist() if r["table"] == "_stats")["stats_json"])
    assert stats == {"devices": 1, "expired_pendings": 1}
    res = resources(third)
    assert res[1]["update_pendings"] == [] and res[0]["version"] == 1
    assert next(r for r in third.to_pylist() if r["table"] == "_device_state")["next_expiry_ns"] is None


def test_spark_apps_run_from_the_py_files_zip_alone(tmp_path):
    """The fold/snapshot modules need only the ``--py-files`` zip (plgd model incl. the snapshot
    table schemas, staging): importing them from the zip loads neither the simulator (nats-py),
    Airflow nor pyspark."""
    import subprocess
    import sys

    from airflow_provider_plgd.spark_deps import build_py_files_zip

    zip_path = build_py_files_zip(tmp_path)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from airflow_provider_plgd.spark import fold, snapshot_buckets; "
            "from airflow_provider_plgd.tables import snapshot_store; "
            "from airflow_provider_plgd.spark_apps import dedupe_events, rebuild_snapshots; "
            "assert snapshot_store.__file__.startswith(sys.argv[1]), snapshot_store.__file__; "
            "assert snapshot_buckets.__file__.startswith(sys.argv[1]), snapshot_buckets.__file__; "
            "assert snapshot_store.table_schema('resources').names[0] == 'owner_id'; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('nats', 'airflow', 'pyspark') "
            "or m.startswith('airflow_provider_plgd.simulator')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code, zip_path], check=True, cwd=tmp_path)


@pytest.mark.parametrize("event_type", sorted(event_types.EVENT_TYPES))
def test_every_event_type_has_a_fold_rule(event_type):
    """Every type of ``plgd/event_types.py`` reaches a rule of the fold's chains (spark/fold/rules.py); a type added
    there without its rule fails here with "no fold rule for event type …"."""
    info = event_types.EVENT_TYPES[event_type]
    if info.aggregate is None:
        state = run([reg(event_type, T0 + SEC)])
        assert (state["registration"] is not None) == (event_type == fold.DEVICES_REGISTERED)
    else:
        ev = ra(event_type, 1)
        state = run([ev])
        assert state["aggregates"][ev["aggregate_id"]]["kind"] == info.aggregate


@pytest.mark.parametrize("like", ["resourcechanged", "resourcelinkspublished", "devicemetadataupdated",
                                  "devicesregistered"])
def test_an_event_type_without_a_fold_rule_is_an_error(monkeypatch, like):
    new = dataclasses.replace(event_types.EVENT_TYPES[like], name="somethingnew")
    patched = {**fold.EVENT_TYPES, "somethingnew": new}
    monkeypatch.setattr(fold, "EVENT_TYPES", patched)  # the test's own helpers read it here
    monkeypatch.setattr(fold.device, "EVENT_TYPES", patched)  # the fold's chains read it there
    ev = reg("somethingnew", T0 + SEC) if new.aggregate is None else ra("somethingnew", 1)
    with pytest.raises(ValueError, match="no fold rule for event type 'somethingnew'"):
        run([ev])
