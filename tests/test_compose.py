"""docker-compose.yml parses and speaks the settings code's language."""

import shutil
import subprocess
from pathlib import Path

import yaml

from runtime.settings import DEFAULT_KAFKA_PORT, DEFAULT_POSTGRES_PORT, ENV_VARS

COMPOSE = Path(__file__).resolve().parent.parent / "docker-compose.yml"


def load():
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_parses():
    spec = load()
    assert {"kafka", "postgres", "ledger-sink", "migrate"} <= set(spec["services"])
    has_compose = shutil.which("docker") and subprocess.run(
        ["docker", "compose", "version"], capture_output=True).returncode == 0
    if has_compose:  # the compose client validates the file without an engine
        result = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"],
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def test_ports_and_variables_match_the_settings():
    services = load()["services"]
    assert f"{DEFAULT_KAFKA_PORT}:{DEFAULT_KAFKA_PORT}" in services["kafka"]["ports"]
    assert f"{DEFAULT_POSTGRES_PORT}:{DEFAULT_POSTGRES_PORT}" in services["postgres"]["ports"]
    for name in ("ledger-sink", "migrate"):
        env = services[name]["environment"]
        unknown = set(env) - set(ENV_VARS)
        assert not unknown, f"{name} sets variables StreamRL does not read: {unknown}"
        host, port = env["STREAMRL_KAFKA_BOOTSTRAP"].split(":")
        assert host == "kafka" and f"{port}" in services["kafka"]["environment"]["KAFKA_LISTENERS"]
        pg = services["postgres"]["environment"]
        assert env["STREAMRL_DATABASE_URL"] == (
            f"postgresql://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:{DEFAULT_POSTGRES_PORT}/{pg['POSTGRES_DB']}")
        assert int(env["STREAMRL_KAFKA_MAX_MESSAGE_BYTES"]) <= services["kafka"]["environment"]["KAFKA_MESSAGE_MAX_BYTES"]
