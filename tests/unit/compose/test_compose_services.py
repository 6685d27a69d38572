"""Static checks of ``docker-compose.airflow.yml`` (docs/compose.md), continued: the connections and
the shared storage, NATS, the stream and the simulator, and ``docker compose config`` when the
client is installed (test_compose.py: how the file is read, its structure, Airflow).
"""

from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import pytest

from tests.unit.compose.compose_file import (
    AIRFLOW_COMMANDS,
    COMPOSE_FILE,
    REPO,
    SIMULATOR_FLAGS,
    STREAM_CONFIG,
    command_list,
    command_tokens,
    depends_on_of,
    dockerfile_from_images,
    env_of,
    flag_value,
    master_url,
    mounts_of,
)

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
