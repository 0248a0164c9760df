"""Count the CUDA graph captures and replays code makes in a scope, whatever makes them.

``CaptureCounter`` wraps ``capture_begin``, ``capture_end`` and ``replay`` of torch's graph
class while its scope is open (``engines.graph_api``: every graph goes through them; a stand-in
class on the CPU). ``call(key, round_number)`` labels and numbers calls made one at a time,
whatever thread captures or replays for them: each capture knows its call and the calls that
replayed it (``witnessed``: those that served a later call of their key), each call its graphs.

A key is captured again when its captures fall in more than one round (``keys_captured_again``;
the graphs of one key captured in one round, several for a piecewise runner, are one capture),
replayed or not: a cache written ``graphs.setdefault(key, capture())`` captures on every call
and replays only its first graph. Not counted: an unlabelled capture, and a capture never
replayed made before any replay under its key, like the empty graph torch.compile's
cudagraph-tree manager captures on its first (warm-up) call to hold its memory pool.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from types import FrameType

from pytest_cudagraph.engines.arguments import non_negative_number
from pytest_cudagraph.engines.graph_api import Method, graph_class_with, patched
from pytest_cudagraph.engines.graph_recorder import CaptureRecord, GraphRecorder

_METHODS = ("capture_begin", "capture_end", "replay")


@dataclass(frozen=True)
class Capture:
    """One completed capture: the key in scope when it began (``CaptureCounter.key``, or
    ``call``'s), the wall time from ``capture_begin`` to the return of ``capture_end`` (which
    instantiates the graph), how often that graph was replayed before it was captured again,
    the round and the number of the ``call`` it was made in, the numbers of the calls that
    replayed it, whether a replay under its key came before it began, and what it read, wrote
    and allocated (``record``, where the counter records: ``graph_recorder.CaptureRecord``)."""

    key: Hashable | None
    seconds: float
    replays: int = 0
    round: int | None = None
    call: int | None = None
    replayed_in: frozenset[int] = frozenset()
    follows_replay: bool = False
    record: CaptureRecord | None = field(default=None, compare=False, repr=False)

    def counts_for_its_key(self) -> bool:
        """Whether it is a capture of its key: labelled, and replayed or begun after a replay
        under that key (a graph never replayed before the key served any replay holds a pool,
        it serves no call)."""
        return self.key is not None and (self.replays > 0 or self.follows_replay)


@dataclass(frozen=True)
class _Started:
    began: float
    key: Hashable | None
    round: int | None
    call: int | None
    follows_replay: bool
    recorder: GraphRecorder | None = None


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
        self,
        graph_class: type | None = None,
        after_capture: Callable[[], None] | None = None,
        *,
        record: bool = False,
    ) -> None:
        self.graph_class = graph_class_with(graph_class, _METHODS)
        self.after_capture = after_capture
        self.record = record
        self._lock = threading.Lock()
        self._captures: list[Capture] = []
        self._started: dict[int, _Started] = {}
        # id(graph) -> index of its latest capture in _captures, where its replays count. By
        # id, as not every graph class takes weak references; a capture rebinds a reused id.
        self._latest: dict[int, int] = {}
        self._all_replays = 0
        self._replayed_keys: set[Hashable] = set()  # keys in scope of some replay so far
        self._keys = threading.local()  # each thread's stack of keys (``key``)
        self._call: tuple[Hashable, int, int] | None = None  # ``call``'s key, round, number
        self._call_keys: list[Hashable] = []  # each call's key, by its number
        self._call_replays: Counter[int] = Counter()  # call number -> replays made in it
        self._call_graphs: dict[int, set[int]] = {}  # call number -> ids of graphs it replayed
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
        """Label the captures and replays that this thread makes inside this block with
        ``key`` (each thread has its own keys, so a key set in one never labels another's)."""
        hash(key)  # a TypeError here, before any work, names an unhashable key
        stack = self._key_stack()
        stack.append(key)
        try:
            yield
        finally:
            stack.pop()

    @contextmanager
    def call(self, key: Hashable, round_number: int) -> Iterator[int]:
        """One call, numbered from 0 in the order calls begin (the block gets its number):
        the captures and replays made inside it, by any thread that has no key of its own
        (code may capture on a thread of its own), are labelled with ``key``, the captures
        with ``round_number`` too. For calls made one at a time."""
        hash(key)
        with self._lock:
            number = len(self._call_keys)
            self._call_keys.append(key)
        previous, self._call = self._call, (key, round_number, number)
        try:
            yield number
        finally:
            self._call = previous

    def _key_stack(self) -> list[Hashable]:
        stack = getattr(self._keys, "stack", None)
        if stack is None:
            stack = self._keys.stack = []
        return stack

    def _in_scope(self) -> tuple[Hashable | None, int | None, int | None]:
        """This thread's key, else the call's key, round and number (None where none)."""
        stack = self._key_stack()
        if stack:
            return stack[-1], None, None
        return self._call or (None, None, None)

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

    @property
    def calls(self) -> int:
        """How many ``call`` blocks began."""
        with self._lock:
            return len(self._call_keys)

    def captures_per_key(self) -> dict[Hashable | None, int]:
        return dict(Counter(capture.key for capture in self.captures))

    def served_captures_per_key(self) -> dict[Hashable | None, int]:
        """Like ``captures_per_key``, counting only captures replayed at least once."""
        return dict(Counter(capture.key for capture in self.captures if capture.replays))

    def recaptured_keys(self) -> dict[Hashable, int]:
        """Labelled keys with more than one capture that counts for its key (see
        ``Capture.counts_for_its_key``: replayed or not, past the key's first replay), with
        those captures' count."""
        found = Counter(c.key for c in self.captures if c.counts_for_its_key())
        return {key: count for key, count in found.items() if count > 1}

    def keys_captured_again(self) -> dict[Hashable, int]:
        """Keys (labelled by ``call``) whose captures that count for them
        (``Capture.counts_for_its_key``) fall in more than one round, with how many rounds:
        the graphs of one key captured in one round, several for code that holds several per
        key, are one capture of that key."""
        rounds: dict[Hashable, set[int]] = {}
        for capture in self.captures:
            if capture.counts_for_its_key() and capture.round is not None:
                rounds.setdefault(capture.key, set()).add(capture.round)
        return {key: len(found) for key, found in rounds.items() if len(found) > 1}

    def witnessed(self, keys: Iterable[Hashable]) -> list[Capture]:
        """The captures of ``keys`` that served a later call: labelled with one of them and
        replayed in a call other than the one they were made in. A graph replayed only in the
        call that captured it proves nothing of the key's graphs: a runner that keeps its
        real graphs from before the count and captures a throwaway graph in every call would
        show one per call."""
        wanted = set(keys)
        return [
            capture
            for capture in self.captures
            if capture.key in wanted and capture.replayed_in - {capture.call}
        ]

    def replays_in_call(self, call_number: int) -> int:
        """How many replays the call numbered ``call_number`` made, of any graph."""
        with self._lock:
            return self._call_replays[call_number]

    def graphs_in_call(self, call_number: int) -> int:
        """How many distinct graphs the call numbered ``call_number`` replayed (graphs
        captured before the counter was entered too)."""
        with self._lock:
            return len(self._call_graphs.get(call_number, ()))

    def most_graphs_per_call(self) -> dict[Hashable, int]:
        """Each key called: the most distinct graphs one of its calls replayed (0: none did),
        so that a piecewise runner whose calls replayed 2 graphs and now replay 1 is seen."""
        with self._lock:
            most: dict[Hashable, int] = {}
            for number, key in enumerate(self._call_keys):
                graphs = len(self._call_graphs.get(number, ()))
                most[key] = max(most.get(key, 0), graphs)
            return most

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

    def _on_capture_begin(
        self, original: Method, graph: object, *args: object, **kwargs: object
    ) -> object:
        key, round_number, call = self._in_scope()
        with self._lock:
            follows_replay = key is not None and key in self._replayed_keys
        began = time.perf_counter()
        # A record of what a capture reads where its kernels reach the dispatcher: torch.compile's
        # (triton's, on buffers from empty_strided_cuda) do not, and a part of the graph would
        # take its buffers for inputs. The checks walk the graphed side for those instead.
        recorded = self.record and not hasattr(graph, "record") and not by_compiled_code()
        if recorded and liveness_tracked(original, graph):
            kwargs = {**kwargs, "check_input_liveness": True}
        try:
            result = original(graph, *args, **kwargs)
        except BaseException:
            self._started.pop(id(graph), None)
            raise
        recorder = None
        if recorded:  # an emulated graph records itself
            recorder = GraphRecorder(device_type="cuda")
            recorder.start()
        self._started[id(graph)] = _Started(
            began, key, round_number, call, follows_replay, recorder
        )
        return result

    def _on_capture_end(
        self, original: Method, graph: object, *args: object, **kwargs: object
    ) -> object:
        started = self._started.get(id(graph))
        recorded = started.recorder.stop() if started and started.recorder else None
        try:
            result = original(graph, *args, **kwargs)
        except BaseException:
            self._started.pop(id(graph), None)  # a failed capture is not a capture
            raise
        started = self._started.pop(id(graph), None)
        if started is not None:  # began before this counter was entered: not counted
            capture = Capture(
                started.key,
                time.perf_counter() - started.began,
                round=started.round,
                call=started.call,
                follows_replay=started.follows_replay,
                record=(recorded or getattr(graph, "record", None)) if self.record else None,
            )
            with self._lock:
                self._latest[id(graph)] = len(self._captures)
                self._captures.append(capture)
            if self.after_capture is not None:
                self.after_capture()
        return result

    def _on_replay(
        self, original: Method, graph: object, *args: object, **kwargs: object
    ) -> object:
        result = original(graph, *args, **kwargs)
        key, _, call = self._in_scope()
        with self._lock:
            self._all_replays += 1
            if key is not None:
                self._replayed_keys.add(key)
            if call is not None:
                self._call_replays[call] += 1
                self._call_graphs.setdefault(call, set()).add(id(graph))
            index = self._latest.get(id(graph))
            if index is not None:
                self._captures[index] = _replayed(self._captures[index], call)
        return result


# The module of torch.compile's cudagraph trees, which capture compiled code's graphs.
COMPILED_CAPTURES = ("_inductor", "cudagraph_trees.py")


def by_compiled_code() -> bool:
    """Whether the capture beginning now is one of torch.compile's cudagraph trees (a frame of
    their module is on the calling thread's stack)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if Path(frame.f_code.co_filename).parts[-2:] == COMPILED_CAPTURES:
            return True
        frame = frame.f_back
    return False


def liveness_tracked(capture_begin: Method, graph: object) -> bool:
    """Whether torch's own check of a capture's inputs can be asked of ``capture_begin``: torch
    2.13 and later take ``check_input_liveness`` (its replays then raise on a freed input);
    an emulated graph checks its inputs always."""
    import inspect

    if hasattr(graph, "record"):
        return False
    try:
        return "check_input_liveness" in inspect.signature(capture_begin).parameters
    except (TypeError, ValueError):
        return False


def _replayed(capture: Capture, call: int | None) -> Capture:
    """``capture`` with one more replay, made in ``call``."""
    calls = capture.replayed_in if call is None else capture.replayed_in | {call}
    return replace(capture, replays=capture.replays + 1, replayed_in=calls)


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
