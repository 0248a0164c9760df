"""The markers, one module each, and the little they share.

A marker is a feature class (a pytest plugin object; plugin.py registers one per session) that
keeps together everything about its marker: ``function`` (the marker function: it validates
the arguments, naming the rule, and its signature and docstring are the ``--markers`` help);
``fixtures`` (set up before the body, so that their skips apply and overriding one reaches the
marker too); ``complete`` and ``collected`` (collection-time work); its own hooks (the run-time
wrapper, the report section); ``section_data`` and ``section_lines`` (its part of the results).

Adding a marker is a module with one such class, plus its line in ``plugin.FEATURES``. Modules
here import torch only inside the code that runs for marked tests."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import pytest

from pytest_cudagraph import settings
from pytest_cudagraph.results import Record, Section

if TYPE_CHECKING:
    import torch

SECTIONS = pytest.StashKey[list[tuple[str, str]]]()
M = TypeVar("M")  # a marker's parsed mark


class MarkerArgumentError(Exception):
    """A marker's arguments broke its rule; reported as a collection error of the test."""


class MarkerFeature(Generic[M]):
    """Base of the marker features, generic in the parsed mark; see the package docstring."""

    # Returns an M; a ClassVar cannot name a type variable, so the base says Any.
    function: ClassVar[Callable[..., Any]]
    fixtures: ClassVar[tuple[str, ...]] = ()
    results_key: ClassVar[str | None] = None  # the marker's key in the JSON results, if any

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.settings = settings.snapshot(config)
        self.key = pytest.StashKey[M]()

    @classmethod
    def name(cls) -> str:
        return cls.function.__name__

    @classmethod
    def help(cls) -> str:
        """The ``--markers`` line, from the marker function's signature and docstring."""
        parameters = inspect.signature(cls.function).parameters.values()
        arguments = ", ".join(f"{parameter.name}={parameter.default!r}" for parameter in parameters)
        doc = inspect.getdoc(cls.function)
        if doc is None:
            raise TypeError(f"marker function {cls.name()} needs a docstring: it is the help")
        summary = " ".join(doc.split("\n\n")[0].split())
        return f"{cls.name()}({arguments}): {summary}" if arguments else f"{cls.name()}: {summary}"

    def read(self, item: pytest.Item) -> M | None:
        """The item's parsed mark (None when unmarked); MarkerArgumentError for bad arguments."""
        marker = item.get_closest_marker(self.name())
        if marker is None:
            return None
        try:
            mark = self.function(*marker.args, **marker.kwargs)
            return self.complete(mark)
        except (TypeError, ValueError) as error:
            message = str(error).removeprefix(f"{self.name()}() ")
            raise MarkerArgumentError(f"{self.name()} on {item.nodeid}: {message}") from None

    def complete(self, mark: M) -> M:
        """Fill in what the mark leaves to the settings (ValueError if it cannot be)."""
        return mark

    def collected(self, item: pytest.Item, mark: M) -> None:
        """Collection-time work for a marked test (after every marker was read)."""

    def mark_of(self, item: pytest.Item) -> M | None:
        return item.stash.get(self.key, None)

    def set_up(self, request: pytest.FixtureRequest, mark: M) -> None:
        """Before the body of a marked test: set up the fixtures the marker works through."""
        for name in self.fixtures:
            request.getfixturevalue(name)

    def section_data(self, records: Sequence[Record]) -> object:
        """This marker's results from the session's records (plain data)."""
        return None

    def section_lines(self, data: Any) -> list[str]:
        """The terminal summary's lines of ``section_data``."""
        return []

    def section(self) -> Section | None:
        """This marker's section of the results (None for a marker without results)."""
        if self.results_key is None:
            return None
        return Section(self.results_key, self.section_data, self.section_lines)


def emulated_on_the_cpu(request: pytest.FixtureRequest, device: torch.device) -> bool:
    """Where ``device`` is no CUDA device, torch.cuda's graph API emulated on the CPU for the
    rest of the test (``engines.emulation``), so that a marker's graph path runs there instead
    of skipping; whether it is."""
    if device.type == "cuda":
        return False
    from pytest_cudagraph.engines.emulation import emulated_graphs

    scope = emulated_graphs()
    scope.__enter__()
    request.addfinalizer(lambda: scope.__exit__(None, None, None))
    return True


def add_report_section(item: pytest.Item, title: str, text: str) -> None:
    """A named section on the test's report (shown with its failure, kept in JUnit XML)."""
    item.stash.setdefault(SECTIONS, []).append((title, text))


def body_with_fixtures(item: pytest.Function) -> Callable[[], object]:
    """The test function bound to the fixture values it runs with, for a marker that runs
    the body again (fixtures are set up once; every run shares them)."""
    parameters = inspect.signature(item.obj).parameters
    arguments = {name: item.funcargs[name] for name in parameters if name in item.funcargs}
    return functools.partial(item.obj, **arguments)
