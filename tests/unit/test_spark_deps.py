"""The ``--py-files`` zip that the Spark driver runs inside the Airflow worker (client mode) is
never taken from the shared storage root, and a zip changed after ``plan`` is never executed.

Hole: the zip used to live at ``{root}/_deps/plgd_py_files.zip``; anyone who
could write the storage root (in the compose stack the Spark workers mount it) replaced it with
one whose ``airflow_provider_plgd/spark/session.py`` dumped ``AIRFLOW_CONN_*``, and the decode task ran it.

The tests build the real ETL DAG, run the real ``plan`` callable and the real Spark task's
``execute`` (``PlgdSparkSubmitOperator`` -> ``SparkSubmitHook``). The one fake is ``spark-submit``:
a script first on ``PATH`` that does what a client-mode driver does with ``--py-files`` -- puts the
zip on ``sys.path`` and imports ``airflow_provider_plgd.spark.session`` from it -- and records that it was called.
"""

from __future__ import annotations

import io
import json
import os
import stat
import sys
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_provider_plgd import spark_deps
from airflow_provider_plgd.spark_deps import PyFilesIntegrityError

UTC = timezone.utc

#: What the attacker's ``airflow_provider_plgd/spark/session.py`` does: write the worker's connection variables.
PAYLOAD = """
import json, os
with open(os.environ["PLGD_TEST_PAYLOAD_OUT"], "w") as fh:
    json.dump({k: v for k, v in os.environ.items() if k.startswith("AIRFLOW_CONN_")}, fh)
"""

#: A client-mode driver in miniature: the zip goes on sys.path, the app imports airflow_provider_plgd.spark.session.
FAKE_SPARK_SUBMIT = """#!{python}
import json, os, sys
args = sys.argv[1:]
py_files = args[args.index("--py-files") + 1]
with open(os.environ["PLGD_TEST_SUBMITTED"], "w") as fh:
    json.dump({{"py_files": py_files, "argv": args}}, fh)
sys.path.insert(0, py_files)
for name in [m for m in sys.modules if m == "airflow_provider_plgd" or m.startswith("airflow_provider_plgd.")]:
    del sys.modules[name]
import airflow_provider_plgd.spark.session
"""


def tampered_zip(original: bytes) -> bytes:
    """The original zip with ``airflow_provider_plgd/spark/session.py`` replaced by :data:`PAYLOAD`."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(original)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = PAYLOAD.encode() if info.filename == "airflow_provider_plgd/spark/session.py" else src.read(info)
            dst.writestr(info, data)
    return out.getvalue()


@pytest.fixture()
def setup(tmp_path, monkeypatch, jetstream):
    """A worker: its own AIRFLOW_HOME, a local storage root, the fake spark-submit, connections
    (``plan`` records the interval ledger, so it talks to a real nats-server)."""
    from airflow_provider_plgd.etl import DEFAULT_PARAMS, build_etl_dag

    home = tmp_path / "airflow_home"
    home.mkdir()
    root = tmp_path / "shared_root"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "spark-submit"
    fake.write_text(FAKE_SPARK_SUBMIT.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setenv("AIRFLOW_HOME", str(home))
    monkeypatch.delenv(spark_deps.PY_FILES_DIR_ENV, raising=False)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PLGD_TEST_PAYLOAD_OUT", str(tmp_path / "stolen.json"))
    monkeypatch.setenv("PLGD_TEST_SUBMITTED", str(tmp_path / "submitted.json"))
    monkeypatch.setenv("PYTHONPATH", "")  # the fake driver imports airflow_provider_plgd from the zip only
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    monkeypatch.setenv("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT", json.dumps(
        {"conn_type": "plgd_jetstream", "password": "nats-secret-Zq81", "host": jetstream.host,
         "port": jetstream.port}))
    dag = build_etl_dag(dag_id="trust_test", start_date=datetime(2026, 1, 1, tzinfo=UTC),
                        storage_roots=[str(tmp_path)])  # the roots a run may choose
    context = {
        "params": {**DEFAULT_PARAMS, "storage_root": str(root), "owners": ["o1"],
                   "event_types": ["devicesregistered"]},
        "data_interval_start": datetime(2026, 1, 1, tzinfo=UTC),
        "data_interval_end": datetime(2026, 1, 1, 1, tzinfo=UTC),
    }

    class Worker:
        pass

    w = Worker()
    w.tmp, w.home, w.root, w.dag, w.context = tmp_path, home, root, dag, context
    w.stolen, w.submitted = tmp_path / "stolen.json", tmp_path / "submitted.json"

    def plan() -> dict:
        return dag.get_task("plan").python_callable(**context)

    def run_spark_task(task_id: str, planned: dict) -> None:
        task = dag.get_task(task_id)
        task.py_files = planned["py_files"]  # what rendering "{{ ti.xcom_pull(task_ids='plan')['py_files'] }}" gives
        task.execute({})

    w.plan, w.run_spark_task = plan, run_spark_task
    return w


def test_zip_swapped_after_plan_is_never_executed(setup):
    """Plan, then replace the zip at the path plan returned (as someone who can write there would),
    then run each Spark task: each fails before spark-submit, naming the path and both hashes; the
    payload never runs and the NATS password is not written anywhere."""
    from airflow_provider_plgd.operators.spark_submit import UntrustedPyFilesError

    planned = setup.plan()
    zip_path = Path(planned["py_files"])
    original = zip_path.read_bytes()
    evil = tampered_zip(original)
    os.chmod(zip_path, 0o600)
    zip_path.write_bytes(evil)
    import hashlib

    good_sha, evil_sha = hashlib.sha256(original).hexdigest(), hashlib.sha256(evil).hexdigest()
    for task_id in ("decode", "dedupe", "rebuild"):
        with pytest.raises(PyFilesIntegrityError) as err:
            setup.run_spark_task(task_id, planned)
        assert isinstance(err.value, UntrustedPyFilesError)  # an AirflowFailException: no retries
        message = str(err.value)
        assert str(zip_path) in message and good_sha in message and evil_sha in message, message
    assert not setup.submitted.exists(), "spark-submit was started with the tampered zip"
    assert not setup.stolen.exists(), "the tampered zip's code ran"


def test_untampered_zip_runs_and_payload_demo_is_real(setup):
    """Control: the verified zip is what spark-submit gets, and the fake driver really imports
    airflow_provider_plgd.spark.session from it (so the test above would have caught the payload)."""
    planned = setup.plan()
    setup.run_spark_task("decode", planned)
    submitted = json.loads(setup.submitted.read_text())
    assert submitted["py_files"] == planned["py_files"]
    assert "--py-files" in submitted["argv"] and not setup.stolen.exists()
    # the same fake driver with the tampered zip does leak the connection: the demo is not vacuous
    evil = setup.tmp / "evil.zip"
    evil.write_bytes(tampered_zip(Path(planned["py_files"]).read_bytes()))
    import subprocess

    subprocess.run([str(setup.tmp / "bin" / "spark-submit"), "--py-files", str(evil), "app.py"],
                   check=True, env={**os.environ}, timeout=60)
    assert "nats-secret-Zq81" in setup.stolen.read_text()


def test_zip_lives_in_a_private_folder_not_on_the_storage_root(setup):
    planned = setup.plan()
    path = Path(planned["py_files"])
    assert not path.resolve().is_relative_to(setup.root.resolve())
    assert not (setup.root / "_deps").exists()
    assert path.parent == setup.home / "plgd_py_files"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert spark_deps.CONTENT_ADDRESSED_NAME.match(path.name)
    with zipfile.ZipFile(path) as zf:
        assert "airflow_provider_plgd/spark_apps/decode_events.py" in zf.namelist()
    assert setup.plan()["py_files"] == str(path)  # deterministic: same name, same bytes


def test_private_folder_inside_the_storage_root_is_refused(setup, monkeypatch):
    monkeypatch.setenv(spark_deps.PY_FILES_DIR_ENV, str(setup.root / "deps"))
    with pytest.raises(PyFilesIntegrityError, match="inside the storage root"):
        setup.plan()


def test_spark_task_on_another_host_builds_and_checks_its_own_copy(setup, monkeypatch):
    """plan on host A, the Spark task on host B (another private folder): B builds the zip from
    its installed provider, gets the same hash, and submits its own copy; a different provider
    version on B (another hash) is refused."""
    planned = setup.plan()
    other = setup.tmp / "host_b_private"
    monkeypatch.setenv(spark_deps.PY_FILES_DIR_ENV, str(other))
    setup.run_spark_task("decode", planned)
    submitted = json.loads(setup.submitted.read_text())
    assert submitted["py_files"] == str(other / Path(planned["py_files"]).name)
    assert Path(submitted["py_files"]).read_bytes() == Path(planned["py_files"]).read_bytes()
    assert stat.S_IMODE(other.stat().st_mode) == 0o700

    setup.submitted.unlink()
    skewed = {**planned, "py_files": str(Path(planned["py_files"]).with_name("plgd_py_files-" + "0" * 64 + ".zip"))}
    with pytest.raises(PyFilesIntegrityError, match="install the same airflow-provider-plgd version"):
        setup.run_spark_task("decode", skewed)
    assert not setup.submitted.exists()


def test_non_content_addressed_py_files_are_refused(setup):
    shared = setup.root / "_deps" / "plgd_py_files.zip"
    with pytest.raises(PyFilesIntegrityError, match="not a content-addressed"):
        setup.run_spark_task("decode", {"py_files": str(shared)})
    assert not setup.submitted.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the folder another owner")
def test_private_folder_owned_by_someone_else_is_refused(setup, monkeypatch):
    folder = setup.tmp / "not_mine"
    folder.mkdir(mode=0o700)
    os.chown(folder, 12345, 12345)
    monkeypatch.setenv(spark_deps.PY_FILES_DIR_ENV, str(folder))
    with pytest.raises(PyFilesIntegrityError, match="owned by uid 12345"):
        setup.plan()
