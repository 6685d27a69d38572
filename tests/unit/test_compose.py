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

import configparser
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.airflow.yml"
STREAM_CONFIG = REPO / "docker" / "nats" / "jetstream.json"
DOCS = REPO / "docs" / "compose.md"

#: role -> service name; every role must exist.
REQUIRED_SERVICES = {
    "metadata DB": "postgres",
    "airflow init": "airflow-init",
    "airflow api-server": "airflow-api-server",
    "airflow scheduler": "airflow-scheduler",
    "airflow dag-processor": "airflow-dag-processor",
    "airflow triggerer": "airflow-triggerer",
    "nats": "nats",
    "stream init": "nats-init",
    "spark master": "spark-master",
    "spark worker": "spark-worker",
    "simulator": "simulator",
}
AIRFLOW_COMMANDS = {
    "airflow-api-server": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
}
#: services that run once and exit (``restart: "no"``); every other service is long-running.
ONE_SHOT_SERVICES = {"airflow-init", "nats-init", "simulator"}
#: flags of ``plgd-simulate`` (setup.cfg console script; airflow_provider_plgd.simulator.cli).
SIMULATOR_FLAGS = {
    "--servers", "--stream", "--create-stream", "--seed", "--owners", "--devices", "--resources",
    "--intervals", "--interval-seconds", "--faults", "--ground-truth", "--no-wait",
}
#: images whose exact tags have two numeric parts (postgres 16.9 is a patch release).
TWO_PART_VERSIONED_IMAGES = {"postgres"}
DEPENDS_ON_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
SECRET_ENV = re.compile(r"PASSWORD|SECRET|FERNET|TOKEN|_KEY$")

# --------------------------------------------------------------------------------------------
# helpers


_VAR_RE = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^{}]*)\}|(?P<named>[A-Za-z_][A-Za-z0-9_]*))")
_BRACED_RE = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?", re.S)


def interpolate(text: str, variables: dict[str, str | None]) -> str:
    """Compose interpolation with an empty environment: ``${VAR:-d}``/``${VAR-d}`` -> ``d``, ``$$`` -> ``$``.

    Records every variable in ``variables`` (name -> default, or None when it has none).
    """

    def repl(match: re.Match) -> str:
        if match.group("escaped"):
            return "$"
        if match.group("named"):
            variables.setdefault(match.group("named"), None)
            return ""
        braced = _BRACED_RE.fullmatch(match.group("braced"))
        assert braced, f"cannot parse interpolation {match.group(0)!r}"
        name, op, arg = braced.group("name", "op", "arg")
        if op in (":-", "-"):
            variables[name] = arg
            return arg
        variables.setdefault(name, None)
        return ""

    return _VAR_RE.sub(repl, text)


def interpolate_tree(node, variables: dict[str, str | None]):
    if isinstance(node, str):
        return interpolate(node, variables)
    if isinstance(node, list):
        return [interpolate_tree(item, variables) for item in node]
    if isinstance(node, dict):
        return {key: interpolate_tree(value, variables) for key, value in node.items()}
    return node


def env_of(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def depends_on_of(service: dict) -> dict[str, dict]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {name: {"condition": "service_started"} for name in deps}
    return {name: (spec or {"condition": "service_started"}) for name, spec in deps.items()}


def mounts_of(service: dict) -> list[dict]:
    """Volumes as dicts: type ('volume' or 'bind'), source, target, read_only."""
    out = []
    for item in service.get("volumes") or []:
        if isinstance(item, dict):
            out.append({"type": item.get("type", "volume"), "source": item.get("source"),
                        "target": item["target"], "read_only": bool(item.get("read_only"))})
            continue
        parts = item.split(":")
        if len(parts) == 1:  # anonymous volume
            out.append({"type": "volume", "source": None, "target": parts[0], "read_only": False})
            continue
        source, target = parts[0], parts[1]
        kind = "bind" if source.startswith((".", "/", "~")) else "volume"
        out.append({"type": kind, "source": source, "target": target,
                    "read_only": len(parts) > 2 and "ro" in parts[2].split(",")})
    return out


def command_tokens(service: dict) -> list[str]:
    tokens: list[str] = []
    for key in ("entrypoint", "command"):
        value = service.get(key)
        if value is None:
            continue
        for part in [value] if isinstance(value, str) else value:
            tokens.extend(re.split(r"[\s;|&()'\"]+", str(part)))
    return [t for t in tokens if t]


def command_list(service: dict) -> list[str]:
    value = service.get("command")
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def flag_value(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]


def pin_problem(ref: str) -> str | None:
    """None when ``ref`` names an exact image version; else what is wrong."""
    if "$" in ref:
        return f"{ref!r} has an unresolved variable"
    if "@sha256:" in ref:
        return None
    last = ref.rsplit("/", 1)[-1]
    if ":" not in last:
        return f"{ref!r} has no tag (means :latest)"
    repo, tag = ref.rsplit(":", 1)
    if "latest" in tag.lower():
        return f"{ref!r} uses a latest tag"
    if re.search(r"\d+\.\d+\.\d+", tag):
        return None
    if repo.rsplit("/", 1)[-1] in TWO_PART_VERSIONED_IMAGES and re.match(r"\d+\.\d+(\D|$)", tag):
        return None
    return f"{ref!r}: tag {tag!r} is not an exact version (floating tag)"


def dockerfile_from_images(path: Path) -> list[str]:
    """The image references of every ``FROM`` (ARG defaults resolved; earlier stage names excluded)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    args: dict[str, str] = {}
    stages: set[str] = set()
    images: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        instruction = words[0].upper()
        if instruction == "ARG" and not images and len(words) > 1 and "=" in words[1]:
            name, default = words[1].split("=", 1)
            args[name] = default.strip("\"'")
        elif instruction == "FROM":
            rest = [w for w in words[1:] if not w.startswith("--")]
            ref = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: args.get(m.group(1), m.group(0)), rest[0])
            if ref not in stages:
                images.append(ref)
            if len(rest) >= 3 and rest[1].upper() == "AS":
                stages.add(rest[2])
    return images


def master_url(conn: dict) -> str:
    """The master URL the Spark provider builds (SparkSubmitHook._resolve_connection)."""
    host, port = conn.get("host") or "", conn.get("port")
    if conn["conn_type"] == "spark" and host and ("://" in host or not port):
        master = host
    else:
        master = f"{conn['conn_type']}://{host}"
    return f"{master}:{port}" if port else master


# --------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def raw() -> dict:
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


# --------------------------------------------------------------------------------------------
# connections and shared storage


def test_plgd_jetstream_connection(services, airflow_env):
    conn = json.loads(airflow_env["AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT"])
    assert conn["conn_type"] == "plgd_jetstream"
    extra = conn["extra"]
    assert extra["stream"] == json.loads(STREAM_CONFIG.read_text())["name"] == "EVENTS"
    servers = [urlsplit(s.strip()) for s in extra["servers"].split(",")]
    for url in servers:
        assert url.scheme in ("nats", "tls"), url
        assert url.hostname in services, f"server {url.geturl()} is not a compose service"
        assert url.port == 4222
    # storage_root: the same named volume at the same path where tasks run (scheduler) and on
    # the Spark workers (executors), and a plain local path (no scheme).
    root = PurePosixPath(extra["storage_root"])
    assert root.is_absolute(), root

    def volume_holding(name: str) -> tuple[str, str]:
        for mount in mounts_of(services[name]):
            target = PurePosixPath(mount["target"])
            if mount["type"] == "volume" and (root == target or target in root.parents):
                return mount["source"], mount["target"]
        raise AssertionError(f"{name} does not mount the storage root {root}")

    assert volume_holding("airflow-scheduler") == volume_holding("spark-worker")


def test_spark_connection_points_at_the_master(services, airflow_env):
    conn = json.loads(airflow_env["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert conn["conn_type"] == "spark"
    assert conn.get("extra", {}).get("deploy-mode", "client") == "client", "the driver runs in the scheduler"
    master = master_url(conn)
    assert master == "spark://spark-master:7077"
    master_cmd = command_list(services["spark-master"])
    assert "org.apache.spark.deploy.master.Master" in master_cmd
    assert flag_value(master_cmd, "--port") == "7077"
    assert flag_value(master_cmd, "--host") == "spark-master"
    worker_cmd = command_list(services["spark-worker"])
    assert "org.apache.spark.deploy.worker.Worker" in worker_cmd
    assert worker_cmd[-1] == master
    assert depends_on_of(services["spark-worker"])["spark-master"]["condition"] == "service_healthy"
    # Executors connect back to the driver in the scheduler container by its service name.
    assert env_of(services["airflow-scheduler"]).get("SPARK_LOCAL_HOSTNAME") == "airflow-scheduler"


def test_connections_resolve_with_the_real_code(airflow_env, monkeypatch):
    """The env-var connections as Airflow, the plgd hook and the Spark provider read them."""
    pytest.importorskip("airflow")
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from airflow_provider_plgd.jetstream.connection import settings_from_connection

    for key in ("AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT", "AIRFLOW_CONN_SPARK_DEFAULT"):
        monkeypatch.setenv(key, airflow_env[key])
    from airflow.models.connection import Connection

    conn = Connection.from_json(airflow_env["AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT"], conn_id="plgd_jetstream_default")
    settings = settings_from_connection(conn)
    assert settings.servers == ("nats://nats:4222",)
    assert settings.stream == "EVENTS"
    assert settings.storage_root == "/opt/plgd/data"
    spark = SparkSubmitHook(conn_id="spark_default")._connection
    assert spark["master"] == "spark://spark-master:7077"
    assert spark["deploy_mode"] == "client"
    assert spark["spark_binary"] == "spark-submit"


def test_spark_cluster_matches_pyspark(services, dockerfiles):
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    pins = re.findall(r"pyspark==([\d.]+)", setup["options.extras_require"]["spark"])
    assert pins, "setup.cfg spark extra does not pin pyspark"
    pyspark = pins[0]
    dockerfile = (REPO / "docker" / "Dockerfile.airflow").read_text()
    assert f'"pyspark=={pyspark}"' in dockerfile, f"Dockerfile.airflow must pin pyspark=={pyspark}"
    assert re.search(r"\[[a-z,]*\bspark\b[a-z,]*\]", dockerfile), "the provider must be installed with its spark extra"
    airflow_build = dockerfiles["airflow-scheduler"]
    for name in ("spark-master", "spark-worker"):
        if name in dockerfiles:
            assert dockerfiles[name] == airflow_build, f"{name} must use the Airflow image (same Spark and Python)"
            assert services[name]["image"] == services["airflow-scheduler"]["image"]
        else:  # a Spark image: major.minor must equal pyspark's
            tag = services[name]["image"].rsplit(":", 1)[-1]
            assert tag.startswith(".".join(pyspark.split(".")[:2])), f"{name}: {tag} vs pyspark {pyspark}"


def test_dockerfile_java_17_and_provider_from_repo():
    path = REPO / "docker" / "Dockerfile.airflow"
    froms = dockerfile_from_images(path)
    assert any(ref.startswith("apache/airflow:") and "3." in ref.split(":", 1)[1] for ref in froms), froms
    assert any(re.match(r"eclipse-temurin:17\.", ref) for ref in froms) or "openjdk-17" in path.read_text()
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        words = line.split()
        if words and words[0].upper() == "COPY" and not any(w.startswith("--from") for w in words):
            for source in [w for w in words[1:-1] if not w.startswith("--")]:
                assert (REPO / source).exists(), f"Dockerfile COPY source {source} does not exist"
    assert 'apache-airflow[postgres,fab]==${AIRFLOW_VERSION}' in text, "pin Airflow to the base image's version"


# --------------------------------------------------------------------------------------------
# NATS, the stream, the simulator


def test_stream_config_matches_plgd_bundle():
    """docs/wire-format.md §1.5: the bundle's bundle/jetstream.json settings."""
    cfg = json.loads(STREAM_CONFIG.read_text())
    assert cfg["name"] == "EVENTS"
    assert cfg["subjects"] == ["plgd.>"]
    assert cfg["retention"] == "limits"
    assert cfg["storage"] == "file"
    assert cfg["discard"] == "old"
    assert cfg["max_age"] == 0
    assert cfg["duplicate_window"] == 10 * 60 * 10**9  # ns
    assert cfg["max_msgs"] == cfg["max_bytes"] == cfg["max_msg_size"] == -1
    assert cfg["max_msgs_per_subject"] == 0
    assert cfg["num_replicas"] == 1


def test_nats_service_and_stream_init(services):
    nats = services["nats"]
    args = command_list(nats)
    assert "-js" in args or "--jetstream" in args
    store = flag_value(args, "-sd")
    assert any(m["type"] == "volume" and m["target"] == store for m in mounts_of(nats)), "JetStream store not on a volume"
    assert flag_value(args, "-m") == "8222"
    assert "8222" in " ".join(map(str, nats["healthcheck"]["test"]))
    init = services["nats-init"]
    script = " ".join(command_tokens(init))
    assert "stream add EVENTS --config /config/jetstream.json" in script
    assert "nats://nats:4222" in script
    mounts = {m["target"]: m for m in mounts_of(init)}
    assert mounts["/config/jetstream.json"]["source"] == "./docker/nats/jetstream.json"
    assert depends_on_of(init)["nats"]["condition"] == "service_healthy"


def test_simulator_command(services, airflow_env, dockerfiles):
    sim = services["simulator"]
    args = [*(sim.get("entrypoint") or [])[2:], *command_list(sim)]  # past dumb-init --
    assert args[0] == "plgd-simulate"
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    assert "plgd-simulate" in setup["options.entry_points"]["console_scripts"]
    assert dockerfiles["simulator"] == dockerfiles["airflow-scheduler"], "the simulator runs from the provider image"
    flags = {a for a in args if a.startswith("--")}
    assert flags <= SIMULATOR_FLAGS, f"unknown plgd-simulate flags: {sorted(flags - SIMULATOR_FLAGS)}"
    servers = urlsplit(flag_value(args, "--servers"))
    assert servers.hostname == "nats" and servers.port == 4222
    conn = json.loads(airflow_env["AIRFLOW_CONN_PLGD_JETSTREAM_DEFAULT"])
    assert flag_value(args, "--stream") == conn["extra"]["stream"]
    # One simulated interval = one DAG data interval.
    assert float(flag_value(args, "--interval-seconds")) == float(airflow_env["PLGD_ETL_SCHEDULE_SECONDS"])
    assert int(flag_value(args, "--intervals")) > 0
    ground_truth = PurePosixPath(flag_value(args, "--ground-truth"))
    assert any(m["type"] == "volume" and PurePosixPath(m["target"]) in ground_truth.parents for m in mounts_of(sim))
    assert depends_on_of(sim)["nats-init"]["condition"] == "service_completed_successfully"


def test_simulator_has_the_devtools_its_ground_truth_needs(services):
    """``--ground-truth`` loads plgd_devtools.ground_truth, which the provider's wheel does not ship: the
    image copies plgd_devtools/ outside the installed provider and the simulator has it on PYTHONPATH."""
    args = command_list(services["simulator"])
    assert "--ground-truth" in args
    folder = env_of(services["simulator"])["PYTHONPATH"]
    text = re.sub(r"\\\n", " ", (REPO / "docker" / "Dockerfile.airflow").read_text())
    assert re.search(rf"^COPY\s.*\bplgd_devtools\s+{re.escape(folder)}/plgd_devtools\s*$", text, re.M), folder
    assert "!plgd_devtools/" in (REPO / "docker" / "Dockerfile.airflow.dockerignore").read_text().split()
    for name in AIRFLOW_COMMANDS:  # Airflow itself runs the installed provider only
        assert "PYTHONPATH" not in env_of(services[name]), name


def test_simulator_flags_exist_in_the_cli(services):
    """Cross-check with ``plgd-simulate --help`` when the CLI is installed and importable."""
    script = Path(sys.executable).parent / "plgd-simulate"
    if not script.exists():
        pytest.skip("plgd-simulate is not installed in this environment")
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        pytest.skip(f"plgd-simulate --help failed (CLI not built yet?): {proc.stderr.strip()[-200:]}")
    args = command_list(services["simulator"])
    for flag in (a for a in args if a.startswith("--")):
        assert flag in proc.stdout, f"plgd-simulate has no {flag} option"


# --------------------------------------------------------------------------------------------
# docker compose itself (optional: only the client is needed, not an engine)


def _compose_command() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    if legacy and subprocess.run([legacy, "version"], capture_output=True).returncode == 0:
        return [legacy]
    return None


def test_docker_compose_config_accepts_the_file():
    command = _compose_command()
    if command is None:
        pytest.skip("the docker compose client is not installed")
    proc = subprocess.run([*command, "-f", str(COMPOSE_FILE), "config", "-q"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    if proc.returncode != 0 and re.search(r"Cannot connect to the Docker daemon|docker daemon", proc.stderr, re.I):
        pytest.skip("docker compose config needs an engine here")
    assert proc.returncode == 0, proc.stderr
