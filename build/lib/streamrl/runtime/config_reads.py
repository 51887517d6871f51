"""A custom worker's or trainer's own keys (those of `rollout_worker` or `algorithm` that
StreamRL does not define) must be read by something, or the recipe says so: a misspelt
`use_few_shot` or `clip_ratio_hgh` must not be accepted and ignored.

A class that declares its keys (`config_keys = ("use_few_shot", ...)`) has the others
refused when the recipe is checked (streamrl/checks.py). For one that does not, the config
it is given records what it reads. After a worker's first rollouts, or a trainer's first
step, the keys it never read are reported once, in the process's log and in the ledger as
a `config_unread` run event (producers/worker_loop.py, learner/loop.py).
"""

from __future__ import annotations

import threading


class WorkerConfig(dict):
    """Config keys as attributes too (`self._config.temperature`), as the guide writes
    them; every key read, by either spelling or `get`, is remembered in `read`."""

    section = "rollout_worker"  # named in a missing key's error

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # set through object's own path: a key named like them stays a key
        object.__setattr__(self, "_read", set())
        object.__setattr__(self, "_lock", threading.Lock())  # rollouts run in threads

    def _note(self, key) -> None:
        with self._lock:
            self._read.add(key)

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        self._note(key)
        return super().__contains__(key)

    def _note_all(self) -> None:
        with self._lock:
            self._read.update(super().keys())

    # handing the whole mapping on (iterating it, `**config`, copying it) reads every key
    def __iter__(self):
        self._note_all()
        return super().__iter__()

    def keys(self):
        self._note_all()
        return super().keys()

    def items(self):
        self._note_all()
        return super().items()

    def values(self):
        self._note_all()
        return super().values()

    def copy(self):
        self._note_all()
        return dict(super().items())

    def __reduce__(self):  # copy.deepcopy and pickle: a plain copy of every key
        self._note_all()
        return (type(self), (dict(super().items()),))

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"{self.section} config has no key {name!r}") from None

    @property
    def read(self) -> set[str]:
        with self._lock:
            return set(self._read)


class ConfigSection(WorkerConfig):
    """One section of the recipe as a trainer's `config` holds it (see `trainer_config`)."""

    def __init__(self, section: str, values: dict):
        super().__init__(
            {key: ConfigSection(f"{section}.{key}", value) if isinstance(value, dict) else value for key, value in values.items()}
        )
        object.__setattr__(self, "section", section)

    def __reduce__(self):
        self._note_all()
        return (type(self), (self.section, dict(super().items())))


def trainer_config(values: dict) -> ConfigSection:
    """The whole recipe as the guide's trainers are built with it (`cls(config)`, then
    `config.algorithm.get("my_param", 0.5)` or `self._config.algorithm.discount_factor`):
    every section a mapping with attribute access, remembering the keys it gave out
    (`config["algorithm"].read`)."""
    return ConfigSection("recipe", values)


def unread_keys(config, own_keys) -> list[str]:
    """The worker's own keys its config object never gave out (none when the config is
    not a WorkerConfig: the worker built its own)."""
    if not isinstance(config, WorkerConfig):
        return []
    return sorted(set(own_keys) - config.read)


def undeclared_keys(worker_class: type, own_keys) -> list[str]:
    """The section's own keys a worker class that declares `config_keys` does not name."""
    declared = getattr(worker_class, "config_keys", None)
    if declared is None:
        return []
    return sorted(set(own_keys) - set(declared))
