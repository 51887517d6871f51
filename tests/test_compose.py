"""The reference cluster's files: docker-compose.yml and deploy/kubernetes/ parse and
validate (the compose client's own check; the Kubernetes API schemas), set only the
variables StreamRL reads, with values its settings accept, and start the commands
`streamrl run` starts, with options the CLI has."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import typer.main
import yaml

from streamrl.cli import app
from streamrl.runtime.settings import DEFAULT_POSTGRES_PORT, ENV_VARS, SGLANG_VERSION, Settings

REPO = Path(__file__).resolve().parent.parent
COMPOSE = REPO / "docker-compose.yml"
MANIFESTS = REPO / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.33.0"


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def manifests() -> list[dict]:
    return [doc for path in sorted(MANIFESTS.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def streamrl_commands(argv: list[str]) -> list[str]:
    """The `streamrl ...` (or `torchrun ... -m streamrl.cli ...`) command in a container's argv."""
    words = shlex.split(argv[-1]) if argv[:2] == ["sh", "-c"] else argv
    words = [w for w in words if w != "exec"]
    if words and words[0] == "torchrun":
        words = ["streamrl", *words[words.index("streamrl.cli") + 1 :]]
    return words[1:] if words and words[0] == "streamrl" else []


def check_cli_accepts(args: list[str]) -> str:
    """The subcommand of `args`, after checking that each --option is one it has."""
    group = typer.main.get_command(app)
    command = group.commands[args[0]]
    if args[0] == "db":
        command = command.commands[args[1]]
    options = {opt for param in command.params for opt in param.opts}
    used = {word for word in args if word.startswith("--")}
    assert used <= options, f"streamrl {' '.join(args)}: no such options {used - options}"
    return args[0]


def commands_streamrl_run_starts() -> set[str]:
    """The subcommands in the argument lists `streamrl/orchestrate.py` spawns."""
    source = (REPO / "streamrl" / "orchestrate.py").read_text()
    return set(re.findall(r'\["([a-z]+)"', source))


def test_compose_validates_and_runs_every_role():
    spec = compose()
    assert {
        "kafka",
        "postgres",
        "migrate",
        "publisher",
        "sglang",
        "worker",
        "processor-a",
        "processor-b",
        "ledger-sink",
        "learner",
    } <= set(spec["services"])
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        result = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    services = spec["services"]
    started = {
        check_cli_accepts(streamrl_commands(s["command"])) for s in services.values() if streamrl_commands(s.get("command", []))
    }
    assert commands_streamrl_run_starts() == {"publish", "sink", "processor", "learner", "worker", "tracker"}
    assert commands_streamrl_run_starts() | {"up"} == started  # `up`: migrations and the bus key, once
    # GPUs where the model runs, restart policies and health checks where a service waits on one
    for name in ("sglang", "learner"):
        assert services[name]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert services["learner"]["command"][0] == "torchrun"
    assert services["worker"]["deploy"]["replicas"] >= 2
    assert services["sglang"]["image"].endswith(f":v{SGLANG_VERSION}")
    assert all("restart" in s for s in services.values())
    for name in ("kafka", "postgres", "sglang"):
        assert "healthcheck" in services[name]


def test_compose_settings_are_the_ones_streamrl_reads(monkeypatch):
    services = compose()["services"]
    env = services["ledger-sink"]["environment"]
    assert set(env) <= set(ENV_VARS), set(env) - set(ENV_VARS)
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    settings = Settings.from_env()  # every value one the settings accept
    assert settings.partition_assignment == "group" and settings.group_membership == "static"
    host, port = env["STREAMRL_KAFKA_BOOTSTRAP"].split(":")
    assert host == "kafka" and port in services["kafka"]["environment"]["KAFKA_LISTENERS"]
    pg = services["postgres"]["environment"]
    assert env["STREAMRL_DATABASE_URL"] == (
        f"postgresql://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:{DEFAULT_POSTGRES_PORT}/{pg['POSTGRES_DB']}"
    )
    assert int(env["STREAMRL_KAFKA_MAX_MESSAGE_BYTES"]) <= services["kafka"]["environment"]["KAFKA_MESSAGE_MAX_BYTES"]
    assert int(env["STREAMRL_TOPIC_PARTITIONS"]) == services["kafka"]["environment"]["KAFKA_NUM_PARTITIONS"]
    assert all(s["environment"] == env for s in services.values() if s.get("image") == "streamrl:latest")


@pytest.mark.parametrize("doc", manifests(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifest_validates_against_the_kubernetes_schemas(doc):
    if doc["apiVersion"].startswith("scheduling.volcano.sh/"):  # a CRD: no schema in the Kubernetes API
        assert doc["kind"] == "Queue"
        return
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_manifests_agree_with_the_settings_and_the_cli(monkeypatch):
    docs = {(d["kind"], d["metadata"]["name"]): d for d in manifests()}
    settings_map = docs[("ConfigMap", "streamrl-settings")]["data"]
    assert set(settings_map) <= set(ENV_VARS), set(settings_map) - set(ENV_VARS)
    for key, value in settings_map.items():
        monkeypatch.setenv(key, value)
    Settings.from_env()
    assert settings_map == {
        k: str(v) for k, v in compose()["services"]["ledger-sink"]["environment"].items() if k != "STREAMRL_KAFKA_BOOTSTRAP"
    } | {"STREAMRL_KAFKA_BOOTSTRAP": "kafka:9092"}
    started = set()
    for (kind, _name), doc in docs.items():
        if kind not in ("Deployment", "Job", "StatefulSet"):
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            args = streamrl_commands(container.get("command", []) + container.get("args", []))
            if args:
                started.add(check_cli_accepts(args))
                assert {"configMapRef": {"name": "streamrl-settings"}} in container["envFrom"]
    assert started == commands_streamrl_run_starts() | {"up"}
    workers = docs[("Deployment", "streamrl-worker")]
    assert workers["spec"]["replicas"] >= 2 and "--name" in workers["spec"]["template"]["spec"]["containers"][0]["args"]
    assert docs[("Deployment", "streamrl-processor")]["spec"]["replicas"] == 2
    learner = docs[("Job", "streamrl-learner")]["spec"]["template"]["spec"]["containers"][0]
    assert learner["command"] == ["torchrun"] and learner["resources"]["limits"]["nvidia.com/gpu"] == 8
