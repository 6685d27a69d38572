"""airflow_provider_plgd.spark.pyspark_path: when the installed PySpark replaces ``$SPARK_HOME/python/lib/pyspark.zip``.

Fabricated zip and package folders stand in for a Spark installation (one fake at a time). The
real switch runs in every spark-submit of the integration tests (driver) and, with
``spark.python.daemon.module=airflow_provider_plgd.spark.pyspark_daemon``, in the DAG tests' Python daemon.
"""

from __future__ import annotations

import zipfile

from airflow_provider_plgd.spark.pyspark_path import prefer_installed_pyspark


def make_zip(folder, version):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "pyspark.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("pyspark/__init__.py", "")
        zf.writestr("pyspark/version.py", f"__version__: str = '{version}'\n")
    return str(path)


def make_package(folder, version):
    package = folder / "pyspark"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "version.py").write_text(f'__version__ = "{version}"\n')
    return str(folder)


def test_same_version_moves_the_zip_to_the_end(tmp_path):
    zip_path = make_zip(tmp_path / "spark" / "python" / "lib", "4.2.0")
    site = make_package(tmp_path / "site", "4.2.0")
    path = ["/app", zip_path, "/other.zip", site]
    assert prefer_installed_pyspark(path) is True
    assert path == ["/app", "/other.zip", site, zip_path]


def test_other_version_keeps_the_path(tmp_path):
    zip_path = make_zip(tmp_path / "lib", "4.2.0")
    site = make_package(tmp_path / "site", "4.1.1")
    path = [zip_path, site]
    assert prefer_installed_pyspark(path) is False
    assert path == [zip_path, site]


def test_no_installed_package_or_no_zip_keeps_the_path(tmp_path):
    zip_path = make_zip(tmp_path / "lib", "4.2.0")
    empty = tmp_path / "empty"
    empty.mkdir()
    path = [zip_path, str(empty)]
    assert prefer_installed_pyspark(path) is False
    assert path == [zip_path, str(empty)]
    site = make_package(tmp_path / "site", "4.2.0")
    assert prefer_installed_pyspark([site]) is False


def test_unreadable_zip_keeps_the_path(tmp_path):
    bad = tmp_path / "pyspark.zip"
    bad.write_bytes(b"not a zip")
    site = make_package(tmp_path / "site", "4.2.0")
    path = [str(bad), site]
    assert prefer_installed_pyspark(path) is False
    assert path == [str(bad), site]
