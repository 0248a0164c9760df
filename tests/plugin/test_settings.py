"""The settings table: value parsing, native TOML values and one resolution per session."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from pytest_cudagraph import settings


@pytest.mark.parametrize(
    ("given", "mib"),
    [
        (512, 512.0),
        (0.5, 0.5),
        ("512", 512.0),
        ("512MiB", 512.0),
        ("1.5GiB", 1536.0),
        (" 256 KiB ", 0.25),
    ],
)
def test_sizes_are_mib_or_carry_a_binary_unit(given: object, mib: float) -> None:
    assert settings.parse_mib(given) == mib


@pytest.mark.parametrize("given", ["300MB", "1GB", "12 apples", "", "-5MiB", True, [1]])
def test_other_sizes_are_refused(given: object) -> None:
    with pytest.raises(ValueError, match="must be"):
        settings.parse_mib(given)


@pytest.mark.parametrize("given", [0, -1.0, float("inf"), "0GiB"])
def test_a_size_must_be_positive(given: object) -> None:
    with pytest.raises(ValueError, match="must be a positive size"):
        settings.parse_mib(given)


@pytest.mark.parametrize("given", [-1, 2**63, 2**64, 1.0, "x", True])
def test_seeds_outside_what_torch_takes_are_refused(given: object) -> None:
    with pytest.raises(ValueError, match="seed must be"):
        settings.parse_seed(given)


def test_seeds_from_text_or_numbers() -> None:
    assert settings.parse_seed("17") == 17
    assert settings.parse_seed(" +17 ") == 17
    assert settings.parse_seed(2**63 - 1) == 2**63 - 1


@pytest.mark.parametrize("given", ["-1", -1, "18446744073709551616"])
def test_an_integer_out_of_range_is_named_as_out_of_range(given: object) -> None:
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*63 - 1\] \(case k runs"):
        settings.parse_seed(given)


@pytest.mark.parametrize(
    ("parse", "given", "message"),
    [
        (
            settings.parse_seed,
            "9" * 5000,
            "seed must be an integer of at most 20 digits, got one of 5000 digits",
        ),
        (settings.parse_case, "-" + "9" * 5000, "case must be an integer of at most 20 digits"),
        (
            settings.DEVICE.parse,
            "cuda:" + "9" * 5000,
            "the device index N must be an integer of at most 20 digits",
        ),
    ],
    ids=["seed", "case", "device"],
)
def test_a_number_of_thousands_of_digits_is_named_not_read(
    parse: Callable[[object], object], given: str, message: str
) -> None:
    """Python refuses to read more than 4300 digits: its own error told the user to call
    sys.set_int_max_str_digits()."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        parse(given)


def test_leading_zeros_are_no_digits_of_their_own() -> None:
    assert settings.parse_seed("0" * 5000 + "7") == 7


def test_a_seed_too_large_to_print_is_shown_by_its_size() -> None:
    with pytest.raises(ValueError, match=r"seed must be in .*, got an integer of 16610 bits$"):
        settings.check_seed(10**5000)


def test_the_seed_bound_is_derived_from_the_one_torch_takes() -> None:
    """Half of torch's range, so that the largest seed runs any count of cases a check takes."""
    from pytest_cudagraph.engines import parity, rng

    assert settings.MAX_SEED == rng.MAX_SEED // 2 == 2**63 - 1
    assert settings.MAX_SEED + parity.MAX_CASES - 1 <= rng.MAX_SEED


def test_a_negative_seed_on_the_command_line_is_out_of_range(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess("--cudagraph-seed=-1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --cudagraph-seed='-1': seed must be in [[]0, 2**63 - 1[]]*"]
    )


def test_the_marker_seed_must_be_an_integer_in_range(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.cuda_graph_parity(seed="3")
        def test_text(graph_parity):
            pass

        @pytest.mark.cuda_graph_parity(seed=-3)
        def test_negative(graph_parity):
            pass
        """
    )
    result = pytester.runpytest_inprocess("--continue-on-collection-errors")
    result.stdout.fnmatch_lines(
        [
            "*cuda_graph_parity on test_*.py::test_text: seed must be an integer, got '3'",
            "*cuda_graph_parity on test_*.py::test_negative: seed must be in [[]0, 2**63 - 1[]]*",
        ]
    )


@pytest.mark.parametrize(("given", "case"), [("0", 0), (" 12 ", 12), (7, 7)])
def test_cases_from_text_or_numbers(given: object, case: int) -> None:
    assert settings.parse_case(given) == case


@pytest.mark.parametrize(
    ("given", "message"),
    [("-1", "case must be a case number >= 0, got -1"), ("x", "case must be an integer")],
)
def test_bad_cases_are_refused(given: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        settings.parse_case(given)


def test_every_setting_has_option_env_and_ini_names() -> None:
    names = [setting.name for setting in settings.SETTINGS]
    assert len(names) == len(set(names))
    assert settings.JSON.option == "--cudagraph-json"
    assert settings.JSON.env == "PYTEST_CUDAGRAPH_JSON"
    assert settings.PINNED_STACK.ini == "cudagraph_pinned_stack"


@pytest.mark.skipif(not settings.TYPED_INI, reason="native TOML values need pytest >= 9.2")
def test_native_toml_values(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyprojecttoml(
        "[tool.pytest]\n"
        "cudagraph_memory_bound = 4\n"
        'cudagraph_pinned_stack = ["python>=3"]\n'
        "cudagraph_device = 1\n"
    )
    cpu_pytester.makepyfile(
        """
        import pytest

        from pytest_cudagraph import plugin

        @pytest.mark.fake_memory(growth_mib=10)
        @pytest.mark.graph_memory_bound
        def test_bound():
            pass

        @pytest.mark.pinned_stack
        def test_pinned(pytestconfig):
            assert pytestconfig.stash[plugin.BINDING].index == 1
        """
    )
    result = cpu_pytester.runpytest_inprocess()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*grew by 10.0 MiB, over the 4 MiB bound*"])


def test_settings_are_resolved_once_at_configure(
    cpu_pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu_pytester.makepyfile(
        """
        import os

        from pytest_cudagraph import settings

        def test_a(pytestconfig):
            os.environ["PYTEST_CUDAGRAPH_SEED"] = "9"
            snapshot = settings.snapshot(pytestconfig)
            assert snapshot[settings.SEED] == settings.Resolved(5, "PYTEST_CUDAGRAPH_SEED")
        """
    )
    monkeypatch.setenv("PYTEST_CUDAGRAPH_SEED", "5")
    cpu_pytester.runpytest_inprocess().assert_outcomes(passed=1)


def test_an_empty_environment_variable_means_unset(
    cpu_pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu_pytester.makeini("[pytest]\ncudagraph_seed = 7\n")
    cpu_pytester.makepyfile(
        """
        from pytest_cudagraph import settings

        def test_seed(pytestconfig):
            resolved = settings.snapshot(pytestconfig)[settings.SEED]
            assert resolved == settings.Resolved(7, "ini cudagraph_seed")
        """
    )
    monkeypatch.setenv("PYTEST_CUDAGRAPH_SEED", "")
    cpu_pytester.runpytest_inprocess().assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("given", "resolved"),
    [
        ({"cli": "3", "env": "4", "ini": "5"}, (3, "--cudagraph-seed")),
        ({"env": "4", "ini": "5"}, (4, "PYTEST_CUDAGRAPH_SEED")),
        ({"ini": "5"}, (5, "ini cudagraph_seed")),
        ({"ini": ""}, (0, "default")),  # an empty ini value is no value either
        ({}, (0, "default")),
    ],
    ids=["command line", "environment", "ini", "empty ini", "default"],
)
def test_the_first_source_present_wins(
    cpu_pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, given: dict, resolved: tuple
) -> None:
    if "ini" in given:
        cpu_pytester.makeini(f"[pytest]\ncudagraph_seed = {given['ini']}\n")
    if "env" in given:
        monkeypatch.setenv("PYTEST_CUDAGRAPH_SEED", given["env"])
    cpu_pytester.makepyfile(
        f"""
        from pytest_cudagraph import settings

        def test_seed(pytestconfig):
            resolved = settings.snapshot(pytestconfig)[settings.SEED]
            assert resolved == settings.Resolved{resolved!r}
        """
    )
    cli = [f"--cudagraph-seed={given['cli']}"] if "cli" in given else []
    cpu_pytester.runpytest_inprocess(*cli).assert_outcomes(passed=1)


def test_a_marker_value_beats_the_session_value() -> None:
    snapshot = settings.Snapshot({"seed": settings.Resolved(5, "--cudagraph-seed")})
    assert snapshot.value(settings.SEED) == 5
    assert snapshot.value(settings.SEED, 3) == 3
    assert snapshot.value(settings.SEED, 0) == 0  # a falsy marker value is still the marker's


class GivenConfig:
    """What a snapshot reads of a pytest config: its options, ini values and stash."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.stash = pytest.Stash()

    def getoption(self, dest: str, default: object = None) -> object:
        return self.options.get(dest, default)

    def getini(self, name: str) -> object:
        return None


def test_the_snapshot_holds_each_value_as_its_setting_parses_it(tmp_path) -> None:
    given = {
        settings.DEVICE: "cuda:1",
        settings.STACK: "any",
        settings.PINNED_STACK: "torch~=2.7.0",
        settings.STRAY_CONTEXTS: "fail",
        settings.SEED: "7",
        settings.CASE: "2",
        settings.MEMORY_BOUND: "1GiB",
        settings.JSON: str(tmp_path / "results.json"),
        settings.EMULATE: "on",
        settings.TARGET: "reasyn",
        settings.REPEAT: "3",
    }
    assert set(given) == set(settings.SETTINGS)
    config = GivenConfig({setting.dest: text for setting, text in given.items()})
    snapshot = settings.take_snapshot(config)
    assert settings.snapshot(config) is snapshot
    values = {setting.name: snapshot.value(setting) for setting in settings.SETTINGS}
    assert values == {
        "device": 1,
        "stack": "any",
        "pinned_stack": {"torch": SpecifierSet("~=2.7.0")},
        "stray_contexts": "fail",
        "seed": 7,
        "case": 2,
        "memory_bound": 1024.0,
        "json": tmp_path / "results.json",
        "emulate": "on",
        "target": "reasyn",
        "repeat": 3,
    }
    assert isinstance(values["json"], Path)
    assert {snapshot[setting].source for setting in settings.SETTINGS} == {
        setting.option for setting in settings.SETTINGS
    }


def test_a_setting_without_a_default_is_none_and_one_with_a_default_is_parsed() -> None:
    snapshot = settings.take_snapshot(GivenConfig({}))
    values = {setting.name: snapshot.value(setting) for setting in settings.SETTINGS}
    assert values == {
        "device": None,
        "stack": "pinned",
        "pinned_stack": {},
        "stray_contexts": "report",
        "seed": 0,
        "case": None,
        "memory_bound": None,
        "json": None,
        "emulate": "auto",
        "target": None,
        "repeat": 1,
    }
    assert not snapshot.given()


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("", "must be a file path, got an empty one"),
        ("  ", "must be a file path, got an empty one"),
        ("out", "is a folder; give a file path such as out/results.json"),
        ("notes.txt/results.json", "is under .*notes.txt, which is a file, not a folder"),
        ("notes.txt", "holds a file that is not results of this plugin .*"),
        ("x" * 300 + ".json", "cannot be looked at: File name too long; give another path"),
    ],
    ids=["empty", "blank", "folder", "under a file", "a file of the user's", "a name too long"],
)
def test_a_results_path_must_be_a_file_that_can_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str, problem: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=f"^{problem}$"):
        settings.parse_results_path(given)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt", "out"]
    assert settings.parse_results_path("out/results.json") == Path("out/results.json")


def test_a_results_path_expands_the_home_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--cudagraph-json=~/r.json``: no shell expands a ``~`` after ``=``."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert settings.parse_results_path("~/out/r.json") == tmp_path / "out" / "r.json"
    assert not (tmp_path / "~").exists()
