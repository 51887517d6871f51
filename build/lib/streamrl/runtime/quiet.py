"""Library progress bars off inside StreamRL's processes.

transformers and huggingface_hub draw a tqdm bar for every model load and save
("Loading weights", "Writing model shards"): a learner saves a weight version and a
worker loads one every step, so a run's logs filled with hundreds of bars. StreamRL
shows its own progress (`streamrl run`'s bars, the learner's step lines). Both libraries
read these variables when first imported, so this runs before they are; a user who sets
them keeps their choice.
"""

from __future__ import annotations

import os


def quiet_library_progress() -> None:
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
