"""tinker-cookbook, a client program of its own, trains against `streamrl serve-training`.

The cookbook's minimal supervised and RL loops (`tinker_cookbook/recipes/sl_loop.py`,
`rl_loop.py`) run from the cookbook's own environment (`make cookbook-env`), with only
their renderer and dataset lines changed (the model is a local folder, not a hub name,
and the data sets are local files in the hub sets' formats); base URL, model, batch
sizes and steps are the scripts' own command-line options. Without the environment
these tests are skipped with that sentence, except under CI, where they fail."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from streamrl.runtime import db
from streamrl.runtime.model_init import init_model
from tests.conftest import free_port, fresh_database, required_environment, run_cli, start_serve_training
from tests.helpers.fine_tune import write_datasets
from tests.helpers.warm_model import warm_model_folder
from tests.test_rl_loop import scalar

COOKBOOK_VERSION = "0.5.8"
PORT = free_port()

# (the script's line, what replaces it): a cookbook release that changes one of these
# lines fails the test instead of running unchanged code against the hub.
RENDERER_LINE = (
    "renderer_name = model_info.get_recommended_renderer_name(config.model_name)",
    'renderer_name = "qwen3_instruct"',
)  # the chatml format of the local model's template
EDITS = {
    "sl_loop": [
        RENDERER_LINE,
        (
            'dataset = datasets.load_dataset("HuggingFaceH4/no_robots")',
            'dataset = datasets.load_dataset("json", data_files={"train": DATA})',
        ),
    ],
    "rl_loop": [
        RENDERER_LINE,
        (
            'dataset = datasets.load_dataset("openai/gsm8k", "main")',
            'dataset = datasets.load_dataset("json", data_files={"train": DATA})',
        ),
    ],
}


def cookbook_python() -> Path:
    default = Path.home() / ".cache" / "streamrl" / f"tinker-cookbook-{COOKBOOK_VERSION}" / "bin" / "python"
    python = Path(os.environ.get("STREAMRL_COOKBOOK_PYTHON") or default)
    return required_environment(python, f"no tinker-cookbook environment at {python}: `make cookbook-env` builds it")


def edited_script(python: Path, name: str, data: Path, out: Path) -> Path:
    """The cookbook's `tinker_cookbook.recipes.NAME` module with only the EDITS lines replaced."""
    source_file = subprocess.run(
        [str(python), "-c", f"import tinker_cookbook.recipes.{name} as m; print(m.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    source = Path(source_file).read_text()
    for old, new in EDITS[name]:
        assert source.count(old) == 1, f"{source_file}: the line {old!r} is not there once"
        source = source.replace(old, new.replace("DATA", repr(str(data))))
    changed = [line for line in source.splitlines() if line not in Path(source_file).read_text().splitlines()]
    assert len(changed) == len(EDITS[name]), changed
    script = out / f"{name}.py"
    script.write_text(source)
    return script


@pytest.fixture(scope="module")
def cookbook(stack, tmp_path_factory):
    python = cookbook_python()
    folder = tmp_path_factory.mktemp("cookbook")
    base = init_model("tiny-qwen2", folder / "tiny-qwen2", seed=0, dtype="float32")
    warmed = warm_model_folder(folder / "tiny-qwen2-boxed", "boxed")  # tests/helpers/fine_tune.py: warm_up
    chat, gsm8k = write_datasets(folder, rows=2048)
    # a ledger of its own: a service restores every open session of its ledger first
    ledger_env = {"STREAMRL_DATABASE_URL": fresh_database(stack, "cookbook")}
    process = start_serve_training("--model", f"{base}={base}", "--model", f"{warmed}={warmed}", port=PORT, env=ledger_env)
    key = run_cli("training-key", "create", "cookbook", env={**os.environ, **ledger_env}, check=True).stdout.split()[1]
    env = {**os.environ, "TINKER_API_KEY": key, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(folder / "hf")}
    ledger = db.connect(ledger_env["STREAMRL_DATABASE_URL"], autocommit=True)
    yield {
        "python": python,
        "folder": folder,
        "base": base,
        "warmed": warmed,
        "chat": chat,
        "gsm8k": gsm8k,
        "env": env,
        "ledger": ledger,
    }
    ledger.close()
    process.kill()
    process.wait()


def run_script(cookbook: dict, name: str, data: Path, model: Path, *options: str) -> list[dict]:
    """Run the edited script; return its metrics.jsonl rows."""
    log_path = cookbook["folder"] / f"{name}-log"
    script = edited_script(cookbook["python"], name, data, cookbook["folder"])
    result = subprocess.run(
        [
            str(cookbook["python"]),
            str(script),
            f"base_url=http://127.0.0.1:{PORT}",
            f"model_name={model}",
            f"log_path={log_path}",
            *options,
        ],
        env=cookbook["env"],
        cwd=cookbook["folder"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    checkpoints = [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()]
    assert checkpoints[-1]["name"] == "final" and checkpoints[-1]["sampler_path"].startswith("tinker://")
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def optim_steps(ledger, recipe_name: str) -> int:
    return scalar(
        ledger,
        """select count(*) from service_requests r join service_models m using (model_id)
                             join service_sessions s using (session_id)
                             where s.user_metadata->>'recipe_name' = %s and r.kind = 'optim_step'
                             and r.status = 'complete' and r.runs = 1""",
        recipe_name,
    )


def test_the_cookbooks_supervised_loop(cookbook):
    """sl_loop.py: LoRA rank 32, cross-entropy; its NLL falls, every step is an optim_step
    in the service's ledger, and its final state and sampler weights are saved."""
    metrics = run_script(
        cookbook,
        "sl_loop",
        cookbook["chat"],
        cookbook["base"],
        "batch_size=16",
        "max_steps=12",
        "learning_rate=3e-3",
        "save_every=5",
    )
    assert [row["step"] for row in metrics] == list(range(12))
    assert metrics[-1]["train_mean_nll"] < metrics[0]["train_mean_nll"] - 1.0, metrics
    assert optim_steps(cookbook["ledger"], "recipe_sl_loop") == 12


def test_the_cookbooks_rl_loop(cookbook):
    """rl_loop.py: samples groups from the service's sampler after each save, grades
    `\\boxed{}` answers, and trains with importance_sampling where a group's rewards
    differ; the ledger has one optim_step per step it trained (it skips all-equal batches)."""
    metrics = run_script(
        cookbook,
        "rl_loop",
        cookbook["gsm8k"],
        cookbook["warmed"],
        "batch_size=8",
        "group_size=8",
        "max_tokens=16",
        "max_steps=6",
        "learning_rate=1e-3",
        "save_every=3",
    )
    assert [row["step"] for row in metrics] == list(range(6))
    trained = [row for row in metrics if "optim_steps" in row]
    assert trained, metrics  # the warmed model answers correctly now and then: some groups differ
    assert optim_steps(cookbook["ledger"], "recipe_rl_loop") == len(trained)
    assert any(row["reward/total"] > 0 for row in metrics)
