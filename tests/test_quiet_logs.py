"""A run's logs show StreamRL's own lines: transformers' "Writing model shards" and
"Loading weights" bars (one per weight version saved and loaded, so hundreds a run) are
off in every process the `streamrl` command starts."""

import os
import subprocess
import sys

SAVE_AND_LOAD = """
import sys, tempfile
if sys.argv[1] == "as-streamrl":
    import streamrl.cli  # what every StreamRL process imports first
from transformers import AutoModelForCausalLM
from streamrl.runtime.tiny_lm import build_tiny_model
folder = tempfile.mkdtemp()
build_tiny_model(folder, seed=1)
AutoModelForCausalLM.from_pretrained(folder).save_pretrained(folder + "/again")
AutoModelForCausalLM.from_pretrained(folder + "/again")
print("done")
"""


def save_and_load(mode: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY")}
    result = subprocess.run(
        [sys.executable, "-c", SAVE_AND_LOAD, mode], capture_output=True, text=True, timeout=120, env=env, check=True
    )
    assert "done" in result.stdout
    return result.stderr


def test_library_progress_bars_are_off_in_streamrl_processes():
    assert "Loading weights" in save_and_load("plain")  # what the libraries print on their own
    quiet = save_and_load("as-streamrl")
    assert "Loading weights" not in quiet and "Writing model shards" not in quiet and "it/s" not in quiet
