"""Count the CUDA graph captures and replays code makes in a scope, whatever makes them.

``CaptureCounter`` wraps ``capture_begin``, ``capture_end`` and ``replay`` of torch's graph
class while its scope is open (``engines.graph_api``: every graph goes through them; a stand-in
class on the CPU).

A key counts as captured again only through captures that were replayed: a graph that is
never replayed serves no call, like the empty graph torch.compile's cudagraph-tree manager
captures once to hold its memory pool. A graph captured anew still has to be replayed to
produce its outputs, so a cache that re-records a key is caught. Calls made one at a time are
labelled with ``call(key, round_number)``, whatever thread captures for them:
``keys_captured_again`` then counts the rounds each key was captured in, so that code holding
several graphs per key (a piecewise runner) captures each key once.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from functools import partial

from pytest_cudagraph.engines.arguments import non_negative_number
from pytest_cudagraph.engines.graph_api import Method, graph_class_with, patched

_METHODS = ("capture_begin", "capture_end", "replay")


@dataclass(frozen=True)
class Capture:
    """One completed capture: the key in scope when it began (``CaptureCounter.key``, or
    ``call``'s), the wall time from ``capture_begin`` to the return of ``capture_end`` (which
    instantiates the graph), how often that graph was replayed before it was captured again,
    and the round of ``call`` it was made in."""

    key: Hashable | None
    seconds: float
    replays: int = 0
    round: int | None = None


class CaptureCounter:
    """Counts captures and replays of ``graph_class`` (default ``torch.cuda.CUDAGraph``)
    made while the counter is entered, from any thread. Warm-up runs and the
    synchronize/empty_cache torch.cuda.graph does before ``capture_begin`` are not capture
    time. ``after_capture``, when given, is called after each counted capture ends, in the
    thread that captured (to look at what the capture left alive).

        with CaptureCounter() as counter:
            with counter.key((8, 64)):
                cache(step)
        assert not counter.recaptured_keys()
    """

    def __init__(
        self, graph_class: type | None = None, after_capture: Callable[[], None] | None = None
    ) -> None:
        self.graph_class = graph_class_with(graph_class, _METHODS)
        self.after_capture = after_capture
        self._lock = threading.Lock()
        self._captures: list[Capture] = []
        self._started: dict[int, tuple[float, Hashable | None, int | None]] = {}
        # id(graph) -> index of its latest capture in _captures, where its replays count. By
        # id, as not every graph class takes weak references; a capture rebinds a reused id.
        self._latest: dict[int, int] = {}
        self._all_replays = 0
        self._keys = threading.local()  # each thread's stack of keys (``key``)
        self._call: tuple[Hashable, int] | None = None  # (key, round number) of ``call``
        self._patches: ExitStack | None = None
        self._active = False

    def __enter__(self) -> CaptureCounter:
        if self._patches is not None:
            raise RuntimeError("this CaptureCounter is already counting; use a new one")
        with ExitStack() as patches:
            for name in _METHODS:
                patches.enter_context(patched(self.graph_class, name, partial(self._wrap, name)))
            self._patches = patches.pop_all()
        self._active = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._active = False  # a wrapper left behind by out-of-order exits counts nothing
        patches, self._patches = self._patches, None
        if patches is not None:
            patches.close()

    @contextmanager
    def key(self, key: Hashable) -> Iterator[None]:
        """Label the captures that this thread begins inside this block with ``key`` (each
        thread has its own keys, so a key set in one never labels another's captures)."""
        hash(key)  # a TypeError here, before any work, names an unhashable key
        stack = self._key_stack()
        stack.append(key)
        try:
            yield
        finally:
            stack.pop()

    @contextmanager
    def call(self, key: Hashable, round_number: int) -> Iterator[None]:
        """Label the captures begun inside this block, by any thread that has no key of its
        own (code may capture on a thread of its own), with ``key`` and ``round_number``: for
        calls made one at a time."""
        hash(key)
        previous, self._call = self._call, (key, round_number)
        try:
            yield
        finally:
            self._call = previous

    def _key_stack(self) -> list[Hashable]:
        stack = getattr(self._keys, "stack", None)
        if stack is None:
            stack = self._keys.stack = []
        return stack

    @property
    def captures(self) -> list[Capture]:
        with self._lock:
            return list(self._captures)

    @property
    def replays(self) -> int:
        return sum(capture.replays for capture in self.captures)

    @property
    def all_replays(self) -> int:
        """Every replay made in scope, of any graph: one captured before the counter was
        entered (a runner's start-up captures) too."""
        with self._lock:
            return self._all_replays

    def captures_per_key(self) -> dict[Hashable | None, int]:
        return dict(Counter(capture.key for capture in self.captures))

    def served_captures_per_key(self) -> dict[Hashable | None, int]:
        """Like ``captures_per_key``, counting only captures replayed at least once."""
        return dict(Counter(capture.key for capture in self.captures if capture.replays))

    def recaptured_keys(self) -> dict[Hashable, int]:
        """Labelled keys with more than one replayed capture, with those captures' count."""
        return {
            key: count
            for key, count in self.served_captures_per_key().items()
            if key is not None and count > 1
        }

    def keys_captured_again(self) -> dict[Hashable, int]:
        """Keys (labelled by ``call``) whose replayed captures fall in more than one round,
        with how many rounds: the graphs of one key captured in one round, several for code
        that holds several per key, are one capture of that key."""
        rounds: dict[Hashable, set[int]] = {}
        for capture in self.captures:
            if capture.replays and capture.key is not None and capture.round is not None:
                rounds.setdefault(capture.key, set()).add(capture.round)
        return {key: len(found) for key, found in rounds.items() if len(found) > 1}

    def replays_per_capture(self) -> float:
        """Replays over captures; 0.0 when nothing was captured."""
        count = len(self.captures)
        return self.replays / count if count else 0.0

    def capture_seconds(self) -> float:
        return sum(capture.seconds for capture in self.captures)

    def _wrap(self, name: str, original: Method) -> Method:
        hook = getattr(self, f"_on_{name}")

        def counted(graph: object, *args: object, **kwargs: object) -> object:
            if not self._active:
                return original(graph, *args, **kwargs)
            return hook(original, graph, *args, **kwargs)

        return counted

    def _on_capture_begin(self, original: Method, graph: object, *a, **k) -> object:
        stack = self._key_stack()
        key, round_number = (stack[-1], None) if stack else (self._call or (None, None))
        self._started[id(graph)] = (time.perf_counter(), key, round_number)
        try:
            return original(graph, *a, **k)
        except BaseException:
            self._started.pop(id(graph), None)
            raise

    def _on_capture_end(self, original: Method, graph: object, *a, **k) -> object:
        try:
            result = original(graph, *a, **k)
        except BaseException:
            self._started.pop(id(graph), None)  # a failed capture is not a capture
            raise
        started = self._started.pop(id(graph), None)
        if started is not None:  # began before this counter was entered: not counted
            began, key, round_number = started
            with self._lock:
                self._latest[id(graph)] = len(self._captures)
                seconds = time.perf_counter() - began
                self._captures.append(Capture(key, seconds, round=round_number))
            if self.after_capture is not None:
                self.after_capture()
        return result

    def _on_replay(self, original: Method, graph: object, *a, **k) -> object:
        result = original(graph, *a, **k)
        with self._lock:
            self._all_replays += 1
            index = self._latest.get(id(graph))
            if index is not None:
                capture = self._captures[index]
                self._captures[index] = replace(capture, replays=capture.replays + 1)
        return result


def replays_to_repay(capture_seconds: float, eager_seconds: float, graph_seconds: float) -> float:
    """How many replays pay back one capture: its cost over what each replay saves against
    the eager call (``inf`` when a replay saves nothing)."""
    for name, value in (
        ("capture_seconds", capture_seconds),
        ("eager_seconds", eager_seconds),
        ("graph_seconds", graph_seconds),
    ):
        non_negative_number(name, value)
    saving = eager_seconds - graph_seconds
    return capture_seconds / saving if saving > 0 else math.inf
