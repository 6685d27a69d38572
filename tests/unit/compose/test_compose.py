"""Static checks of ``docker-compose.airflow.yml`` (the full stack: docs/compose.md).

No Docker engine is needed: the file is parsed with PyYAML (which resolves the ``<<`` merge keys
and anchors like Compose does) and every ``${VAR:-default}`` is replaced by its default, as
``docker compose`` does with an empty environment. The checks are what ``docker compose up``
would otherwise only reveal at run time: references between services and volumes, pinned
images, health checks, the connections' JSON, the stream settings of docs/wire-format.md §1.5, the
Spark version match between the driver (Airflow image) and the cluster, and the repo files that
commands point to. When the ``docker compose`` client is installed, ``docker compose config -q``
runs as well (it needs no engine); without it that one test is skipped.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from tests.unit.compose.compose_file import (
    AIRFLOW_COMMANDS,
    DEPENDS_ON_CONDITIONS,
    DOCS,
    ONE_SHOT_SERVICES,
    REPO,
    REQUIRED_SERVICES,
    SECRET_ENV,
    command_list,
    command_tokens,
    depends_on_of,
    dockerfile_from_images,
    env_of,
    mounts_of,
    pin_problem,
)

# --------------------------------------------------------------------------------------------
# structure


def test_required_services_exist(services):
    missing = {role: name for role, name in REQUIRED_SERVICES.items() if name not in services}
    assert not missing, f"missing services: {missing}"


def test_every_variable_has_a_default(variables):
    no_default = sorted(name for name, default in variables.items() if default is None)
    assert not no_default, f"variables without a ${{VAR:-default}}: {no_default}"


def test_secrets_are_variables_with_dev_only_defaults(raw, variables):
    for name, svc in raw["services"].items():
        for key, value in env_of(svc).items():
            if SECRET_ENV.search(key):
                assert re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-[^}]*\}", value), (
                    f"{name}: {key}={value!r} must be a ${{VAR:-default}}, not a literal")
            marked = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}", r"__VAR_\1__", value)
            for userinfo in re.findall(r"://([^/@\s]*)@", marked):
                password = userinfo.partition(":")[2]
                assert re.fullmatch(r"__VAR_\w+__", password), f"{name}: {key} embeds a literal password"
    for var, default in variables.items():
        if SECRET_ENV.search(var) and default:
            assert "dev-only" in default, f"default of {var} must say it is dev-only, got {default!r}"


def test_depends_on_targets_and_conditions(services):
    for name, svc in services.items():
        for target, spec in depends_on_of(svc).items():
            assert target in services, f"{name} depends on unknown service {target!r}"
            assert target != name, f"{name} depends on itself"
            condition = spec.get("condition", "service_started")
            assert condition in DEPENDS_ON_CONDITIONS, f"{name} -> {target}: bad condition {condition!r}"
            if condition == "service_healthy":
                assert services[target].get("healthcheck"), f"{name} waits for {target} healthy; it has no healthcheck"
            if condition == "service_completed_successfully":
                assert target in ONE_SHOT_SERVICES, f"{name} waits for {target} to complete; it is long-running"


def test_depends_on_has_no_cycles(services):
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        if state.get(node) == "done":
            return
        assert state.get(node) != "active", f"depends_on cycle: {' -> '.join([*path, node])}"
        state[node] = "active"
        for target in depends_on_of(services[node]):
            visit(target, [*path, node])
        state[node] = "done"

    for name in services:
        visit(name, [])


def test_named_volumes_declared_and_used(compose, services):
    declared = set((compose.get("volumes") or {}).keys())
    used = set()
    for name, svc in services.items():
        for mount in mounts_of(svc):
            if mount["type"] == "volume" and mount["source"]:
                assert mount["source"] in declared, f"{name}: volume {mount['source']!r} is not declared"
                used.add(mount["source"])
    assert declared == used, f"declared but unused volumes: {sorted(declared - used)}"


def test_bind_mount_sources_exist(services):
    for name, svc in services.items():
        for mount in mounts_of(svc):
            if mount["type"] == "bind":
                assert not mount["source"].startswith(("/", "~")), f"{name}: bind mount outside the repo: {mount}"
                assert (REPO / mount["source"]).exists(), f"{name}: bind mount source {mount['source']} does not exist"


def test_container_paths_in_commands_exist_in_repo(services):
    """A path in a command that lies under a bind mount must exist at the mount's source."""
    checked = 0
    for name, svc in services.items():
        binds = [m for m in mounts_of(svc) if m["type"] == "bind"]
        for token in command_tokens(svc):
            for mount in binds:
                target = PurePosixPath(mount["target"])
                path = PurePosixPath(token)
                if path == target or target in path.parents:
                    host = REPO / mount["source"] / path.relative_to(target)
                    assert host.exists(), f"{name}: command uses {token}, but {host} does not exist"
                    checked += 1
    assert checked, "expected at least one command to reference a mounted repo file"


def test_images_pinned_or_built_from_pinned_dockerfile(services, dockerfiles):
    for name, svc in services.items():
        if name in dockerfiles:
            dockerfile = dockerfiles[name]
            assert dockerfile.is_file(), f"{name}: Dockerfile {dockerfile} does not exist"
            froms = dockerfile_from_images(dockerfile)
            assert froms, f"{dockerfile}: no FROM"
            for ref in froms:
                assert pin_problem(ref) is None, f"{dockerfile}: {pin_problem(ref)}"
        else:
            assert svc.get("image"), f"{name}: neither image nor build"
            assert pin_problem(svc["image"]) is None, f"{name}: {pin_problem(svc['image'])}"


def test_every_service_declares_restart_and_long_running_ones_have_healthchecks(services):
    one_shot = {name for name, svc in services.items() if str(svc.get("restart")) == "no"}
    assert one_shot == ONE_SHOT_SERVICES, f"one-shot services: {sorted(one_shot)}"
    for name, svc in services.items():
        assert svc.get("restart") in ("no", "always", "unless-stopped", "on-failure"), f"{name}: restart policy"
        if name in one_shot:
            continue
        check = svc.get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), f"{name} is long-running but has no healthcheck"
        assert check["test"] != ["NONE"], f"{name}: healthcheck disabled"


def test_published_ports_bind_to_localhost(services):
    for name, svc in services.items():
        for port in svc.get("ports") or []:
            assert str(port).startswith("127.0.0.1:"), f"{name}: port {port!r} is published on all interfaces"


def test_docs_describe_every_service(services):
    assert DOCS.is_file(), f"{DOCS} is missing"
    text = DOCS.read_text()
    missing = [name for name in services if f"`{name}`" not in text]
    assert not missing, f"docs/compose.md does not mention: {missing}"


# --------------------------------------------------------------------------------------------
# Airflow


def test_airflow_common_anchor_and_components(raw, services, dockerfiles):
    assert "x-airflow-common" in raw, "the shared x-airflow-common block is missing"
    for name, command in AIRFLOW_COMMANDS.items():
        svc = services[name]
        assert command_list(svc) == [command], f"{name}: command {svc.get('command')!r}"
        assert env_of(svc)["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        assert dockerfiles.get(name) == (REPO / "docker" / "Dockerfile.airflow").resolve()
        deps = depends_on_of(svc)
        assert deps["postgres"]["condition"] == "service_healthy", name
        assert deps["airflow-init"]["condition"] == "service_completed_successfully", name
    # All components share the secrets that sign and check task tokens.
    for key in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"):
        values = {env_of(services[name])[key] for name in AIRFLOW_COMMANDS}
        assert len(values) == 1 and values != {""}, f"{key} differs between components"


def test_airflow_init_migrates_and_creates_admin(services):
    env = env_of(services["airflow-init"])
    assert env["_AIRFLOW_DB_MIGRATE"] == "true"
    assert env["_AIRFLOW_WWW_USER_CREATE"] == "true"
    assert env["_AIRFLOW_WWW_USER_USERNAME"] and env["_AIRFLOW_WWW_USER_PASSWORD"]
    assert "fab_auth_manager" in env["AIRFLOW__CORE__AUTH_MANAGER"], "users are created by the FAB auth manager"
    assert "/entrypoint" in " ".join(command_tokens(services["airflow-init"]))


def test_metadata_db_is_the_postgres_service(services, airflow_env):
    url = urlsplit(airflow_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    pg = env_of(services["postgres"])
    assert url.scheme.startswith("postgresql")
    assert url.hostname == "postgres"
    assert (url.username, url.password, url.path.lstrip("/")) == (
        pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"])


def test_execution_api_points_at_api_server(services, airflow_env):
    url = urlsplit(airflow_env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert url.hostname == "airflow-api-server" and url.port == 8080 and url.path.startswith("/execution")
    assert any(str(p).endswith(":8080") for p in services["airflow-api-server"].get("ports", []))


def test_dags_folder_is_mounted(services):
    for name in AIRFLOW_COMMANDS:
        mounts = {m["target"]: m for m in mounts_of(services[name])}
        assert mounts["/opt/airflow/dags"]["source"] == "./dags", name
    assert (REPO / "dags" / "plgd_events_etl.py").is_file()


def test_etl_dag_env(airflow_env):
    assert float(airflow_env["PLGD_ETL_SCHEDULE_SECONDS"]) > 0
    start = airflow_env["PLGD_ETL_START_DATE"]
    from datetime import datetime, timezone

    parsed = datetime.fromisoformat(start.replace("Z", "+00:00"))
    assert parsed.tzinfo is not None and parsed < datetime.now(timezone.utc), start
