"""From a target spec to a validated target: an installed name or ``module:factory``, the factory
loaded, called with a device, and what it returned checked before any check runs.

Installed names come from the entry-point group ``pytest_cudagraph.targets``; with none chosen,
the one installed target is the default. The module of a ``module:factory`` imports as a test
module would: from ``sys.path``, else from the rootdir or the invocation folder. Every problem is
a ``TargetError`` naming the spec, with a "did you mean" where a name is close to one that is
there. An error the user's code raises (importing, the factory, ``draw``, ``key_of``, a side)
is shown whole, where the user's own frames raised it (``explained``).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.metadata
import importlib.util
import inspect
import pkgutil
import sys
import threading
import traceback
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_cudagraph.conformance._protocol import Case, CudaGraphTarget, Inputs
from pytest_cudagraph.conformance._validation import inputs_problem, key_problem, unchecked

if TYPE_CHECKING:
    import torch

ENTRY_POINT_GROUP = "pytest_cudagraph.targets"
# The examples shipped with the plugin stand for a user's code: their frames are shown.
EXAMPLES = "pytest_cudagraph.examples"
# Top-level packages whose frames are not the user's code.
LIBRARIES = frozenset(
    {"pytest_cudagraph", "_pytest", "pytest", "pluggy", "xdist", "torch", *sys.stdlib_module_names}
)
# What torch says when code called for the CPU uses CUDA all the same: a CPU build, then a
# CUDA build on a machine without a GPU or without a driver.
CUDA_MISSING = (
    "Tried to instantiate dummy base class CUDAGraph",
    "Torch not compiled with CUDA enabled",
    "no CUDA GPUs are available",
    "Found no NVIDIA driver",
    "CUDA driver version is insufficient for CUDA runtime version",
    "no CUDA-capable device is detected",  # a driver, and CUDA_VISIBLE_DEVICES hiding its GPUs
)

# What CUDA says of a capture that another thread's CUDA call invalidated (torch's default,
# global, capture mode): cudaErrorStreamCaptureInvalidated, and the calls after it.
CAPTURE_INVALIDATED = (
    "operation failed due to a previous error during capture",
    "cudaErrorStreamCaptureInvalidated",
    "capture sequence has been invalidated",
)
# Names of the threads this plugin starts (the compiled adapter's, the checks' helpers).
SUITES_THREADS = ("cudagraph-", "compiled-targets")

# Which frames of an error in the user's code to show (``traceback_text``).
YOURS, FROM_YOURS, ALL = "yours", "from yours", "all"

Factory = Callable[["torch.device"], CudaGraphTarget]


class TargetError(Exception):
    """A conformance target that cannot be loaded or does not follow the protocol (a usage
    error where the session chooses the target)."""

    def __init__(self, spec: str | None, problem: str) -> None:
        subject = f"conformance target {spec!r}" if spec else "conformance target"
        super().__init__(f"{subject}: {problem}")


# Choosing the target


def installed_targets() -> dict[str, str]:
    """Installed target name -> its ``module:factory`` (entry-point group
    ``pytest_cudagraph.targets``)."""
    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    return {entry.name: entry.value for entry in sorted(found, key=lambda entry: entry.name)}


def installed_lines() -> list[str]:
    """The installed targets as ``pytest-cudagraph targets`` lists them, one per line."""
    installed = installed_targets()
    if not installed:
        return [f"no conformance targets installed (entry-point group {ENTRY_POINT_GROUP})"]
    return [f"{name}  {value}" for name, value in installed.items()]


def resolve_spec(spec: str | None) -> str:
    """``spec`` itself, or with none chosen the name of the one installed target."""
    if spec is not None:
        return spec
    names = sorted(installed_targets())
    if len(names) == 1:
        return names[0]
    if not names:
        raise TargetError(
            None,
            "none chosen and none installed; give --cudagraph-target module:factory",
        )
    raise TargetError(
        None,
        f"none chosen and {len(names)} installed ({', '.join(names)}); "
        "choose one with --cudagraph-target NAME",
    )


def describe_spec(spec: str | None) -> str:
    """The target for titles: the spec, or the default it stands for (without failing)."""
    try:
        return resolve_spec(spec)
    except TargetError:
        return "no target chosen"


# Loading


def load_factory(spec: str, search_paths: Sequence[Path] = ()) -> Factory:
    """The factory an installed name or a ``module:factory`` spec names (the factory may be a
    dotted attribute). A module not found on sys.path is looked for in ``search_paths`` (the
    rootdir, the invocation folder), which then join sys.path as they do for test modules."""
    if ":" not in spec:
        installed = installed_targets()
        if spec not in installed:
            names = ", ".join(installed) or "none"
            raise TargetError(
                spec,
                f"no installed target of that name (installed: {names}); "
                "or give module:factory, e.g. 'mypkg.graphs:make_target'"
                + did_you_mean(spec, installed),
            )
        return load_factory(installed[spec], search_paths)
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise TargetError(
            spec, "must be a name or 'module:factory', e.g. 'mypkg.graphs:make_target'"
        )
    if "/" in module_name or "\\" in module_name or module_name.endswith(".py"):
        raise TargetError(spec, f"{module_name!r} is a path; {module_spelling(spec)}")
    found: object = _import(spec, module_name, search_paths)
    for part in attribute.split("."):
        if not hasattr(found, part):
            there = [name for name in dir(found) if callable(getattr(found, name, None))]
            raise TargetError(
                spec,
                f"{module_name} has no attribute {attribute!r}" + did_you_mean(part, there),
            )
        found = getattr(found, part)
    if not callable(found):
        raise TargetError(spec, f"{attribute} is a {type(found).__name__}, not a callable factory")
    return found


def did_you_mean(given: str, names: Iterable[str], cutoff: float = 0.6) -> str:
    """``; did you mean 'x'?`` for the names closest to ``given``, or nothing."""
    close = difflib.get_close_matches(given, list(names), n=3, cutoff=cutoff)
    return f"; did you mean {' or '.join(map(repr, close))}?" if close else ""


def module_spelling(spec: str) -> str:
    """How to write a path given as the module of ``spec`` (``tests/mine.py:make``)."""
    path, _, attribute = spec.rpartition(":")
    parts = [p for p in Path(path.replace("\\", "/")).with_suffix("").parts if p not in (".", "/")]
    spelling = f"give a module name as an import statement names it: {'.'.join(parts)}:{attribute}"
    if len(parts) > 1:
        spelling += f", or {parts[-1]}:{attribute} with {'/'.join(parts[:-1])} on sys.path (the ini's pythonpath)"
    return spelling


def _import(spec: str, module_name: str, search_paths: Sequence[Path]) -> object:
    top = module_name.partition(".")[0]
    if top not in sys.modules and importlib.util.find_spec(top) is None:
        holders = [path for path in search_paths if _holds_module(path, top)]
        sys.path.extend(str(path) for path in holders if str(path) not in sys.path)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is None or not module_name.startswith(error.name):
            raise TargetError(  # the module was found, and what it imports was not
                spec, f"importing {module_name!r} failed: {whole_message(error)}"
            ) from error
        missing = error.name or module_name
        raise TargetError(
            spec,
            f"cannot import module {module_name!r}: {error}"
            # Modules are many (every installed one): only a near miss is worth naming.
            + did_you_mean(missing.rpartition(".")[2], module_names(missing, search_paths), 0.85),
        ) from error
    except (Exception, SystemExit) as error:  # whatever the module raises while it runs
        raise TargetError(
            spec, f"importing {module_name!r} failed: {whole_message(error)}"
        ) from error


def module_names(missing: str, search_paths: Sequence[Path]) -> list[str]:
    """The modules a misspelt ``missing`` could have meant: those of its parent package, or the
    top-level ones on sys.path and in ``search_paths``."""
    parent = missing.rpartition(".")[0]
    if parent:
        try:
            found = importlib.import_module(parent)
        except Exception:  # the parent is missing too: nothing closer to offer
            return []
        folders = list(getattr(found, "__path__", []))
    else:
        folders = [*sys.path, *map(str, search_paths)]
    return [info.name for info in pkgutil.iter_modules(folders)]


def _holds_module(folder: Path, name: str) -> bool:
    return (folder / name).is_dir() or (folder / f"{name}.py").is_file()


def build_target(
    spec: str | None, device: torch.device, factory: Factory | None = None
) -> CudaGraphTarget:
    """The target ``factory`` (None: the one ``spec`` names, loaded now; ``spec`` None: the
    one installed) builds for ``device``, validated."""
    spec = resolve_spec(spec)
    if factory is None:
        factory = load_factory(spec)
    try:
        target = factory(device)
    except (Exception, SystemExit) as error:  # SystemExit too: a factory may call sys.exit
        raise TargetError(
            spec, f"the factory raised {whole_message(error)}{cuda_hint(error, device)}"
        ) from error
    validate_target(spec, target, device)
    return target


def cuda_hint(error: BaseException, device: torch.device) -> str:
    """The rule a factory broke when it used CUDA while called for the CPU, or nothing."""
    if device.type == "cuda" or not any(sign in str(error) for sign in CUDA_MISSING):
        return ""
    return (
        f"\nThe factory is called with the CPU ({device}) when CUDA is missing: build the graphs "
        "only where pytest_cudagraph.conformance.graphs_on(device) holds (CUDA, or graphs "
        "emulated) and give graphed=None otherwise (docs/own-graphs.md)"
    )


# Errors in the user's code: the whole message, and the user's own frames


def whole_message(error: BaseException) -> str:
    """``Type: message``, every line of the message."""
    message = str(error).strip()
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def users_frame(module: str) -> bool:
    """Whether a frame of ``module`` (its ``__name__``) is the user's code: not Python's own,
    torch's, pytest's or this plugin's (but its examples, which stand for a user's code)."""
    if module == EXAMPLES or module.startswith(EXAMPLES + "."):
        return True
    return module.partition(".")[0] not in LIBRARIES


def traceback_text(error: BaseException, frames: str = YOURS) -> str:
    """Where ``error`` was raised: the frames of the user's code only (``YOURS``, with a line
    saying how many others were left out and how to see them), every frame from the user's
    first one on (``FROM_YOURS``), or Python's whole traceback (``ALL``)."""
    walked = list(traceback.walk_tb(error.__traceback__))
    mine = [users_frame(frame.f_globals.get("__name__", "")) for frame, _ in walked]
    if frames != YOURS:
        start = mine.index(True) if frames == FROM_YOURS and any(mine) else 0
        stack = traceback.StackSummary.extract(iter(walked[start:]))
        lines = ["Traceback (most recent call last):", *stack.format()]
        return "\n".join(line.rstrip("\n") for line in [*lines, whole_message(error)])
    if not any(mine):  # the error is in how the suite was pointed at the code: its message says
        return ""
    stack = traceback.StackSummary.extract(
        step for step, its in zip(walked, mine, strict=True) if its
    )
    lines = ["Traceback (your code):", *stack.format()]
    left_out = mine.count(False)
    if left_out:
        lines.append(
            f"  ({left_out} frame{'s' if left_out > 1 else ''} of Python, torch, pytest and "
            "pytest-cudagraph left out: --tb=long shows every frame)"
        )
    return "\n".join(line.rstrip("\n") for line in lines)


def explained(error: BaseException, frames: str = YOURS) -> str:
    """An error met while loading or calling the user's code, for people: its message (a
    ``TargetError``'s or a ``UserCodeError``'s names what was called), then where the user's
    code raised it (``traceback_text`` of the cause)."""
    cause = error.__cause__ if isinstance(error, (TargetError, UserCodeError)) else error
    where = traceback_text(cause, frames) if cause is not None else ""
    return f"{error}\n{where}" if where else str(error)


def invalidated_capture_hint(error: BaseException) -> str:
    """Where ``error`` says a capture was invalidated, what may have done it: a CUDA call from
    another thread during the capture, with the threads alive beside this one (the suite's own
    marked); otherwise nothing."""
    message = str(error)
    if "(emulated: " in message or not any(sign in message for sign in CAPTURE_INVALIDATED):
        return ""  # an emulated capture is the thread's own, and its error names the cause
    others = [
        thread.name + (" (the suite's)" if thread.name.startswith(SUITES_THREADS) else "")
        for thread in threading.enumerate()
        if thread is not threading.current_thread()
    ]
    return (
        "\nThe capture was invalidated, which need not be this call's doing: in torch's default "
        "(global) capture mode a CUDA call from any other thread during a capture invalidates "
        f"it. Threads alive beside this one: {', '.join(others) or 'none'}. Code that captures "
        "while its own threads call CUDA captures with capture_error_mode='thread_local'"
    )


class UserCodeError(Exception):
    """The user's code raised while the suite called it: ``call`` names what was called in the
    user's own words (``draw(generator, case 3: key 16, repeat 1)``); the error is the cause."""

    def __init__(self, call: str, error: BaseException) -> None:
        hint = invalidated_capture_hint(error)
        super().__init__(f"{call} raised {whole_message(error)}{hint}")
        self.call = call


@contextlib.contextmanager
def user_call(call: str) -> Iterator[None]:
    """Any error the block raises (SystemExit too) as a ``UserCodeError`` naming ``call``."""
    try:
        yield
    except UserCodeError:
        raise
    except (Exception, SystemExit) as error:
        raise UserCodeError(call, error) from error


# Validation


def validate_target(spec: str, target: object, device: torch.device) -> None:
    """A ``CudaGraphTarget`` made for ``device`` (its fields checked themselves when it was
    made), whose case 0 draws and keys: a ``draw`` or ``key_of`` that fails every call, or a
    key that is not a plain value equal to itself, is named here, before any check. A
    ``draw(generator, key)``, a spelling of a release before 0.3.0, stops here in one line."""
    import torch

    if not isinstance(target, CudaGraphTarget):
        raise TargetError(
            spec,
            f"the factory returned {type(target).__name__}; expected a "
            "pytest_cudagraph.conformance.CudaGraphTarget",
        )
    if target.device != device:
        raise TargetError(spec, f"device is {target.device!r}; the factory was asked for {device}")
    case = Case(0, target.keys[0], 0)
    if draws_keys(target.draw):
        raise TargetError(spec, DRAW_OF_KEYS)
    try:
        with user_call(f"draw(generator, {case_words(case)})"):
            inputs = target.draw(torch.Generator(device).manual_seed(0), case)
    except UserCodeError as error:
        raise TargetError(spec, str(error)) from error.__cause__
    problem = inputs_problem(inputs)
    if problem is not None:
        raise TargetError(spec, f"draw(generator, {case_words(case)}) returned {problem}")
    try:
        with user_call(f"draw(generator, {case_words(case)}) under another seed"):
            again = target.draw(torch.Generator(device).manual_seed(1), case)
        keys = [key_of(target, drawn, case) for drawn in (inputs, again)]
    except UserCodeError as error:
        raise TargetError(spec, str(error)) from error.__cause__
    problem = key_problem(keys[0], lambda: keys[1], "for two draws of one case")
    if problem:
        raise TargetError(spec, f"key_of(inputs of {case_words(case)}) {problem}")


# A draw whose second parameter is named ``key``: the spelling of a release before 0.3.0.
DRAW_OF_KEYS = (
    "draw(generator, key) is the spelling of a release before 0.3.0: write draw(generator, "
    "case) and read case.key (a Case also gives case.repeat and case.number)"
)


def draws_keys(draw: Callable[..., object]) -> bool:
    """Whether ``draw``'s second positional parameter is named ``key``."""
    try:
        parameters = list(inspect.signature(draw).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 and positional[1].name == "key"


def case_words(case: Case) -> str:
    """A case as a user reads it: ``case 3: key 16, repeat 1``."""
    return f"case {case.number}: key {case.key!r}, repeat {case.repeat}"


def inputs_words(inputs: Inputs) -> str:
    """The inputs of a call by name: each tensor's dtype and shape, each plain value's repr."""
    import torch

    return ", ".join(
        f"{name} {str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
        if isinstance(value, torch.Tensor)
        else f"{name}={value!r:.40}"
        for name, value in inputs.items()
    )


def key_of(target: CudaGraphTarget, inputs: Inputs, case: Case) -> Hashable:
    """``target.key_of(inputs)`` of ``case``'s inputs; an error it raises is a
    ``UserCodeError`` naming the case."""
    with user_call(f"key_of(inputs of {case_words(case)})"):
        return unchecked(target.key_of)(inputs)  # its results are judged by the caller
