"""The spellings of earlier releases, a layer on top of the protocol until 0.5.0: deleting this
module drops them, with no other edit (the package imports it only where it is there).

- 0.3.0 gave every capability as a flat field of ``CudaGraphTarget`` (``reset=``, ``capacity=``,
  ``sampler=``, ...), described cases as ``make_inputs(generator, number)`` over ``num_keys``,
  and its adapters took ``largest_key``; 0.4.0's target had ``num_keys``, ``case``,
  ``make_inputs``, ``capability``, ``tolerance_of`` and ``describe_tolerance``. Each is
  translated, or read, with one ``PytestCudagraphDeprecationWarning`` at the user's line naming
  the new spelling (``OldSpelling``, registered in the protocol's ``SPELLINGS``).
- The modules that moved keep their old import paths (``ALIASES``), the same objects under both.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_cudagraph import PytestCudagraphDeprecationWarning
from pytest_cudagraph.conformance import _protocol
from pytest_cudagraph.conformance._protocol import CAPABILITIES, Case, CudaGraphTarget

REMOVED_IN = "0.5.0"
PACKAGE = Path(__file__).resolve().parents[1]

# 0.3.0's flat field -> (the capability slot, its field there); ``largest_key`` was its adapters'.
OLD_FIELDS: dict[str, tuple[str, str]] = {
    "reset": ("cache", "reset"),
    "lock": ("cache", "lock"),
    "cached_keys": ("cache", "cached_keys"),
    "capacity": ("cache", "capacity"),
    "fault_points": ("cache", "fault_points"),
    "largest_case": ("cache", "largest_key"),
    "largest_key": ("cache", "largest_key"),
    "reset_state": ("state", "reset"),
    "side_state": ("state", "sides"),
    "sampler": ("sampling", "sample"),
    "unsupported_modes": ("guards", "modes"),
    "refusal_errors": ("guards", "refusal_errors"),
    "run_workers": ("workers", "run"),
    "graph_skips": ("fallbacks", "graph_skips"),
    "runs_eagerly": ("fallbacks", "runs_eagerly"),
    "capture_clean_forward": ("capture_clean", "forward"),
}
OLD_CASES = ("make_inputs", "num_keys")
# What a field not given read as in 0.3.0.
OLD_DEFAULTS: dict[str, object] = {"refusal_errors": _protocol.USAGE_ERRORS}


def warn_at_user(message: str, where: tuple[str, int] | None = None) -> None:
    """A deprecation warning at ``where`` (file, line), or at the first frame outside this
    package: the user's line, whatever the depth of the calls that led here."""
    if where is None:
        frame = sys._getframe(1)
        while frame.f_back is not None and _internal(frame.f_code.co_filename):
            frame = frame.f_back
        where = (frame.f_code.co_filename, frame.f_lineno)
        registry = frame.f_globals.setdefault("__warningregistry__", {})
        module = frame.f_globals.get("__name__", "")
    else:
        registry, module = {}, ""
    warnings.warn_explicit(
        message,
        PytestCudagraphDeprecationWarning,
        where[0],
        where[1],
        module=module,
        registry=registry,
    )


def _internal(filename: str) -> bool:
    """A frame a warning should not point at: this package's, the import machinery's (an import
    statement's warning belongs to the line that imports), pytest's assertion rewriter's,
    dataclasses' (``replace`` builds the target)."""
    if filename.startswith("<frozen "):
        return True
    path = Path(filename)
    return (
        path.is_relative_to(PACKAGE)
        or path.parts[-3:] == ("_pytest", "assertion", "rewrite.py")
        or path == Path(dataclasses.__file__)
    )


class OldSpelling:
    """0.3.0's fields and 0.4.0's helpers of the target, for the protocol's ``SPELLINGS``."""

    names = frozenset({*OLD_FIELDS, *OLD_CASES})

    def translate(self, owner: str, given: dict[str, object]) -> dict[str, object]:
        """``given`` with the old spellings translated, with one warning naming each; an old
        spelling given beside a capability it belongs to is merged into it (``None`` clears
        that field, as ``dataclasses.replace(target, reset=None)`` did in 0.3.0)."""
        fields = dict(given)
        old = sorted(name for name in given if name in self.names)
        new_spelling: list[str] = []
        if any(name in fields for name in OLD_CASES):
            fields.update(_cases(owner, fields))
            new_spelling.append(
                "keys=[the key key_of gives each of cases 0 to num_keys - 1], draw=lambda "
                "generator, case: make_inputs(generator, case.number) (or draw on case.key)"
            )
        slots: dict[str, dict[str, object]] = {}
        for name in [name for name in fields if name in OLD_FIELDS]:
            value = fields.pop(name)
            slot, field = OLD_FIELDS[name]
            if name == "largest_case" and value is not None:
                value = _largest_key(owner, fields, value)
            if name == "side_state" and value is not None and _shared(value):
                new_spelling.append(_shared_sides_dropped())
                continue
            slots.setdefault(slot, {})[field] = value
        for slot, values in slots.items():
            new_spelling += _into_capability(fields, slot, values)
        graphed_left_out = _graphed_left_out(fields)
        if graphed_left_out:
            new_spelling.append(graphed_left_out)
        warn_at_user(
            f"{owner}({'=..., '.join(old)}=...) is the spelling of pytest-cudagraph 0.3.0, "
            f"accepted until {REMOVED_IN}; write {'; '.join(new_spelling)} "
            "(from pytest_cudagraph.conformance)"
        )
        return fields

    def read(self, target: CudaGraphTarget, name: str) -> object:
        """An attribute of an earlier release's target, read from its new home with a warning."""
        owner = type(target).__name__
        if name in OLD_FIELDS and name != "largest_key":
            slot, field = OLD_FIELDS[name]
            warn_at_user(
                f"{owner}.{name} is the spelling of pytest-cudagraph 0.3.0, accepted until "
                f"{REMOVED_IN}; read {owner}.{slot}.{field}"
            )
            capability = getattr(target, slot)
            value = getattr(capability, field) if capability is not None else None
            if name == "largest_case" and value is not None:
                return list(target.keys).index(value)
            return OLD_DEFAULTS.get(name) if value is None else value
        helper = HELPERS.get(name)
        if helper is None:
            raise AttributeError(name)
        reading, instead = helper
        warn_at_user(
            f"{owner}.{name} is the target's helper in pytest-cudagraph 0.4.0, accepted until "
            f"{REMOVED_IN}; {instead}"
        )
        return reading(target)


def _into_capability(fields: dict[str, object], slot: str, values: dict[str, object]) -> list[str]:
    """Merge an old spelling's ``values`` into the capability of ``slot`` in ``fields`` (made
    when there is none); the new spelling it stands for, or nothing where it gives nothing."""
    kind = {kind.SLOT: kind for kind in CAPABILITIES}[slot]
    shown = f"{slot}={kind.__name__}({', '.join(f'{field}=...' for field in values)})"
    present = fields.get(slot)
    merged = dict(values)
    if isinstance(present, kind):  # dataclasses.replace(target, capacity=...), say
        merged = {f: getattr(present, f) for f in present.given()} | values
    given = {field: value for field, value in merged.items() if value is not None}
    if slot == "guards" and "modes" not in given:
        given = {}  # nothing reads refusal errors without modes to refuse
    fields[slot] = kind(**given) if given else None
    return [shown]


def _cases(owner: str, fields: dict[str, object]) -> dict[str, object]:
    """``keys`` and ``draw`` for 0.3.0's ``make_inputs(generator, number)`` over ``num_keys``;
    one of the two given alone beside a target built from them (``dataclasses.replace``)
    replaces its half."""
    make_inputs, num_keys = fields.pop("make_inputs", None), fields.pop("num_keys", None)
    built_from = getattr(fields.get("draw"), "old_spelling", None)
    if built_from is not None:  # a target of the old spelling, changed by replace()
        keys = fields.get("keys")
        make_inputs = built_from if make_inputs is None else make_inputs
        num_keys = len(keys) if num_keys is None and isinstance(keys, Sequence) else num_keys
    elif "keys" in fields or "draw" in fields:
        raise TypeError(
            f"{owner}: make_inputs and num_keys are 0.3.0's spelling of draw and keys; give "
            "draw and keys, not both spellings"
        )
    if make_inputs is None or num_keys is None:
        missing = "num_keys" if make_inputs is not None else "make_inputs"
        raise TypeError(f"{owner}: make_inputs and num_keys go together; {missing} is missing")
    if isinstance(num_keys, bool) or not isinstance(num_keys, int) or num_keys < 1:
        raise ValueError(f"{owner}: num_keys must be an int >= 1, got {num_keys!r}")
    if not callable(make_inputs):
        raise TypeError(f"{owner}: make_inputs must be callable, got {type(make_inputs).__name__}")
    return {"keys": _code_keys(fields, make_inputs, num_keys), "draw": numbered_draw(make_inputs)}


def _code_keys(
    fields: Mapping[str, object], make_inputs: Callable[[Any, int], Any], num_keys: int
) -> Sequence[Hashable]:
    """The keys of 0.3.0's cases 0 to ``num_keys - 1`` as its ``key_of`` gives them (0.3.0's
    key_of gave the code's own key, which the target's keys now are); the case numbers where
    those cannot be had or are not ``num_keys`` distinct keys (its contract then fails, as
    0.3.0's did on keys key_of cannot tell apart)."""
    import torch

    key_of, device = fields.get("key_of"), fields.get("device")
    if not callable(key_of) or not isinstance(device, torch.device):
        return range(num_keys)  # the target's own checks name what is wrong with them
    try:
        generator = torch.Generator(device).manual_seed(0)
        keys = [key_of(make_inputs(generator, number)) for number in range(num_keys)]
        if len(set(keys)) == num_keys:
            return tuple(keys)
    except Exception:  # the contract check calls them again, naming what raised
        pass
    return range(num_keys)


def numbered_draw(make_inputs: Callable[[Any, int], Any]) -> Callable[[Any, Case], Any]:
    """``draw(generator, case)`` calling 0.3.0's ``make_inputs(generator, case.number)``."""

    def draw(generator: Any, case: Case) -> Any:
        return make_inputs(generator, case.number)

    draw.old_spelling = make_inputs  # type: ignore[attr-defined]
    return draw


def _largest_key(owner: str, fields: Mapping[str, object], case: object) -> Hashable:
    keys = fields.get("keys")
    if isinstance(case, bool) or not isinstance(case, int) or case < 0:
        raise ValueError(f"{owner}: largest_case must be an int >= 0, got {case!r}")
    if not isinstance(keys, Sequence) or not len(keys):
        raise TypeError(f"{owner}: largest_case needs keys (or num_keys) to name its key")
    key: Hashable = keys[case % len(keys)]
    return key


def _shared(side_state: object) -> bool:
    """Whether 0.3.0's ``side_state()`` gives both sides the same object (it compared nothing
    then); False where it cannot be called yet."""
    try:
        pair = side_state()  # type: ignore[operator]
    except Exception:
        return False
    return isinstance(pair, tuple) and len(pair) == 2 and pair[0] is pair[1]


def _shared_sides_dropped() -> str:
    return (
        "State(sides=...) giving each side its own state (this side_state gives both sides "
        "the same one, which 0.3.0 compared with itself: it is left out here)"
    )


def _graphed_left_out(fields: dict[str, object]) -> str:
    """0.3.0 never called the graphed side without CUDA: a graphed side of a target made for
    another device is left out, as then; the new spelling to say so."""
    device = fields.get("device")
    if fields.get("graphed") is None or getattr(device, "type", "cuda") == "cuda":
        return ""
    fields["graphed"] = None
    return (
        "graphed=None without CUDA (0.3.0 never called the graphed side there; it is left "
        "out here, and 0.5.0 calls it)"
    )


# 0.4.0's helpers of the target: name -> (its value for a target, what to write instead).
def _case_of(target: CudaGraphTarget) -> Callable[[int], Case]:
    def case(number: int) -> Case:
        repeat, index = divmod(number, len(target.keys))
        return Case(number, target.keys[index], repeat)

    return case


def _make_inputs_of(target: CudaGraphTarget) -> Callable[[Any, int], Any]:
    return lambda generator, number: target.draw(generator, _case_of(target)(number))


def _tolerance_of(target: CudaGraphTarget) -> Callable[[object], object]:
    def tolerance_of(part: object) -> object:
        if isinstance(target.tolerance, _protocol.Tolerance):
            return target.tolerance
        return target.tolerance.get(part, _protocol.EXACT) if part is not None else _protocol.EXACT

    return tolerance_of


def _describe_tolerance_of(target: CudaGraphTarget) -> Callable[[], str]:
    def describe_tolerance() -> str:
        if isinstance(target.tolerance, _protocol.Tolerance):
            return target.tolerance.describe()
        named = [f"{part!r} {tol.describe()}" for part, tol in target.tolerance.items()]
        return "; ".join([*named, f"other parts {_protocol.EXACT.describe()}"])

    return describe_tolerance


HELPERS: dict[str, tuple[Callable[[CudaGraphTarget], object], str]] = {
    "num_keys": (lambda target: len(target.keys), "write len(target.keys)"),
    "case": (_case_of, "build a Case(number, key, repeat) yourself"),
    "make_inputs": (_make_inputs_of, "call target.draw(generator, case)"),
    "capability": (
        lambda target: lambda kind: getattr(target, kind.SLOT),
        "read the capability's slot (target.cache, target.state, ...)",
    ),
    "tolerance_of": (_tolerance_of, "read target.tolerance"),
    "describe_tolerance": (_describe_tolerance_of, "read target.tolerance"),
}


# The old import paths

# Old module -> (the module it stands for now, the names it gave where it gave fewer, what to
# write instead).
ALIASES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "pytest_cudagraph.conformance.target": (
        "pytest_cudagraph.conformance",
        (),
        "pytest_cudagraph.conformance.target is 0.3.0's home of the target protocol, kept "
        f"until {REMOVED_IN}; import from pytest_cudagraph.conformance",
    ),
    "pytest_cudagraph.target": (
        "pytest_cudagraph.conformance",
        (),
        "pytest_cudagraph.target moved to pytest_cudagraph.conformance in 0.3.0; the old "
        f"name goes in {REMOVED_IN}",
    ),
    "pytest_cudagraph.adapters": (
        "pytest_cudagraph.conformance._adapters",
        (),
        "pytest_cudagraph.adapters moved to pytest_cudagraph.conformance.adapters in 0.3.0; "
        f"the old name goes in {REMOVED_IN}; import from pytest_cudagraph.conformance",
    ),
    "pytest_cudagraph.conformance.adapters": (
        "pytest_cudagraph.conformance._adapters",
        (),
        "pytest_cudagraph.conformance.adapters is private now, kept until "
        f"{REMOVED_IN}; import from pytest_cudagraph.conformance",
    ),
    "pytest_cudagraph.conformance.protocol": (
        "pytest_cudagraph.conformance._protocol",
        (),
        "pytest_cudagraph.conformance.protocol is private now, kept until "
        f"{REMOVED_IN}; import from pytest_cudagraph.conformance",
    ),
    "pytest_cudagraph.conformance.loading": (
        "pytest_cudagraph.conformance._loading",
        (),
        "pytest_cudagraph.conformance.loading is private now, kept until "
        f"{REMOVED_IN}; import from pytest_cudagraph.conformance",
    ),
}
# What 0.3.0's home of the protocol gave beyond the door's names, and where they live now.
OLD_HOME_EXTRAS: dict[str, str] = {
    "ENTRY_POINT_GROUP": "pytest_cudagraph.conformance._loading",
    "build_target": "pytest_cudagraph.conformance._loading",
    "describe_spec": "pytest_cudagraph.conformance._loading",
    "installed_targets": "pytest_cudagraph.conformance._loading",
    "load_factory": "pytest_cudagraph.conformance._loading",
    "resolve_spec": "pytest_cudagraph.conformance._loading",
    "FAULT_STAGES": "pytest_cudagraph.conformance._validation",
    "OUTPUT_LIFETIMES": "pytest_cudagraph.conformance._protocol",
    "THREAD_MODELS": "pytest_cudagraph.conformance._protocol",
    "USAGE_ERRORS": "pytest_cudagraph.conformance._protocol",
    "Part": "pytest_cudagraph.conformance._protocol",
    "RealIndex": "pytest_cudagraph.conformance._protocol",
    "LockLike": "pytest_cudagraph.engines.faults",
}
OLD_HOMES = ("pytest_cudagraph.conformance.target", "pytest_cudagraph.target")
# ``python -m`` of an old home lists the installed targets, as it did.
LIST_TARGETS = (
    "from pytest_cudagraph.conformance._loading import installed_lines\n"
    "print('\\n'.join(installed_lines()))\n"
)


class AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads the old module paths: importing one gives the module it stands for
    (the same object), with a warning at the import."""

    def find_spec(
        self, name: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name not in ALIASES:
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        moved, _, message = ALIASES[name]
        warn_at_user(message)
        found = importlib.import_module(moved)
        if name in OLD_HOMES:
            found = old_home(name)
        sys.modules[name] = found  # what the import statement binds

    def get_code(self, name: str) -> types.CodeType:
        """The code ``python -m`` runs for an old home: it lists the installed targets."""
        if name not in OLD_HOMES:
            raise ImportError(f"{name} cannot be run")
        return compile(LIST_TARGETS, f"<{name}>", "exec")


_old_home: types.ModuleType | None = None


def old_home(name: str) -> types.ModuleType:
    """0.3.0's home of the protocol, made once: the door's names and the extras it gave."""
    global _old_home
    if _old_home is None:
        door = importlib.import_module("pytest_cudagraph.conformance")
        home = types.ModuleType(name, "0.3.0's home of the target protocol (deprecated)")
        for exported in door.__all__:
            setattr(home, exported, getattr(door, exported))
        for extra, module in OLD_HOME_EXTRAS.items():
            setattr(home, extra, getattr(importlib.import_module(module), extra))
        _old_home = home
    return _old_home


def install() -> None:
    """Register the old spellings with the protocol and the old paths with the importer, once."""
    if not any(isinstance(spelling, OldSpelling) for spelling in _protocol.SPELLINGS):
        _protocol.SPELLINGS.append(OldSpelling())
    if not any(isinstance(finder, AliasFinder) for finder in sys.meta_path):
        sys.meta_path.append(AliasFinder())


install()
