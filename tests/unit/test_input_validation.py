"""Owner IDs, event types and stream names from params, connections or subjects can never build a
subject wildcard or a path outside the storage root.

Hostile values go to every place that turns them into a subject or a path: the token rule
(``plgd.subjects.validate_token``), the subject filters, the fetch operator's ``owner_id``/
``event_type``/``owner_ids``/``event_types``/``stream``, the ETL DAG's ``plan`` step, the staging
writer and reader, and the hook's stream name. Each must raise a ``ValueError`` that names the
value, before any connection is opened or any file is written: the tests snapshot the whole temp
directory (the storage root's parent) and require it unchanged.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_provider_plgd import staging
from airflow_provider_plgd.plgd.subjects import subject_filters, validate_token

UTC = timezone.utc
OWNER = "e1407479-3136-56c0-9908-bb02fb0339e2"

#: Values that must never become a subject token or a path segment.
HOSTILE = [
    "*", ">", "a*", "a>", "plgd.>", ".", "..", "../..", "a..b", "a.b", "/", "/etc/passwd", "../../etc",
    "a/b", "a\\b", "C:\\Windows", "..\\..", "a=b", "owner_id=x", "[ab]", "a?", "", " ", "a b", "a\tb",
    "a\nb", "\r", "a\x00b", "a\x1bb", "a\x7fb", "a\x85b", "a\u00a0b", "a\u2028b", "a\u202eb", "\ufeffa",
]

#: The subset that is unsafe in a path (``>`` and a single ``.`` inside a value are path-safe; the
#: token rule rejects them for subjects).
PATH_HOSTILE = [v for v in HOSTILE if v not in (">", "a>", "plgd.>", "a.b")]


def tree(path: Path) -> list[str]:
    """Every file and folder under ``path`` (relative), sorted."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def named(value: str) -> str:
    """How error messages quote a value (``repr``); the empty value is named by its field only."""
    return repr(value) if value else ""


# ---------------------------------------------------------------------------------------------
# the token rule and subject filters


@pytest.mark.parametrize("value", HOSTILE)
def test_validate_token_rejects_wildcards_separators_and_control_characters(value):
    with pytest.raises(ValueError) as err:
        validate_token(value, "owner_id")
    assert "owner_id" in str(err.value) and named(value) in str(err.value)


@pytest.mark.parametrize("value", [OWNER, "devicesregistered", "urn:uuid:x", "owner_ünï", "_filter", "a-b_c~d"])
def test_validate_token_accepts_plain_tokens(value):
    assert validate_token(value, "owner_id") == value


@pytest.mark.parametrize("value", [v for v in HOSTILE if v != "*"])  # "*" alone is the documented all-owners filter
def test_subject_filters_never_widen_for_a_hostile_owner(value):
    with pytest.raises(ValueError, match="owner_id"):
        subject_filters(value, "devicesregistered")


@pytest.mark.parametrize("value", HOSTILE + ["DevicesRegistered", "nosuchevent"])
def test_subject_filters_reject_hostile_event_types(value):
    with pytest.raises(ValueError):
        subject_filters(OWNER, value)


def test_validate_token_type_errors_name_the_field():
    for value in (None, 1, b"owner", ["a"]):
        with pytest.raises(TypeError, match="owner_id"):
            validate_token(value, "owner_id")


# ---------------------------------------------------------------------------------------------
# the fetch operator: fails before connecting or writing


@pytest.fixture
def unreachable_conn(monkeypatch):
    """A connection to TEST-NET-1: any attempt to connect would take seconds and fail differently."""
    monkeypatch.setenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT",
                       json.dumps({"conn_type": "plgd_jetstream", "host": "192.0.2.1", "port": 4222}))


def run_op(**kwargs):
    from airflow_provider_plgd.operators.jetstream_to_staging import JetStreamToStagingOperator

    return JetStreamToStagingOperator(task_id="fetch", start_seq=1, **kwargs).execute({"params": {}})


@pytest.mark.parametrize("value", HOSTILE)
def test_operator_rejects_hostile_owner_ids_before_any_connection_or_file(value, tmp_path, unreachable_conn):
    root = tmp_path / "root"
    for kwargs in ({"owner_id": value, "event_type": "devicesregistered"},
                   {"owner_ids": [OWNER, value], "event_types": ["devicesregistered"]}):
        with pytest.raises(ValueError) as err:
            run_op(destination=str(root), **kwargs)
        assert "owner_id" in str(err.value) and named(value) in str(err.value)
    assert tree(tmp_path) == []


@pytest.mark.parametrize("value", HOSTILE)
def test_operator_rejects_hostile_event_types_before_any_connection_or_file(value, tmp_path, unreachable_conn):
    root = tmp_path / "root"
    for kwargs in ({"owner_id": OWNER, "event_type": value},
                   {"owner_ids": [OWNER], "event_types": ["devicesregistered", value]}):
        with pytest.raises(ValueError) as err:
            run_op(destination=str(root), **kwargs)
        assert "event_type" in str(err.value) and named(value) in str(err.value)
    assert tree(tmp_path) == []


@pytest.mark.parametrize("value", ["EV.X", "*", ">", "a b", "../x", "/abs", "a\\b", "a\x00b", ".", ".."])
def test_operator_rejects_hostile_stream_names(value, tmp_path, unreachable_conn):
    with pytest.raises(ValueError) as err:
        run_op(destination=str(tmp_path / "root"), owner_id=OWNER, event_type="devicesregistered", stream=value)
    assert named(value) in str(err.value)
    assert tree(tmp_path) == []


@pytest.mark.parametrize("value", ["EV.X", "*", ">", "a b", "../x", "a/b", "a\\b", "a\x00b", "a\u202eb"])
def test_hook_rejects_hostile_stream_names_from_the_connection_or_argument(value):
    from airflow_provider_plgd.hooks.jetstream import check_stream_name, settings_from_connection

    conn = SimpleNamespace(conn_id="c", host="127.0.0.1", port=4222, login=None, password=None, extra_dejson={})
    for call in (lambda: settings_from_connection(SimpleNamespace(**{**vars(conn), "extra_dejson": {"stream": value}})),
                 lambda: settings_from_connection(conn, stream=value),
                 lambda: check_stream_name(value)):
        with pytest.raises(ValueError) as err:
            call()
        assert "stream" in str(err.value) and repr(value) in str(err.value)
    assert settings_from_connection(conn).stream == "EVENTS"
    with pytest.raises(ValueError, match="non-empty stream name"):
        check_stream_name("")


# ---------------------------------------------------------------------------------------------
# the ETL DAG's plan step


@pytest.fixture(scope="module")
def plan_callable():
    from airflow_provider_plgd.etl import DEFAULT_PARAMS, build_etl_dag

    dag = build_etl_dag(start_date=datetime(2026, 1, 1, tzinfo=UTC))

    def call(tmp_path: Path, **params):
        context = {
            "params": {**DEFAULT_PARAMS, "storage_root": str(tmp_path / "root"), **params},
            "data_interval_start": datetime(2026, 1, 1, tzinfo=UTC),
            "data_interval_end": datetime(2026, 1, 1, 1, tzinfo=UTC),
        }
        return dag.get_task("plan").python_callable(**context)

    return call


@pytest.mark.parametrize("value", ["*", "../..", "/etc", "a.b", "a b", "a\x00b"])
def test_hostile_owner_params_never_reach_a_subject_or_path(value, plan_callable, tmp_path, unreachable_conn):
    """Today the plan step passes owners through and every fetch task rejects them (below)."""
    with pytest.raises(ValueError) as err:
        planned = plan_callable(tmp_path, owners=[value], event_types=["devicesregistered"])
        for group in planned["fetch_groups"]:
            run_op(destination=planned["storage_root"], **group)
    assert named(value) in str(err.value)
    assert [p for p in tree(tmp_path) if not p.startswith("root")] == []  # nothing outside the root
    assert not any("staging" in p or "owner_id=" in p for p in tree(tmp_path))  # no batch folder at all


@pytest.mark.parametrize("field,value", [("owners", ["*"]), ("owners", ["../x"]), ("event_types", ["a.b"]),
                                         ("owners", "*")])
def test_plan_step_rejects_hostile_params_itself(field, value, plan_callable, tmp_path):
    with pytest.raises(ValueError):
        plan_callable(tmp_path, **{field: value})


# ---------------------------------------------------------------------------------------------
# the staging writer and reader


@pytest.mark.parametrize("field", ["owner_id", "event_type", "interval_id", "stream"])
@pytest.mark.parametrize("value", PATH_HOSTILE)
def test_staging_writer_rejects_hostile_path_values_and_writes_nothing(field, value, tmp_path):
    root = tmp_path / "root"
    kwargs = {"stream": "EVENTS", "owner_id": OWNER, "event_type": "devicesregistered",
              "interval_id": "seq-000000000001-000000000002", field: value}
    with pytest.raises(ValueError) as err:
        with staging.StagingWriter(str(root), subject_filters=["plgd.>"], bounds={}, **kwargs) as writer:
            writer.write([(1, "plgd.owners.x.registrations.devicesregistered", 1, None, b"x")])
            writer.commit()
    assert field in str(err.value) and named(value) in str(err.value)
    assert tree(tmp_path) == []


@pytest.mark.parametrize("value", ["*", "?", "[ab]", "..", "a/b", "."])
def test_staging_listing_rejects_glob_and_path_values(value, tmp_path):
    root = tmp_path / "root"
    with staging.StagingWriter(str(root), stream="EVENTS", owner_id=OWNER, event_type="devicesregistered",
                               interval_id="seq-000000000001-000000000001", subject_filters=["plgd.>"],
                               bounds={}) as writer:
        writer.write([(1, "plgd.owners.x.registrations.devicesregistered", 1, None, b"x")])
        writer.commit()
    for kwargs in ({"owner_ids": [value]}, {"event_types": [value]}, {"interval_id": value}):
        with pytest.raises(ValueError) as err:
            staging.list_committed(str(root), "EVENTS", **kwargs)
        assert repr(value) in str(err.value)
    with pytest.raises(ValueError):
        staging.list_committed(str(root), value)
    assert len(staging.list_committed(str(root), "EVENTS")) == 1


@pytest.mark.parametrize("bad_path", ["../../outside.parquet", "/etc/passwd", "sub/part.parquet", "..", "."])
def test_tampered_manifest_cannot_point_outside_its_folder(bad_path, tmp_path):
    root = tmp_path / "root"
    with staging.StagingWriter(str(root), stream="EVENTS", owner_id=OWNER, event_type="devicesregistered",
                               interval_id="seq-000000000001-000000000001", subject_filters=["plgd.>"],
                               bounds={}) as writer:
        writer.write([(1, "plgd.owners.x.registrations.devicesregistered", 1, None, b"x")])
        manifest = writer.commit()
    path = Path(manifest["folder"]) / staging.MANIFEST_NAME
    data = json.loads(path.read_text())
    data["files"][0]["path"] = bad_path
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="not a file name in its folder") as err:
        staging.read_manifest(manifest["folder"])
    assert repr(bad_path) in str(err.value)
    with pytest.raises(ValueError):
        staging.list_committed(str(root), "EVENTS")


def test_valid_values_still_build_the_documented_layout(tmp_path):
    root = tmp_path / "root"
    folder = staging.batch_path(str(root), "EVENTS", OWNER, "devicesregistered", "seq-000000000001-000000000002")
    assert folder == f"{root}/staging/EVENTS/owner_id={OWNER}/event_type=devicesregistered/" \
                     "interval=seq-000000000001-000000000002"
    assert os.path.commonpath([folder, str(root)]) == str(root)
