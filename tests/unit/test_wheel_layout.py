"""The wheel ships the product, not its test tools.

``setup.cfg`` lists the packages by name and installs the repository's top-level ``spark_apps/``
as ``airflow_provider_plgd/spark_apps/`` (``package_dir``). These tests build the wheel from a copy
of the checkout (``pip wheel --no-deps``, no build isolation: no download) and check what it holds,
and that an installed copy finds the Spark applications and builds the same ``--py-files`` zip as
the checkout (the zip's SHA-256 is compared across workers: ``spark_deps.verified_py_files_zip``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from airflow_provider_plgd import spark_deps

REPO = Path(__file__).resolve().parents[2]
SPARK_APPS = ("decode_events", "dedupe_events", "rebuild_snapshots")
#: What the build reads from the checkout; plgd_devtools/ is copied too, to show it is left out.
BUILD_INPUTS = ("setup.cfg", "pyproject.toml", "README.md", "LICENSE", "airflow_provider_plgd", "spark_apps",
                "plgd_devtools")


def _source_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed in this environment (pip wheel --no-build-isolation needs it)")
    import setuptools

    if tuple(int(p) for p in re.findall(r"\d+", setuptools.__version__)[:2]) < (70, 1):
        pytest.skip(f"setuptools {setuptools.__version__} here; pyproject.toml's build needs >=69 with `wheel`, "
                    "and >=70.1 builds wheels itself")
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy2(source, src / name)
    out = base / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = out.glob("airflow_provider_plgd-*.whl")
    return path


def test_wheel_holds_the_spark_apps_inside_the_provider_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for app in SPARK_APPS:
        assert f"airflow_provider_plgd/spark_apps/{app}.py" in names
    assert "airflow_provider_plgd/spark_apps/__init__.py" in names
    assert not [n for n in names if n.startswith("spark_apps/")], "a top-level spark_apps package in the wheel"
    assert not [n for n in names if n.startswith("plgd_devtools/")], "plgd_devtools is test tooling, not shipped"
    top_level = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    if top_level:
        assert zipfile.ZipFile(wheel).read(top_level[0]).decode().split() == ["airflow_provider_plgd"]
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"airflow_provider_plgd"}


def test_wheel_holds_every_module_of_the_checkout(wheel):
    """``setup.cfg`` names the packages one by one: a new subpackage missing there fails here."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        expected = {"airflow_provider_plgd/" + p.relative_to(REPO / "airflow_provider_plgd").as_posix(): p
                    for p in _source_files(REPO / "airflow_provider_plgd")}
        expected.update({"airflow_provider_plgd/spark_apps/" + p.relative_to(REPO / "spark_apps").as_posix(): p
                         for p in _source_files(REPO / "spark_apps")})
        missing = sorted(set(expected) - names)
        assert not missing, f"not in the wheel: {missing}"
        for name, source in expected.items():
            assert zf.read(name) == source.read_bytes(), name


def test_installed_copy_finds_the_apps_and_builds_the_checkouts_py_files_zip(wheel, tmp_path):
    """An install (the wheel unpacked on ``sys.path``) resolves ``spark_app_path`` inside its own
    package and builds the very zip a checkout builds (same entries, same bytes, same SHA-256)."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    code = (
        f"import sys; sys.path.insert(0, {str(site)!r})\n"
        "import hashlib, json\n"
        "from airflow_provider_plgd import spark_deps\n"
        f"print(json.dumps({{'apps': [spark_deps.spark_app_path(n) for n in {SPARK_APPS!r}],\n"
        "                  'sha256': hashlib.sha256(spark_deps.build_py_files_bytes()).hexdigest()}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["apps"] == [str(site / "airflow_provider_plgd" / "spark_apps" / f"{n}.py") for n in SPARK_APPS]
    assert got["sha256"] == hashlib.sha256(spark_deps.build_py_files_bytes()).hexdigest()


def test_checkout_finds_the_apps_in_the_top_level_folder():
    for app in SPARK_APPS:
        assert Path(spark_deps.spark_app_path(app)) == REPO / "spark_apps" / f"{app}.py"
    with pytest.raises(FileNotFoundError, match="Spark application 'nope' not found"):
        spark_deps.spark_app_path("nope")
    names = [name for name, _ in spark_deps.py_files_entries()]
    for app in SPARK_APPS:
        assert f"airflow_provider_plgd/spark_apps/{app}.py" in names
    assert not [n for n in names if not n.startswith("airflow_provider_plgd/")]


_DEVTOOLS_IMPORT = re.compile(r"^\s*(from|import)\s+plgd_devtools\b", re.M)


def test_product_code_never_imports_the_test_tools():
    """The provider, the Spark apps and the production DAG file import nothing from plgd_devtools
    (the simulator's ``--ground-truth`` and ``--faults corrupt`` load it on demand by name), and the
    DAG file does not know the test-only Spark settings."""
    for folder in ("airflow_provider_plgd", "spark_apps", "dags"):
        for path in (REPO / folder).rglob("*.py"):
            assert not _DEVTOOLS_IMPORT.search(path.read_text()), path
    for path in (REPO / "dags").rglob("*.py"):
        assert "FAST_LOCAL_SPARK_CONF" not in path.read_text(), path
