"""PEP 562 lazy namespaces: a package lists its public names and the module each lives in;
a name is imported on first use, so importing the package imports nothing heavy."""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any


def lazy_attribute(package: str, exports: dict[str, str], name: str) -> Any:
    """``name`` from the module ``exports`` maps it to (relative to ``package``), cached in
    the package's namespace. ``"module"``: that module's attribute of the same name;
    ``"module:attribute"``: another name; ``"name:"``: the submodule itself."""
    where = exports.get(name)
    if where is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module_name, _, attribute = where.partition(":")
    module = importlib.import_module(f".{module_name}", package)
    value = module if where.endswith(":") else getattr(module, attribute or name)
    setattr(sys.modules[package], name, value)  # later lookups skip __getattr__
    return value


def moved_attribute(package: str, name: str, where: str) -> Any:
    """``package.name``, which moved to ``package.where`` (``"attention.entropy"``, or a
    submodule: ``"scoring"``): that object, with a `FutureWarning` naming the new place, on
    every use (not cached, so each old spelling warns). The wording is
    `gna_interp.core.keywords.renamed_message`'s (not imported: this module imports nothing heavy)."""
    module_name, _, attribute = where.rpartition(".")
    value = (
        importlib.import_module(f".{where}", package)
        if not module_name
        else getattr(importlib.import_module(f".{module_name}", package), attribute)
    )
    old, new = f"{package}.{name}", f"{package}.{where}"
    message = f"{old} is renamed {new} (issue 53); the old name still works in this release and goes in the next: write {new}"
    warnings.warn(message, FutureWarning, stacklevel=3)
    return value


def public_dir(exports: list[str], namespace: dict[str, Any]) -> list[str]:
    """What ``dir(package)`` lists: the public names and the module's dunders (``__version__``,
    ``__all__``), not its helper imports (``Any``, ``annotations``, ``lazy_attribute``) nor
    submodules that happen to be loaded."""
    return sorted({*exports, *(name for name in namespace if name.startswith("__"))})
