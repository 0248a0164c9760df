"""The layout's rules, read from the source with ``ast`` (of ours, only the missing-GPU skip's
reason is imported): each module sits in one wing and imports only the wings below it, never a
private name of another module (a private module of the conformance wing may be imported); the
legacy layer is imported by the package root alone; the imports make no cycle; no two modules
share a name; the moved modules are gone; docs/architecture.md shows the wings as they are. And
a fact repeated across the tree (the missing-GPU skip, bytes per MiB) has one home, and no page
or module says when (an issue number, a round)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_cudagraph.skips import NEEDS_CUDA

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pytest_cudagraph", "reasyn_ref")
# The layer of earlier releases' spellings: the package root imports it, by name, where it is.
LEGACY = "pytest_cudagraph.conformance._legacy"
# The modules that moved, whose old paths the legacy layer serves: none is a file any more.
MOVED = (
    "pytest_cudagraph/target.py",
    "pytest_cudagraph/adapters.py",
    "pytest_cudagraph/conformance/target.py",
    *(
        f"pytest_cudagraph/conformance/{room}.py"
        for room in (
            "protocol",
            "adapters",
            "loading",
            "judging",
            "witness",
            "diagnosis",
            "processes",
            "progress",
            "suite",
            "legacy",
            "catalog",
        )
    ),
)

# Each module's wing, by the longest prefix of its dotted name that names one.
WINGS = {
    "pytest_cudagraph": "package",  # the lazy public API and the version
    "pytest_cudagraph._lazy": "package",
    "pytest_cudagraph.engines": "engines",
    "pytest_cudagraph.plugin": "pytest layer",
    "pytest_cudagraph.settings": "pytest layer",
    "pytest_cudagraph.results": "pytest layer",
    "pytest_cudagraph.records": "pytest layer",
    "pytest_cudagraph.reasons": "pytest layer",
    "pytest_cudagraph.sections": "pytest layer",
    "pytest_cudagraph.hookspec": "pytest layer",
    "pytest_cudagraph.markers": "pytest layer",
    "pytest_cudagraph.skips": "pytest layer",
    "pytest_cudagraph.bench": "pytest layer",
    "pytest_cudagraph.conformance": "conformance door",
    "pytest_cudagraph.conformance._protocol": "protocol",
    "pytest_cudagraph.conformance._validation": "protocol",
    "pytest_cudagraph.conformance._adapters": "protocol",
    "pytest_cudagraph.conformance._loading": "loading",
    "pytest_cudagraph.conformance._judging": "judging",
    "pytest_cudagraph.conformance._verdict": "judging",
    "pytest_cudagraph.conformance._catalog": "judging",
    "pytest_cudagraph.conformance._processes": "judging",
    "pytest_cudagraph.conformance._witness": "judging",
    "pytest_cudagraph.conformance._diagnosis": "judging",
    "pytest_cudagraph.conformance._suite": "suite plugin",
    "pytest_cudagraph.conformance.conftest": "suite plugin",
    "pytest_cudagraph.conformance._progress": "suite plugin",
    "pytest_cudagraph.conformance.checks": "checks",  # the package; its modules by CHECKS
    LEGACY: "legacy",
    "pytest_cudagraph.examples": "examples",
    "pytest_cudagraph.cli": "tools",
    "pytest_cudagraph.report_markdown": "tools",
    "reasyn_ref": "reference",
    "reasyn_ref.targets": "reference targets",
}
# The suite's checks, one module each: pytest_cudagraph/conformance/checks/test_NN_name.py.
CHECKS = re.compile(r"pytest_cudagraph\.conformance\.checks\.test_\d\d_\w+")
# Packages that stand for themselves alone, not for the modules in them: each of those has a wing
# of its own or none (a module of the checks' folder is a check, by CHECKS, or in no wing).
ALONE = frozenset(
    {"pytest_cudagraph", "pytest_cudagraph.conformance", "pytest_cudagraph.conformance.checks"}
)
CONFORMANCE = {"protocol", "loading", "judging", "suite plugin", "checks"}
# The wings a wing may import (itself included).
MAY_IMPORT = {
    "package": {"package"},
    "engines": {"engines"},
    "pytest layer": {"package", "engines", "pytest layer"},
    "conformance door": {"package", "conformance door"},
    "protocol": {"package", "engines", "protocol"},
    "loading": {"package", "engines", "protocol", "loading"},
    "judging": {"package", "engines", "pytest layer", "protocol", "loading", "judging"},
    "suite plugin": {"package", "engines", "pytest layer", *CONFORMANCE - {"checks"}},
    "checks": {"package", "engines", "pytest layer", *CONFORMANCE},
    "tools": {"package", "engines", "pytest layer", *CONFORMANCE, "tools"},
    "legacy": {"package", "engines", "conformance door", "protocol", "loading", "legacy"},
    "examples": {"conformance door", "examples"},
    "reference": {"reference"},
    "reference targets": {
        "package",
        "engines",
        "conformance door",
        "protocol",
        "reference",
        "reference targets",
    },
}
# The wings that must work without pytest (what a target author imports, what every pytest
# session imports with the package, and the engines).
NO_PYTEST = {"package", "engines", "conformance door", "protocol", "legacy"}


@dataclass
class Module:
    name: str
    is_package: bool
    tree: ast.Module
    # Every module of ours it imports, with whether the import runs when it is imported.
    imports: dict[str, bool] = field(default_factory=dict)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def wing_of(name: str) -> str:
    """The wing of the longest key that is ``name`` or a package above it (a package of
    ``ALONE`` stands for itself alone: a module in it is in a wing of its own, or in none)."""
    if CHECKS.fullmatch(name):
        return "checks"
    keys = [key for key in WINGS if name == key or name.startswith(key + ".")]
    key = max(keys, key=len, default=None)
    if key is None or (key in ALONE and key != name):
        raise LookupError(f"{name} is in no wing: place it in WINGS and docs/architecture.md")
    return WINGS[key]


def source_files() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def helper_files() -> Iterator[Path]:
    """The modules tests and scripts import by their bare name (their folders are on sys.path)."""
    for folder in ("tests", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name != "conftest.py" and not path.name.startswith("test_"):
                yield path


def type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in (
        "TYPE_CHECKING",
        "typing.TYPE_CHECKING",
    )


def walk_imports(tree: ast.AST, at_import: bool = True) -> Iterator[tuple[ast.AST, bool]]:
    """Every import statement, with whether it runs at module import (not in a function); those
    under TYPE_CHECKING never run and are left out."""
    for node in ast.iter_child_nodes(tree):
        if type_checking_only(node):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, at_import
        lazy = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield from walk_imports(node, at_import and not lazy)


def absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def targets(node: ast.AST, importer: str, is_package: bool, known: set[str]) -> Iterator[str]:
    """The modules of ours ``node`` imports (``from a import b`` imports a.b where that is one)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        source = absolute(node, importer, is_package)
        for alias in node.names:
            submodule = f"{source}.{alias.name}"
            yield submodule if submodule in known else source


def parsed(sources: dict[str, tuple[str, bool]]) -> dict[str, Module]:
    """Modules by name from (source, is a package's __init__) each, their imports resolved."""
    modules = {
        name: Module(name, is_package, ast.parse(source))
        for name, (source, is_package) in sources.items()
    }
    for module in modules.values():
        for node, at_import in walk_imports(module.tree):
            for target in targets(node, module.name, module.is_package, set(modules)):
                if target in modules and target != module.name:
                    module.imports[target] = module.imports.get(target, False) or at_import
    return modules


def shared_names(modules: dict[str, Module]) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = {}
    for name, module in modules.items():
        if not module.is_package:
            seen.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    return {stem: names for stem, names in seen.items() if len(names) > 1}


def upward_imports(modules: dict[str, Module]) -> list[str]:
    return [
        f"{name} ({wing_of(name)}) imports {target} ({wing_of(target)})"
        for name, module in modules.items()
        for target in module.imports
        if wing_of(target) not in MAY_IMPORT[wing_of(name)]
    ]


def pytest_when_imported(modules: dict[str, Module]) -> list[str]:
    """Modules of the engines or the protocol that import pytest (or pluggy) at import time:
    they must work without it."""
    return [
        f"{name}: line {node.lineno}"
        for name, module in modules.items()
        if wing_of(name) in NO_PYTEST
        for node, at_import in walk_imports(module.tree)
        if at_import and any(root in ("pytest", "_pytest", "pluggy") for root in roots(node))
    ]


def roots(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name.split(".")[0] for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    return [] if node.level else [(node.module or "").split(".")[0]]


def import_cycles(modules: dict[str, Module]) -> list[str]:
    """Each cycle found by a depth-first walk, as ``a -> b -> a``."""
    cycles: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for target in sorted(modules[name].imports):
            if state.get(target) == "open":
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[name] = "done"

    for name in sorted(modules):
        if name not in state:
            visit(name, [name])
    return cycles


MODULES = parsed(
    {module_name(path): (path.read_text(), path.name == "__init__.py") for path in source_files()}
)


def test_every_module_is_in_a_wing() -> None:
    assert set(MODULES) >= set(WINGS), "WINGS names a module that is gone"
    assert {wing_of(name) for name in MODULES} == set(MAY_IMPORT)


def test_no_two_modules_share_a_name() -> None:
    assert not shared_names(MODULES)


def test_the_moved_modules_are_gone() -> None:
    """Their old import paths are the legacy layer's (tests/conformance/test_legacy.py)."""
    assert [path for path in MOVED if (ROOT / path).exists()] == []


def importers_of(modules: dict[str, Module], target: str) -> list[str]:
    return sorted(name for name, module in modules.items() if target in module.imports)


def test_the_legacy_layer_is_imported_by_the_package_root_alone() -> None:
    """No wing may import it and no module does: the root imports it by name, where it is, so
    that deleting its module drops it with no other edit."""
    assert [wing for wing, allowed in MAY_IMPORT.items() if "legacy" in allowed] == ["legacy"]
    assert importers_of(MODULES, LEGACY) == []
    root = (ROOT / "pytest_cudagraph" / "__init__.py").read_text()
    assert f'"{LEGACY}"' in root
    named = [
        path.relative_to(ROOT).as_posix()
        for path in source_files()
        if LEGACY in path.read_text() and path.name != "_legacy.py"
    ]
    assert named == ["pytest_cudagraph/__init__.py"]


def test_each_wing_imports_only_the_wings_below_it() -> None:
    assert not upward_imports(MODULES)


def test_the_engines_and_the_protocol_import_no_pytest_when_imported() -> None:
    assert not pytest_when_imported(MODULES)


def test_the_imports_make_no_cycle() -> None:
    """Lazy imports count: a cycle through an import in a function still ties two modules."""
    assert not import_cycles(MODULES)


# Each rule catches what it is for (modules made up here, shaped like ours)

SAMPLE = {
    "pytest_cudagraph": ("", True),
    "pytest_cudagraph.engines": ("", True),
    "pytest_cudagraph.engines.parity": (
        "from typing import TYPE_CHECKING\n"
        "import pytest\n"
        "if TYPE_CHECKING:\n"
        "    from pytest_cudagraph.conformance import suite\n"  # never runs: not an import
        "def lazy():\n"
        "    from pytest_cudagraph import settings\n",
        False,
    ),
    "pytest_cudagraph.settings": ("from .engines import parity\n", False),
    "pytest_cudagraph.conformance": ("from pytest_cudagraph._lazy import lazy_door\n", True),
    "pytest_cudagraph._lazy": ("", False),
    "pytest_cudagraph.conformance._suite": ("from ..engines import parity\n", False),
    "pytest_cudagraph.conformance._protocol": (
        "from pytest_cudagraph.conformance import _legacy\n",  # the layer is on top: upward
        False,
    ),
    "pytest_cudagraph.conformance._legacy": (
        "from pytest_cudagraph.conformance import _protocol\n",
        False,
    ),
    "reasyn_ref": ("", True),
    "reasyn_ref.settings": ("import pytest_cudagraph.settings\n", False),
}


def test_the_rules_catch_what_they_are_for() -> None:
    modules = parsed(SAMPLE)
    assert modules["pytest_cudagraph.engines.parity"].imports == {
        "pytest_cudagraph.settings": False
    }
    assert shared_names(modules) == {
        "settings": ["pytest_cudagraph.settings", "reasyn_ref.settings"]
    }
    assert wing_of("pytest_cudagraph.conformance.checks.test_07_guards") == "checks"
    assert wing_of("pytest_cudagraph.conformance.checks") == "checks"
    assert wing_of("pytest_cudagraph.conformance._protocol") == "protocol"
    assert wing_of("pytest_cudagraph._lazy") == "package"
    assert upward_imports(modules) == [
        "pytest_cudagraph.engines.parity (engines) imports pytest_cudagraph.settings "
        "(pytest layer)",
        "pytest_cudagraph.conformance._protocol (protocol) imports "
        "pytest_cudagraph.conformance._legacy (legacy)",
        "reasyn_ref.settings (reference) imports pytest_cudagraph.settings (pytest layer)",
    ]
    assert importers_of(modules, LEGACY) == ["pytest_cudagraph.conformance._protocol"]
    assert pytest_when_imported(modules) == ["pytest_cudagraph.engines.parity: line 2"]
    assert import_cycles(modules) == [
        "pytest_cudagraph.conformance._legacy -> pytest_cudagraph.conformance._protocol "
        "-> pytest_cudagraph.conformance._legacy",
        "pytest_cudagraph.engines.parity -> pytest_cudagraph.settings "
        "-> pytest_cudagraph.engines.parity",
    ]
    for unplaced in (
        "pytest_cudagraph.new",
        "pytest_cudagraph.conformance._new_room",
        "pytest_cudagraph.conformance.checks.helpers",
        "pytest_cudagraph.conformance.test_07_guards",  # a check outside the checks' folder
    ):
        with pytest.raises(LookupError, match=rf"^{re.escape(unplaced)} is in no wing"):
            wing_of(unplaced)


# Private names


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def every_file() -> list[Path]:
    return sorted(
        {
            *source_files(),
            *(ROOT / "tests").rglob("*.py"),
            *(ROOT / "scripts").rglob("*.py"),
            ROOT / "conftest.py",
        }
    )


def first_party() -> set[str]:
    return set(MODULES) | {path.stem for path in helper_files()}


def private_uses(path: Path, known: set[str]) -> Iterator[str]:
    inside = any(path.is_relative_to(ROOT / package) for package in PACKAGES)
    importer = module_name(path) if inside else path.stem
    where = path.relative_to(ROOT)
    yield from private_uses_in(path.read_text(), importer, path.name == "__init__.py", known, where)


def private_uses_in(
    source: str, importer: str, is_package: bool, known: set[str], where: object
) -> Iterator[str]:
    """``from module import _name`` and ``module._name`` where ``module`` is another of ours."""
    tree = ast.parse(source)
    bound: dict[str, str] = {}  # a local name -> the module of ours it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in known or alias.name in known:
                    bound[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
        elif isinstance(node, ast.ImportFrom):
            source = absolute(node, importer, is_package)
            if source not in known and source.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in known:
                    bound[alias.asname or alias.name] = submodule
                elif private(alias.name) and source != importer:
                    yield f"{where}:{node.lineno}: from {source} import {alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            dotted = ast.unparse(node.value)
            owner = bound.get(dotted.split(".")[0])
            if owner is None:
                continue
            module = ".".join([owner, *dotted.split(".")[1:]])
            # A private module of ours is no private name: the conformance wing's rooms are
            # private modules that its other modules import.
            if module in known and module != importer and f"{module}.{node.attr}" not in known:
                yield f"{where}:{node.lineno}: {dotted}.{node.attr}"


def test_no_module_uses_a_private_name_of_another() -> None:
    known = first_party()
    found = [use for path in every_file() for use in private_uses(path, known)]
    assert not found


def test_the_private_name_rule_sees_both_forms() -> None:
    sample = (
        "from pytest_cudagraph.settings import _resolve\n"
        "from pytest_cudagraph import plugin\n"
        "from . import _own\n"  # the importer's own package: its business
        "import reasyn_ref.capture_cache as cache\n"
        "plugin._RecordGatherer\n"
        "cache.LRU._items\n"  # a private of a class, not of the module: not this rule's
        "cache._hidden\n"
        "plugin.__name__\n"
        # A private module of the conformance wing, imported or reached: allowed; a private
        # name in it: not.
        "from pytest_cudagraph.conformance import _loading\n"
        "from pytest_cudagraph.conformance._catalog import declared_checks\n"
        "import pytest_cudagraph.conformance._judging\n"
        "_loading.explained\n"
        "pytest_cudagraph.conformance._judging.numbered\n"
        "_loading._import\n"
        "pytest_cudagraph.conformance._judging._probed\n"
        "from pytest_cudagraph.conformance._adapters import _sides\n"
    )
    found = private_uses_in(sample, "pytest_cudagraph.markers", True, first_party(), "sample")
    assert list(found) == [
        "sample:1: from pytest_cudagraph.settings import _resolve",
        "sample:16: from pytest_cudagraph.conformance._adapters import _sides",
        "sample:5: plugin._RecordGatherer",
        "sample:7: cache._hidden",
        "sample:14: _loading._import",
        "sample:15: pytest_cudagraph.conformance._judging._probed",
    ]


# The pages that show the layout

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def wings_table() -> list[tuple[str, list[str], str]]:
    """(wing, the module paths it names, what it says the wing imports) per row."""
    text = ARCHITECTURE.read_text().split("## Wings", 1)[1]
    rows = [line for line in text.splitlines() if line.startswith("| ")][2:]
    table = []
    for row in rows:
        wing, modules, imports = (cell.strip() for cell in row.strip("|").split("|"))
        table.append((wing, re.findall(r"`([^`]+)`", modules), imports))
    return table


def named_modules(paths: list[str]) -> dict[str, Path]:
    """Dotted name -> file or folder, each path after the first in the first one's folder."""
    folder, found = (ROOT / paths[0]).parent, {}
    for text in paths:
        path = ROOT / text if text is paths[0] else folder / text
        relative = path.relative_to(ROOT).with_suffix("") if path.suffix else path.relative_to(ROOT)
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        found[".".join(parts)] = path
    return found


def stated_imports(text: str) -> set[str]:
    head = re.split(r":| \(", text, maxsplit=1)[0]
    return set() if head == "none" else set(head.split(", "))


# How the page names the checks' modules (CHECKS): one row, by pattern.
CHECKS_SHOWN = "pytest_cudagraph.conformance.checks.test_NN_name"


def test_the_wings_page_shows_each_wing_as_the_tree_and_the_rules_have_it() -> None:
    table = wings_table()
    shown = {name: wing for wing, paths, _ in table for name in named_modules(paths)}
    assert shown.pop(CHECKS_SHOWN) == "checks"
    assert shown == WINGS
    named = [path for _, paths, _ in table for path in named_modules(paths).values()]
    assert all(path.exists() for path in named if path.stem != "test_NN_name")
    assert {wing: stated_imports(imports) for wing, _, imports in table} == {
        wing: allowed - {wing} for wing, allowed in MAY_IMPORT.items()
    }


def test_the_readmes_layout_names_only_what_is_there() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    named = [line.split()[0] for line in block.splitlines() if line.startswith("    ")]
    assert named and all((ROOT / path).exists() for path in named)
    assert "docs/architecture.md" in block


# One home for each fact repeated across the tree


def own_cuda_skips(tree: ast.AST) -> Iterator[int]:
    """Lines of a skip of its own for a missing GPU: a ``skipif(not torch.cuda.is_available())``
    or a reason that starts like the one mark's."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        condition = ast.unparse(node.args[0]) if node.args else ""
        reasons = [k.value for k in node.keywords if k.arg == "reason"]
        reason = reasons[0].value if reasons and isinstance(reasons[0], ast.Constant) else ""
        skipif = ast.unparse(node.func).endswith("skipif")
        if skipif and condition == "not torch.cuda.is_available()":
            yield node.lineno
        elif isinstance(reason, str) and reason.startswith(NEEDS_CUDA.split(":")[0] + ":"):
            yield node.lineno


def test_a_missing_gpu_skips_through_the_one_needs_cuda_mark() -> None:
    """pytest_cudagraph.skips holds the mark and its reason; a test that needs two GPUs says so
    in a reason of its own."""
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in every_file()
        if path != ROOT / "pytest_cudagraph" / "skips.py"
        for line in own_cuda_skips(ast.parse(path.read_text()))
    ]
    assert not found


def factors(node: ast.AST) -> list[ast.AST]:
    """The operands of a chain of ``*``, ``512 * 1024 * 1024`` giving three."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return [*factors(node.left), *factors(node.right)]
    return [node]


def unit_spellings(tree: ast.AST) -> Iterator[str]:
    """Bytes per KiB, MiB or GiB written out (``MiB =``, ``1024 * 1024``, ``2**20``, ``1 << 20``,
    1048576): the units module is their one home."""
    inner = {
        id(operand)
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)
        for operand in (node.left, node.right)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            names = node.targets if isinstance(node, ast.Assign) else [node.target]
            for name in names:
                if isinstance(name, ast.Name) and name.id in ("KiB", "MiB", "GiB"):
                    yield f"line {node.lineno}: {name.id} ="
        if not isinstance(node, ast.BinOp | ast.Constant) or id(node) in inner:
            continue
        written = [ast.unparse(factor) for factor in factors(node)]
        powers = {"2 ** 20", "2 ** 30", "1 << 20", "1 << 30", "1048576", "1073741824"}
        if written.count("1024") >= 2 or powers & set(written):
            yield f"line {node.lineno}: {ast.unparse(node)}"


def test_sizes_in_bytes_come_from_the_units_module() -> None:
    found = [
        f"{path.relative_to(ROOT)} {use}"
        for path in every_file()
        if path != ROOT / "pytest_cudagraph" / "engines" / "units.py"
        for use in unit_spellings(ast.parse(path.read_text()))
    ]
    assert not found


def test_the_fact_rules_see_what_they_are_for() -> None:
    sample = ast.parse(
        "needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='x')\n"
        "pytest.mark.skipif(torch.cuda.is_available(), reason='checks the skip without CUDA')\n"
        "pytest.skip(reason='needs CUDA: the examples are CUDA graphs')\n"
        "pytest.mark.skipif(torch.cuda.device_count() < 2, reason='needs 2 CUDA devices')\n"
        "MiB = 1 << 20\n"
        "block = torch.empty(512 * 1024 * 1024)\n"
        "count = 16 * 1024\n"
    )
    assert list(own_cuda_skips(sample)) == [1, 3]
    assert list(unit_spellings(sample)) == [
        "line 5: MiB =",
        "line 5: 1 << 20",
        "line 6: 512 * 1024 * 1024",
    ]


def test_the_reports_index_lists_exactly_the_reports_there() -> None:
    """One report per kind, each linked from reports/README.md's first table."""
    index = (ROOT / "reports" / "README.md").read_text().split("## Older reports")[0]
    linked = set(re.findall(r"\]\(([^)]+)\)", index))
    present = {path.name for path in (ROOT / "reports").iterdir()} - {"README.md"}
    assert linked == present


# Code and docs say what and why, never when (issue numbers and rounds belong in commits)

WHEN = re.compile(r"\bissues? #?\d+|\bthis round\b|\bround \d+\b", re.IGNORECASE)


def test_no_issue_numbers_or_rounds_in_docs_code_or_test_names() -> None:
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "tests").glob("*.md")]
    pages += [ROOT / "reasyn_ref" / "README.md", *every_file()]
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in pages
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if WHEN.search(line) and path != Path(__file__).resolve()
    ]
    assert not found
    assert WHEN.search("the goal of Issue 16") and WHEN.search("not run this round")
    assert not WHEN.search("vLLM #14722: different results with graphs on and off")


# Module docstrings say what a module is in a few lines; the how and the history live in docs/.

MAX_DOCSTRING_LINES = 15


def long_docstrings(sources: dict[str, str]) -> list[str]:
    """``name (N lines)`` for each module whose docstring runs past ``MAX_DOCSTRING_LINES``."""
    found = []
    for name, source in sources.items():
        docstring = ast.get_docstring(ast.parse(source), clean=False)
        lines = docstring.count("\n") + 1 if docstring else 0
        if lines > MAX_DOCSTRING_LINES:
            found.append(f"{name} ({lines} lines)")
    return found


def test_module_docstrings_are_at_most_fifteen_lines() -> None:
    paths = [*source_files(), *sorted((ROOT / "scripts").glob("*.py"))]
    assert not long_docstrings({str(path.relative_to(ROOT)): path.read_text() for path in paths})
    sample = {"short": '"""One line."""\n', "long": '"""' + "line\n" * 15 + 'last"""\n'}
    assert long_docstrings(sample) == ["long (16 lines)"]
