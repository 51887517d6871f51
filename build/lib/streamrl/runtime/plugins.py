"""Loading a recipe's own Python: evaluators, rollout workers, trainers, advantage
estimators, named as "path/to/file.py:ClassName" (or a bare file for modules whose
import registers something). A file is loaded as a module of a package standing for its
folder, so it imports its neighbours relatively (`from .my_algorithm import f`, as the
guide's trainers do); the folder also goes on sys.path, so plain `import my_algorithm`
works too."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType


class LoadError(ValueError):
    pass


def load_module(path: str | Path, spec: str | None = None) -> ModuleType:
    """Import the file at `path` once per process (by its absolute path)."""
    path = Path(path).resolve()
    spec = spec or str(path)
    if not path.is_file():
        raise LoadError(f"{spec!r}: file not found: {path}")
    module_name = f"{folder_package(path.parent)}.{path.stem}"
    if module_name not in sys.modules:
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        if module_spec is None or module_spec.loader is None:
            raise LoadError(f"{path}: not a Python module")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[module_name]
            raise LoadError(f"{spec!r}: importing {path} failed: {type(exc).__name__}: {exc}") from exc
    return sys.modules[module_name]


def folder_package(folder: Path) -> str:
    """The package standing for `folder` (named the same in every process, so a class
    from it pickles by reference), made on first use."""
    digest = hashlib.sha1(str(folder).encode()).hexdigest()[:12]
    stem = re.sub(r"\W", "_", folder.name)
    name = f"streamrl_user_{stem}_{digest}"
    if name not in sys.modules:
        package = ModuleType(name)
        package.__path__ = [str(folder)]
        package.__package__ = name
        spec = importlib.util.spec_from_loader(name, loader=None, is_package=True)
        if spec is not None:  # always, for a name and is_package
            spec.submodule_search_locations = [str(folder)]
        package.__spec__ = spec
        sys.modules[name] = package
    return name


def load_class(spec: str, base_dir: str | Path = ".", expected: type | None = None) -> type:
    """The class named by "path/to/file.py:ClassName" (the path relative to `base_dir`)."""
    path_text, sep, class_name = spec.rpartition(":")
    if not sep or not path_text or not class_name:
        raise LoadError(f"{spec!r}: expected 'path/to/file.py:ClassName'")
    module = load_module(Path(base_dir) / path_text, spec)
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise LoadError(f"{spec!r}: {Path(path_text).name} defines no class {class_name!r}")
    if expected is not None and not issubclass(cls, expected):
        raise LoadError(f"{spec!r}: {class_name} is not a subclass of {expected.__name__}")
    return cls


def load_function(spec: str, base_dir: str | Path = ".") -> object:
    """The function named by "path/to/file.py:function_name" (the path relative to `base_dir`)."""
    path_text, sep, name = spec.rpartition(":")
    if not sep or not path_text or not name:
        raise LoadError(f"{spec!r}: expected 'path/to/file.py:function_name'")
    function = getattr(load_module(Path(base_dir) / path_text, spec), name, None)
    if not callable(function) or isinstance(function, type):
        raise LoadError(f"{spec!r}: {Path(path_text).name} defines no function {name!r}")
    return function
