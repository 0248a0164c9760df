"""Padded batches: every real batch size from 1 to the largest the graphs serve is answered as
eager answers it, over the real rows, and junk in the padded part of a call changes no real
row. Code that pads a batch up to its bucket is wrong at the sizes between buckets when a
static buffer is refreshed only in part (a stale tail) or when a padded row reaches a real one
(a batch-wide statistic, a scatter to a stale slot); the other checks draw a few sizes per
bucket, this one every size, and the padding holds junk (NaN, or a value no real row may read:
what the target's ``padding.junk`` writes) so that a leak shows.

Needs ``padding``. For each size: one eager call and one graphed call, and one more pair with
junk where the target gives ``junk`` (the eager side makes the clean call again, so that a
target that keeps state gets one call sequence on both sides; the states are compared after
the clean calls, as junk may land in a padded row's state): 64 calls on the reference (16
sizes, 5 keys), about a second."""

from __future__ import annotations

import functools

import torch

from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._judging import Lockstep, differences, graphed_call
from pytest_cudagraph.conformance._protocol import CudaGraphTarget, Inputs, Padding
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.compare import compare_outputs


def padded(target: CudaGraphTarget, padding: Padding, rows: int) -> Inputs:
    """A call with ``rows`` real rows, its values drawn from the seed ``rows``."""
    return padding.make_inputs(torch.Generator(target.device).manual_seed(rows), rows)


@check("padded batches", needs=("padding",), sharper_with=("state.sides", "state.reset"))
def test_padded_batches(
    target: CudaGraphTarget,
    padding: Padding,
    capture_counter: CaptureCounter,
    conclude: Conclude,
) -> None:
    lockstep = Lockstep(target, capture_counter)
    problems: list[str] = []
    keys: set[object] = set()
    poisoned = 0
    with capture_counter:
        for rows in range(1, padding.largest + 1):
            inputs = padded(target, padding, rows)
            key = target.key_of(inputs)
            keys.add(key)
            where = f"{rows} real rows (key {key!r}, seed {rows})"
            problems += lockstep.judge(
                functools.partial(padded, target, padding, rows), rows, where
            )
            if padding.junk is None:
                continue
            junk = padding.junk(padded(target, padding, rows))
            poisoned += bool(compare_outputs(inputs, junk))
            expected = lockstep.eager(padded(target, padding, rows), rows)
            actual = graphed_call(target, junk, seed=rows)
            lockstep.sync()
            problems += [
                f"{where}, junk in its padded part: {d}"
                for d in differences(target, inputs, expected, actual)
            ]
    if padding.junk is not None and not poisoned:
        problems.append(
            f"padding.junk changed no call of 1 to {padding.largest} real rows: nothing was "
            "written where the padding goes, so no leak could show"
        )
    problems += lockstep.problems()
    junked = f"; junk in the padded part of {poisoned}" if padding.junk is not None else ""
    state = f"; {lockstep.describe()}" if lockstep.stateful else ""
    figure = (
        f"real batches of 1 to {padding.largest} rows over {len(keys)} keys against eager"
        f"{junked}{state}"
    )
    judgement = Judgement(problems, figure, padding.largest, "real batch sizes")
    conclude(judgement, "padded batches answered unlike eager:")
