"""The profile arithmetic (device_profile.py) and scripts/replay_profile.py's output and
arguments, on synthetic profiles (CPU, runs in CI). Profiling itself runs only on a GPU host;
reports/README.md says where it ran."""

from __future__ import annotations

import pytest
import torch
from device_profile import DeviceOp, summarize
from script_modules import script_module


@pytest.fixture(scope="module")
def script():
    with script_module("replay_profile") as module:
        yield module


def test_keys_parse_and_bad_ones_are_named(script):
    assert script.parse_key("8x64") == (8, 64)
    assert script.parse_key("1X512") == (1, 512)
    for bad in ("8", "8x", "x64", "0x64", "8x-1", "8x64x2", "ax64"):
        with pytest.raises(ValueError, match=rf"key '{bad}' must be BATCHxSEQ"):
            script.parse_key(bad)


def test_summary_counts_busy_time_span_and_idle_before_each_kernel(script):
    op = DeviceOp
    # Two calls of: copy, gemm, attention (the attention waits 5 us), and one overlap.
    ops = [
        op("copy", 0.0, 1.0),
        op("gemm", 1.5, 5.5),
        op("attn", 10.5, 12.5),
        op("copy", 13.0, 14.0),
        op("gemm", 14.5, 18.5),
        op("attn", 23.5, 25.5),
        op("gemm", 24.0, 25.0),  # overlaps the attention: no idle time before it
    ]
    profile = summarize(list(reversed(ops)), calls=2)  # any order
    assert profile.ops_per_call == 3.5
    assert profile.device_us_per_call == pytest.approx(((1 + 4 + 2) * 2 + 1) / 2)
    assert profile.span_us_per_call == pytest.approx(25.5 / 2)
    assert profile.efficiency == pytest.approx(profile.device_us_per_call / (25.5 / 2))
    rows = {row.name: row for row in profile.rows}
    assert rows["attn"].idle_before_us_per_call == pytest.approx(5.0)
    assert rows["gemm"].idle_before_us_per_call == pytest.approx(0.5)  # (0.5 + 0.5 + 0) / 2
    assert rows["copy"].idle_before_us_per_call == pytest.approx(0.25)  # (0 + 0.5) / 2
    assert rows["gemm"].per_call == 1.5 and rows["gemm"].mean_us == pytest.approx(3.0)
    assert [row.name for row in profile.rows] == ["attn", "gemm", "copy"]  # most idle first
    text = script.render((8, 64), profile)
    assert text.startswith("key (8, 64): 4 device ops per call") and "attn" in text


def test_summary_refuses_nothing_to_summarize():
    with pytest.raises(ValueError, match="no device operations"):
        summarize([], calls=1)
    with pytest.raises(ValueError, match="calls must be >= 1, got 0"):
        summarize([DeviceOp("k", 0.0, 1.0)], calls=0)


def test_command_line_errors_name_the_argument(script, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--keys", "8by64"])
    assert exit_info.value.code == 2
    assert "key '8by64' must be BATCHxSEQ" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["--calls", "0"])
    assert "--calls must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where CUDA is absent")
def test_without_cuda_it_says_so(script, capsys):
    assert script.main([]) == 2
    assert "needs CUDA" in capsys.readouterr().err
