"""layout.Layout: the storage root normalised once, and every path under it from one value."""

from __future__ import annotations

import dataclasses
import re

import pytest

from airflow_provider_plgd.fetch import spool
from airflow_provider_plgd.operators import lineage
from airflow_provider_plgd.tables import delta_tables, identity, snapshot_store
from airflow_provider_plgd.tables.layout import Layout

IID = "20260101T000000Z_20260101T010000Z"


def test_the_root_is_normalised_once_and_every_path_comes_from_it():
    layout = Layout.of("s3a://Lake//plgd/")
    assert layout.root == "s3://lake/plgd"
    assert Layout.of(layout) is layout
    assert layout.staging_table("EVENTS") == "s3://lake/plgd/staging/EVENTS"
    assert layout.ledger_interval_dir("EVENTS", IID) == f"s3://lake/plgd/_ledger/EVENTS/interval={IID}"
    assert layout.pipeline_file() == "s3://lake/plgd/_ledger/pipeline.json"
    assert layout.run_summary("decode", IID) == f"s3://lake/plgd/_runs/decode/interval={IID}.json"
    assert layout.table("events") == "s3://lake/plgd/events"
    assert layout.snapshot_table("_device_state") == "s3://lake/plgd/snapshots/_device_state"
    assert layout.spool_dir() is None  # an object store: the system temp folder
    assert Layout.of("file:///data/plgd/").spool_dir() == "/data/plgd/staging/_spool"
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.root = "/elsewhere"  # type: ignore[misc]


def test_the_storage_modules_take_their_paths_from_the_layout():
    layout = Layout.of("/data/plgd")
    assert layout.staging_table("EVENTS") == "/data/plgd/staging/EVENTS"
    assert layout.ledger_interval_dir("EVENTS", IID) == f"/data/plgd/_ledger/EVENTS/interval={IID}"
    assert layout.run_summary("rebuild", IID) == f"/data/plgd/_runs/rebuild/interval={IID}.json"
    assert delta_tables.interval_table_uri(layout, delta_tables.EVENTS_DEDUPED) == "/data/plgd/events_deduped"
    assert snapshot_store.snapshot_table_uri(layout, "resources") == "/data/plgd/snapshots/resources"
    assert spool.default_spool_dir(layout) == "/data/plgd/staging/_spool"
    assert identity.IDENTITY_FILE == "_ledger/pipeline.json"
    with pytest.raises(ValueError, match="unknown table 'staging'"):
        delta_tables.interval_table_uri(layout, "staging")
    with pytest.raises(ValueError, match="unknown snapshot table 'nope'"):
        snapshot_store.snapshot_table_uri(layout, "nope")
    # the public readers take any spelling of the root, normalised once into the Layout
    assert snapshot_store.latest_snapshot("/data//plgd/") is None and snapshot_store.latest_snapshot(layout) is None


#: The entry points that take a storage root as a value (each makes a Layout once) or record it as a
#: setting: the public readers and maintenance, the status view, the DAG factories and the
#: operator (templated arguments), the run param's trust check, the identity's recorded setting.
ROOT_EDGES = {
    "tables/snapshot_store.py": {"latest_snapshot", "read_snapshot", "roll_back"},
    "tables/maintenance.py": {"maintain_tables"},
    "tables/storage_root.py": {"same_or_below"},
    "tables/identity.py": {"of"},
    "status.py": {"chain_status"},
    "etl/params.py": {"run_params_used"},
    "etl/maintenance.py": {"build_maintenance_dag"},
    "etl/monitor.py": {"build_monitor_dag"},
    "operators/jetstream_to_staging.py": {"__init__"},
    "spark_deps.py": {"build_private_py_files_zip", "_local_root"},
}
ROOT_NAMES = {"root", "storage_root", "destination", "out_root", "output_root", "staging_root", "snapshots_root"}


def _functions(package_dir):
    import ast

    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir).as_posix()
        if rel.startswith("plgd/pb/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield rel, node


def test_below_the_edges_no_function_takes_the_root_as_a_string():
    """The root travels as a Layout: a parameter that is a storage root by name exists only at the
    entry points (:data:`ROOT_EDGES`), and only layout.py and storage_root.py normalise a root."""
    from pathlib import Path

    import airflow_provider_plgd

    package = Path(airflow_provider_plgd.__file__).parent
    found = {}
    for rel, fn in _functions(package):
        args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        if any(a.arg in ROOT_NAMES for a in args):
            found.setdefault(rel, set()).add(fn.name)
    assert found == ROOT_EDGES
    normalising = sorted(p.relative_to(package).as_posix() for p in package.rglob("*.py")
                         if "normalize_storage_root(" in p.read_text())
    assert normalising == ["tables/layout.py", "tables/storage_root.py"]


def test_lineage_names_the_layouts_paths():
    layout = Layout.of("s3://b/r")
    summary = lineage.summary_lineage("EVENTS", layout)
    assert [(d.namespace, d.name) for d in summary.inputs] == [("s3://b", "r/_ledger/EVENTS"), ("s3://b", "r/_runs")]
    fetch = lineage.fetch_lineage(["nats://h:4222"], "EVENTS", layout, ["plgd.>"])
    assert [(d.namespace, d.name) for d in fetch.outputs] == [("s3://b", "r/staging/EVENTS")]


def test_the_xcom_edge_round_trips_and_refuses_what_is_not_a_root():
    layout = Layout.of("/data/plgd")
    assert layout.as_dict() == {"storage_root": "/data/plgd"}
    assert Layout.from_dict({"storage_root": "/data/plgd/"}) == layout
    with pytest.raises(ValueError, match="expected a mapping with 'storage_root'"):
        Layout.from_dict({"root": "/data/plgd"})
    for bad, message in (("relative/path", "relative path"), ("s3://k:s@b/p", "credentials"),
                         ("/data/../prod", "'..' segment"), ("/data/%2e%2e", "percent escapes")):
        with pytest.raises(ValueError, match=message):
            Layout.of(bad)
    with pytest.raises(ValueError, match="stream 'a/b' cannot be used"):
        layout.staging_table("a/b")
    with pytest.raises(ValueError, match=re.escape("interval_id '../x' cannot be used")):
        layout.ledger_interval_dir("EVENTS", "../x")
