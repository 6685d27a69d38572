"""Fixtures of the compose checks: ``docker-compose.airflow.yml`` parsed once per module (PyYAML,
a few milliseconds), with its variables at their defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.compose.compose_file import COMPOSE_FILE, REPO, env_of, interpolate_tree


@pytest.fixture(scope="module")
def raw() -> dict:
    yaml = pytest.importorskip("yaml")  # lazy: a test that does not read the file runs without PyYAML
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict), "no services mapping"
    return data


@pytest.fixture(scope="module")
def variables(raw) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    interpolate_tree(raw, found)
    return found


@pytest.fixture(scope="module")
def compose(raw) -> dict:
    return interpolate_tree(raw, {})


@pytest.fixture(scope="module")
def services(compose) -> dict[str, dict]:
    return compose["services"]


@pytest.fixture(scope="module")
def airflow_env(services) -> dict[str, str]:
    return env_of(services["airflow-scheduler"])


@pytest.fixture(scope="module")
def dockerfiles(services) -> dict[str, Path]:
    out = {}
    for name, svc in services.items():
        build = svc.get("build")
        if build is None:
            continue
        if isinstance(build, str):
            build = {"context": build}
        context = (REPO / build.get("context", ".")).resolve()
        out[name] = (context / build.get("dockerfile", "Dockerfile")).resolve()
    return out
