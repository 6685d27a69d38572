"""The provider's documentation URL: Airflow 3's Providers page links a provider package to the
``Documentation`` entry of its ``Project-URL`` metadata (``providers_discovery``), else to
``https://airflow.apache.org/docs/<package>/<version>/``, which does not exist for a third-party
provider. The entry comes from ``setup.cfg``'s ``project_urls``."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS_URL = "https://github.com/plgd-dev/airflow-provider-plgd/tree/main/docs"


def test_setup_cfg_names_the_documentation_url_airflow_links_to():
    from setuptools.config.setupcfg import read_configuration

    urls = read_configuration(str(REPO / "setup.cfg"))["metadata"]["project_urls"]
    assert urls["Documentation"] == DOCS_URL  # written to the wheel as "Project-URL: Documentation, <url>"
