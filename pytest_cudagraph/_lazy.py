"""Lazy doors: a package whose public names resolve on first use, listed once.

A door lists what it exports in one place, the ``if TYPE_CHECKING:`` imports of its
``__init__.py`` (``from module import Name as Name``), which type checkers read; ``lazy_door``
reads the same imports from the file and gives the package its ``__getattr__``, ``__dir__`` and
``__all__``, so that importing the package imports nothing behind it (no torch) until a name is
used.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable, Sequence
from pathlib import Path


def exports_of(source: str) -> dict[str, str]:
    """Public name -> the module it is imported from, in the ``if TYPE_CHECKING:`` blocks."""
    found: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom) and statement.module:
                    for alias in statement.names:
                        found[alias.asname or alias.name] = statement.module
    return found


def lazy_door(
    package: str, init_file: str, own: dict[str, object], defined: Sequence[str] = ()
) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``, whose ``__init__.py`` is
    ``init_file`` and whose namespace is ``own`` (its ``globals()``): every name of its
    TYPE_CHECKING imports, and the names it ``defined`` itself."""
    exports = exports_of(Path(init_file).read_text(encoding="utf-8"))

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        own[name] = value  # later lookups skip this function
        return value

    names = sorted({*exports, *defined})

    def __dir__() -> list[str]:
        return sorted(set(own) | set(names))

    return __getattr__, __dir__, names
