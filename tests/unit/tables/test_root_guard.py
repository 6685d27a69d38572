"""Roots that cannot overlap (``tables.root_guard``), the run-param check that uses it
(``run_params.check_run``), the atomic identity record (``identity.create_exclusive``) and the old
layout recognised by its records (``delta_tables.check_layout``).

Real local folders, Delta tables written with ``deltalake``; no fake.
"""

from __future__ import annotations

import json
import os
import threading
from typing import ClassVar

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from airflow_provider_plgd.etl import DEFAULT_PARAMS
from airflow_provider_plgd.etl.params import params_of_run
from airflow_provider_plgd.exceptions import OldLayoutError, StorageRootOverlapError, UntrustedRunParamError
from airflow_provider_plgd.run_params import check_run, check_run_params, run_spark_conf_policy
from airflow_provider_plgd.tables import delta_tables, identity
from airflow_provider_plgd.tables.layout import Layout
from airflow_provider_plgd.tables.root_guard import ancestors, check_apart, check_apart_of


def record_pipeline(root) -> None:
    (root / "_ledger").mkdir(parents=True)
    (root / "_ledger" / "pipeline.json").write_text(json.dumps({"version": 1}))


def overlap(root, *others) -> str:
    with pytest.raises(StorageRootOverlapError) as err:
        check_apart(Layout.of(str(root)), [str(o) for o in others])
    assert err.value.run_root == str(root)
    return str(err.value)


def test_ancestors_in_the_normalised_spelling():
    assert ancestors("/a/b/c") == ["/a/b", "/a"]
    assert ancestors("/a") == []
    assert ancestors("s3://lake/x/y") == ["s3://lake/x", "s3://lake"]
    assert ancestors(Layout.of("S3://LAKE//x/y/").root) == ["s3://lake/x", "s3://lake"]


def test_roots_the_dag_writes_compared_as_paths_not_prefixes():
    check_apart_of("/lake/prod2", ["/lake/prod"])  # a sibling that shares a prefix
    check_apart_of("/lake/prod", ["/lake/prod"])  # the root itself
    with pytest.raises(StorageRootOverlapError, match="it lies inside '/lake/prod', a root this DAG writes"):
        check_apart_of("/lake/prod/events/interval=x", ["/lake/prod"])
    with pytest.raises(StorageRootOverlapError, match="it holds '/lake/prod', a root this DAG writes"):
        check_apart_of("/lake", ["/lake/prod"])


def test_a_root_inside_or_above_a_recorded_pipeline_or_a_table_is_refused(tmp_path):
    views = tmp_path / "views"
    record_pipeline(views / "a")
    write_deltalake(str(views / "t"), pa.table({"n": [1]}))
    check_apart(Layout.of(str(views / "a")))  # its own record
    check_apart(Layout.of(str(views / "c")))  # a new folder beside them
    assert f"it lies inside '{views / 'a'}', a pipeline's root" in overlap(views / "a" / "b" / "c")
    assert f"it holds '{views / 'a'}', a pipeline's root" in overlap(views)
    assert "it is a Delta table" in overlap(views / "t")
    assert f"it lies inside '{views / 't'}', a Delta table" in overlap(views / "t" / "x")
    # a pipeline's root that someone made inside a layout folder of a new root
    other = tmp_path / "other"
    record_pipeline(other / "events" / "interval=x")
    assert f"it holds '{other / 'events' / 'interval=x'}', a pipeline's root" in overlap(other)


def test_a_roots_own_tables_and_a_users_empty_folder_pass(tmp_path):
    root = tmp_path / "lake"
    record_pipeline(root)
    for table in ("events", "staging/EVENTS", "snapshots/resources"):
        write_deltalake(str(root / table), pa.table({"n": [1]}))
    (root / "quarantine" / "interval=x").mkdir(parents=True)  # a folder anybody could make
    (root / "_ledger" / "EVENTS" / "interval=y").mkdir(parents=True)
    (root / "_runs" / "decode").mkdir(parents=True)
    (root / "notes").mkdir()
    check_apart(Layout.of(str(root)))


def test_a_symbolic_link_into_another_root_is_followed(tmp_path):
    lake = tmp_path / "lake"
    record_pipeline(lake)
    (lake / "events").mkdir()
    os.symlink(lake / "events", tmp_path / "link")
    assert f"it lies inside '{lake}', a pipeline's root" in overlap(tmp_path / "link" / "x")


def test_check_run_refuses_a_root_inside_or_above_the_dags_own_before_any_io(tmp_path):
    lake = str(tmp_path / "lake")
    policy = run_spark_conf_policy(None)
    author = check_run_params({**DEFAULT_PARAMS, "storage_root": lake}, spark_conf_policy=policy,
                              storage_roots=[lake], jetstream_conn_id="no_such_connection")

    def run(root: str):
        return check_run({**DEFAULT_PARAMS, "storage_root": root}, author, spark_conf_policy=policy,
                         storage_roots=[lake, str(tmp_path)], jetstream_conn_id="no_such_connection")

    assert run(lake + "/").storage_root == lake  # the DAG's own root, another spelling
    assert run(str(tmp_path / "lake2")).storage_root == str(tmp_path / "lake2")
    for root, shown in [(f"{lake}/events/interval=x", "it lies inside"), (f"{lake}//events/", "it lies inside"),
                        (str(tmp_path), "it holds")]:
        with pytest.raises(UntrustedRunParamError, match=rf"^StorageRootOverlapError: .* {shown} '{lake}', a root "
                                                         "this DAG writes") as err:
            run(root)
        assert isinstance(err.value.__cause__, StorageRootOverlapError)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_params_of_a_run_are_the_dags_updated_with_its_own_conf():
    defaults = {"owners": [], "storage_root": "/lake"}

    class Run:
        conf: ClassVar[dict[str, str]] = {"storage_root": "/views/a"}

    # the tasks' params of an earlier run in this process held owners=[A]; the run's own conf has none
    context = {"dag_run": Run(), "params": {"owners": ["A"], "storage_root": "/views/a"}}
    assert params_of_run(context, defaults) == {"owners": [], "storage_root": "/views/a"}
    assert params_of_run({"params": {"owners": ["A"]}}, defaults) == {"owners": ["A"]}


def test_create_exclusive_lets_exactly_one_of_many_writers_create_the_file(tmp_path):
    target = str(tmp_path / "_ledger" / "pipeline.json")
    barrier, won, lost = threading.Barrier(8), [], []

    def write(i: int) -> None:
        barrier.wait()
        try:
            identity.create_exclusive(target, json.dumps({"writer": i}).encode())
            won.append(i)
        except FileExistsError:
            lost.append(i)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 7
    assert json.loads((tmp_path / "_ledger" / "pipeline.json").read_text()) == {"writer": won[0]}
    assert [p.name for p in (tmp_path / "_ledger").iterdir()] == ["pipeline.json"]  # no temporary file left


def test_the_old_layout_is_known_by_its_records_not_by_a_folder_name(tmp_path):
    root = tmp_path / "lake"
    (root / "events" / "interval=x" / "_ledger").mkdir(parents=True)  # a run's root a user named so
    delta_tables.check_layout(Layout.of(str(root)))
    (root / "quarantine" / "interval=20260101T000000Z_20260101T010000Z").mkdir(parents=True)
    (root / "quarantine" / "interval=20260101T000000Z_20260101T010000Z" / "_manifest.json").write_text("{}")
    with pytest.raises(OldLayoutError, match=r"quarantine/interval=20260101T000000Z_20260101T010000Z belongs to"):
        delta_tables.check_layout(Layout.of(str(root)))
