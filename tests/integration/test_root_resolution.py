"""Storage roots compared as the storage layers resolve them (case 1 of "No silent loss, round 4").

A real S3 API (moto's server), written and read with both layers of the ETL: delta-rs (``deltalake``,
the Delta commits) and fsspec (``s3fs``: staging, the ledger). The first test shows why a root must
not be compared as a string: the two layers put ``s3://<bucket>/sandbox/%2e%2e/prod`` in two different
places. The others show that ``run_params.check_run_storage_root`` refuses every such spelling and
that each spelling it accepts is one place for both layers.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

BUCKET = "plgd-test"  # the bucket of the shared ``s3`` fixture (tests/conftest.py), emptied for each test
SANDBOX = f"s3://{BUCKET}/sandbox"


def write_delta(uri: str, rows: int) -> None:
    from deltalake import write_deltalake

    from airflow_provider_plgd.tables.delta_tables import storage_options

    write_deltalake(uri, pa.table({"n": list(range(rows))}), storage_options=storage_options(uri))


def keys(fs, prefix: str) -> list[str]:
    return sorted(str(p) for p in fs.find(prefix))


def test_the_two_layers_resolve_a_percent_escaped_dot_segment_to_two_places(s3):
    import fsspec

    fs = fsspec.filesystem("s3")
    tricky = f"{SANDBOX}/%2e%2e/prod"
    write_delta(f"{tricky}/events", 3)  # delta-rs: a URL, its path decoded and its dot segments removed
    fs.pipe_file(f"{tricky}/_ledger/x.json", b"{}")  # fsspec: the key as written
    found = keys(fs, BUCKET)
    assert any(k.startswith(f"{BUCKET}/prod/events/_delta_log/") for k in found), found
    assert f"{BUCKET}/sandbox/%2e%2e/prod/_ledger/x.json" in found, found
    assert not any(k.startswith(f"{BUCKET}/sandbox/%2e%2e/prod/events") for k in found), found


@pytest.mark.parametrize("value", [
    f"{SANDBOX}/%2e%2e/prod", f"{SANDBOX}/%2E%2E/prod", f"{SANDBOX}/../prod", f"{SANDBOX}/./x", f"{SANDBOX}/%41",
    f"{SANDBOX}/x?y", f"{SANDBOX}/x#y", f"{SANDBOX}/a b", "sandbox/relative",
])
def test_a_root_the_layers_could_resolve_differently_is_refused_before_any_io(s3, value):
    import fsspec

    from airflow_provider_plgd.exceptions import UntrustedRunParamError
    from airflow_provider_plgd.run_params import check_run_storage_root

    before = keys(fsspec.filesystem("s3"), BUCKET)
    with pytest.raises(UntrustedRunParamError, match="run param 'storage_root': the storage root"):
        check_run_storage_root(value, [SANDBOX], "no_such_connection")
    assert keys(fsspec.filesystem("s3"), BUCKET) == before


@pytest.mark.parametrize(("value", "expected"), [
    (f"{SANDBOX}/a", f"{SANDBOX}/a"), (f"S3://{BUCKET.upper()}//sandbox/b/", f"{SANDBOX}/b"), (f"s3a://{BUCKET}/sandbox/c", f"{SANDBOX}/c"),
])
def test_an_accepted_root_is_one_place_for_delta_rs_and_fsspec(s3, value, expected):
    import fsspec
    import polars as pl
    from deltalake import DeltaTable

    from airflow_provider_plgd.run_params import check_run_storage_root
    from airflow_provider_plgd.tables.delta_tables import storage_options

    root = check_run_storage_root(value, [SANDBOX], "no_such_connection")
    assert root == expected
    fs = fsspec.filesystem("s3")
    write_delta(f"{root}/events", 4)
    fs.pipe_file(f"{root}/_ledger/x.json", b"{}")
    prefix = root[len("s3://"):]
    found = keys(fs, f"{BUCKET}/sandbox")
    assert f"{prefix}/_ledger/x.json" in found
    assert any(k.startswith(f"{prefix}/events/_delta_log/") for k in found), found
    assert all(k.startswith(f"{BUCKET}/sandbox/") for k in keys(fs, BUCKET))  # nothing outside the sandbox
    uri = f"{root}/events"
    assert DeltaTable(uri, storage_options=storage_options(uri)).to_pyarrow_table().num_rows == 4
    assert pl.read_delta(uri, storage_options=storage_options(uri)).height == 4
