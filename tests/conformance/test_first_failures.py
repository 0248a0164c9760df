"""A newcomer's first failures, as their session shows them: a fresh project holding their own
target module, the suite run on it without CUDA, and their file and line in what it prints,
with the whole message, in their own names (``draw``, ``eager``), and nothing of the suite's
source. Also a target setting in a shared ini whose module breaks: only what uses it fails."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from suite_runner import plugin_arguments

# Each test runs the suite or a session of its own (the README's test command leaves it out).
pytestmark = pytest.mark.slow

IMPORT_FAILS = """import torch

model = build()
"""

STATE_MISMATCH = """import torch

from pytest_cudagraph.conformance import graphed_callables


def load_weights(model):
    model.load_state_dict({"weight": torch.zeros(3, 3), "bias": torch.zeros(3)})


def make_target(device):
    model = torch.nn.Linear(64, 64)
    load_weights(model)
"""

DRAW_FAILS = """import torch

from pytest_cudagraph.conformance import graphed_callables


def draw(generator, case):
    return {"x": torch.randn(case.key, 64, generator=generator, dtype="float32")}


def make_target(device):
    return graphed_callables(torch.nn.Linear(64, 64), device=device, keys=[16], draw=draw)
"""

EAGER_FAILS = """import torch

from pytest_cudagraph.conformance import hand_written


def draw(generator, case):
    return {"hidden": torch.randn(case.key, 64, generator=generator)}


def eager(inputs):
    return inputs["x"] * 2


def make_target(device):
    return hand_written(device=device, eager=eager, graphed=None, keys=[16, 32], draw=draw,
                        key_of=lambda inputs: inputs["hidden"].shape[0])
"""

GRAPHS_AT_START_UP = """import torch


class Runner:
    def __init__(self):
        self.graph = torch.cuda.CUDAGraph()


def make_target(device):
    runner = Runner()
"""


CALLABLES_FAIL = """import torch

from pytest_cudagraph.conformance import Cache, Sampling, State, hand_written


def draw(generator, case):
    return {"x": torch.randn(case.key, 4, generator=generator)}


def clear():
    raise RuntimeError("the cache is gone")


def sides():
    raise KeyError("no model here")


def sample(seed, graphs):
    raise IndexError("no tokens")


def make_target(device, **capability):
    return hand_written(device=device, eager=lambda inputs: inputs["x"] * 2,
                        graphed=lambda inputs: inputs["x"] * 2, keys=[2, 3], draw=draw,
                        key_of=lambda inputs: inputs["x"].shape[0], **capability)


def cache_reset_fails(device):
    return make_target(device, cache=Cache(reset=clear))


def state_sides_fails(device):
    return make_target(device, state=State(sides=sides))


def sampler_fails(device):
    return make_target(device, sampling=Sampling(sample))
"""


def literal(text: str) -> str:
    """``text`` as an fnmatch pattern matching itself (brackets are a character class there)."""
    return re.sub(r"([][])", r"[\1]", text)


def line_of(source: str, text: str) -> int:
    return next(n for n, line in enumerate(source.splitlines(), 1) if text in line)


@pytest.fixture
def newcomer(
    run_suite: Callable[..., pytest.RunResult],
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[..., pytest.RunResult]:
    """``newcomer(source, *args)``: the suite's own checks (test_00) on ``my_graphs.py`` of
    ``source``, in a fresh project, without CUDA."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")

    def run(source: str, *args: str) -> pytest.RunResult:
        pytester.makepyfile(my_graphs=source)
        return run_suite("--cudagraph-target", "my_graphs:make_target", "-k", "test_00", *args)

    return run


def frame(pytester: pytest.Pytester, source: str, text: str, function: str) -> str:
    return f'  File "{pytester.path / "my_graphs.py"}", line {line_of(source, text)}, in {function}'


def test_an_error_while_importing_shows_the_users_line(
    newcomer: Callable[..., pytest.RunResult], pytester: pytest.Pytester
) -> None:
    result = newcomer(IMPORT_FAILS)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: conformance target 'my_graphs:make_target': importing 'my_graphs' failed: "
            "NameError: name 'build' is not defined",
            "Traceback (your code):",
            frame(pytester, IMPORT_FAILS, "build()", "<module>"),
            "    model = build()",
            "  (* frames of Python, torch, pytest and pytest-cudagraph left out: --tb=long shows "
            "every frame)",
        ]
    )


def test_a_factory_error_is_whole_with_the_users_frames_only(
    newcomer: Callable[..., pytest.RunResult], pytester: pytest.Pytester
) -> None:
    result = newcomer(STATE_MISMATCH)
    result.stdout.fnmatch_lines(
        [
            "conformance target 'my_graphs:make_target': the factory raised RuntimeError: "
            "Error(s) in loading state_dict for Linear:",
            literal(
                "\tsize mismatch for weight: copying a param with shape torch.Size([3, 3]) from "
                "checkpoint, the shape in current model is torch.Size([64, 64])."
            ),
            "*size mismatch for bias: *",
            "Traceback (your code):",
            frame(pytester, STATE_MISMATCH, "    load_weights(model)", "make_target"),
            "    load_weights(model)",
            frame(pytester, STATE_MISMATCH, "model.load_state_dict", "load_weights"),
            "*--tb=long shows every frame)",
        ]
    )
    assert "in build_target" not in result.stdout.str(), "the plugin's frames are held back"
    asked = newcomer(STATE_MISMATCH, "--tb=long")
    assert "Traceback (most recent call last):" in asked.stdout.str()
    assert "torch/nn/modules/module.py" in asked.stdout.str(), "every frame from the user's on"


def test_an_error_in_draw_is_named_draw_with_the_whole_message(
    newcomer: Callable[..., pytest.RunResult], pytester: pytest.Pytester
) -> None:
    result = newcomer(DRAW_FAILS)
    result.stdout.fnmatch_lines(
        [
            "conformance target 'my_graphs:make_target': draw(generator, case 0: key 16, "
            "repeat 0) raised TypeError: randn() received an invalid combination of arguments*",
            " * (tuple of ints size, *, torch.Generator generator, *",
            " * (tuple of ints size, *, Tensor out = None, *",
            "Traceback (your code):",
            frame(pytester, DRAW_FAILS, "torch.randn(", "draw"),
        ]
    )
    assert "make_inputs" not in result.stdout.str()


def test_an_eager_error_names_the_key_and_the_inputs_not_the_suites_source(
    newcomer: Callable[..., pytest.RunResult], pytester: pytest.Pytester
) -> None:
    result = newcomer(EAGER_FAILS)
    result.stdout.fnmatch_lines(
        [
            "the dry run failed on 2 of 2 keys:",
            literal(
                "case 0: eager on case 0: key 16, repeat 0; inputs hidden float32[16, 64] raised "
                "KeyError: 'x'"
            ),
            "Traceback (your code):",
            frame(pytester, EAGER_FAILS, 'inputs["x"]', "eager"),
            literal('    return inputs["x"] * 2'),
            "*--tb=long shows every frame)",
            literal(
                "case 1: eager on case 1: key 32, repeat 0; inputs hidden float32[32, 64] raised "
                "KeyError: 'x' (the same frames as above)"
            ),
        ]
    )
    output = result.stdout.str()
    assert "CudaGraphTarget(" not in output and "def test_dry_run" not in output


def test_graphs_built_at_start_up_on_the_cpu_are_told_the_rule(
    newcomer: Callable[..., pytest.RunResult],
) -> None:
    result = newcomer(GRAPHS_AT_START_UP, "--cudagraph-emulate=off")  # emulated, it builds
    result.stdout.fnmatch_lines(
        [
            # A CPU build of torch, a CUDA build without a driver and one whose GPUs are hidden
            # word it differently (the last raises torch's AcceleratorError, a RuntimeError).
            "*the factory raised *Error: *",
            "The factory is called with the CPU (cpu) when CUDA is missing: build the graphs "
            "only where pytest_cudagraph.conformance.graphs_on(device) holds (CUDA, or graphs "
            "emulated) and give graphed=None otherwise (docs/own-graphs.md)",
        ]
    )


def test_a_broken_target_in_a_shared_ini_stops_only_what_uses_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTEST_CUDAGRAPH_TARGET", raising=False)
    pytester.makeini("[pytest]\ncudagraph_target = my_graphs:make_target\n")
    pytester.makepyfile(
        my_graphs=IMPORT_FAILS,
        test_unrelated="def test_a():\n    pass\n",
        test_uses_it="def test_b(conformance_target):\n    pass\n",
    )
    pytester.syspathinsert()
    result = pytester.runpytest_inprocess(*plugin_arguments())
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*importing 'my_graphs' failed: NameError: name 'build' is not defined"]
    )


@pytest.mark.parametrize(
    ("factory", "called", "raised", "function", "verdict"),
    [
        # Called by the suite before every check (the target fixture): each errors at set-up.
        (
            "cache_reset_fails",
            "Cache.reset()",
            "RuntimeError: the cache is gone",
            "clear",
            "errors",
        ),
        ("state_sides_fails", "State.sides()", "KeyError: 'no model here'", "sides", "errors"),
        # Called by the dry run itself.
        ("sampler_fails", "Sampling.sample()", "IndexError: no tokens", "sample", "failed"),
    ],
)
def test_a_capabilitys_callable_that_raises_is_named_by_its_field_in_one_line(
    run_suite: Callable[..., pytest.RunResult],
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    factory: str,
    called: str,
    raised: str,
    function: str,
    verdict: str,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile(my_graphs=CALLABLES_FAIL)
    result = run_suite("--cudagraph-target", f"my_graphs:{factory}", "-k", "dry_run")
    assert result.parseoutcomes().get(verdict) == 1, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "_*test_dry_run*_",
            literal(f"{called} raised {raised}"),
            "Traceback (your code):",
            f'  File "{pytester.path / "my_graphs.py"}", line *, in {function}',
        ],
        consecutive=True,
    )
    output = result.stdout.str()
    # The user's error alone: not the suite's chain of exceptions around it.
    assert "The above exception was the direct cause" not in output, output
    assert "During handling of the above exception" not in output, output
