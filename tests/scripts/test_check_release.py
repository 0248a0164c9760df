"""scripts/check_release.py: a release tag must name the built version and the changelog's
latest heading, which must be dated."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_release import built_versions, main, release_problems
from packaging.version import Version

import pytest_cudagraph

DATED = "# Changelog\n\n## 0.3.0 (2027-01-15)\n\n- things\n\n## 0.2.0\n"
BUILT = {"pytest_cudagraph-0.3.0-py3-none-any.whl": Version("0.3.0")}


def test_a_tag_that_agrees_with_everything_is_releasable() -> None:
    assert release_problems("v0.3.0", BUILT, DATED) == []


@pytest.mark.parametrize(
    ("tag", "built", "changelog", "problem"),
    [
        ("0.3.0", BUILT, DATED, "tag '0.3.0' is not v followed by a version, e.g. v0.3.0"),
        ("vnext", BUILT, DATED, "tag 'vnext' is not v followed by a version, e.g. v0.3.0"),
        (
            "v0.3.1",
            BUILT,
            DATED,
            "pytest_cudagraph-0.3.0-py3-none-any.whl is version 0.3.0, the tag v0.3.1",
        ),
        ("v0.3.0", {}, DATED, "no wheel or sdist was built"),
        ("v0.3.0", BUILT, "# Changelog\n", "CHANGELOG.md has no version heading"),
        (
            "v0.3.0",
            BUILT,
            DATED.replace("0.3.0 (2027-01-15)", "0.2.1 (2027-01-15)"),
            "CHANGELOG.md's latest heading is 0.2.1, the tag v0.3.0",
        ),
        (
            "v0.3.0",
            BUILT,
            DATED.replace("(2027-01-15)", "(unreleased)"),
            "CHANGELOG.md still calls 0.3.0 unreleased; date it",
        ),
    ],
    ids=[
        "no v",
        "no version",
        "another version",
        "nothing built",
        "no heading",
        "another heading",
        "unreleased",
    ],
)
def test_each_disagreement_is_named(
    tag: str, built: dict[str, Version], changelog: str, problem: str
) -> None:
    assert problem in release_problems(tag, built, changelog)


def test_versions_are_read_from_wheel_and_sdist_names(tmp_path: Path) -> None:
    for name in ("pytest_cudagraph-0.3.0-py3-none-any.whl", "reasyn_ref-0.3.0.tar.gz", "notes.txt"):
        (tmp_path / name).write_text("")
    assert built_versions(tmp_path) == {
        "pytest_cudagraph-0.3.0-py3-none-any.whl": Version("0.3.0"),
        "reasyn_ref-0.3.0.tar.gz": Version("0.3.0"),
    }


def test_the_command_fails_on_this_trees_unreleased_changelog(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The changelog's latest version is unreleased until a release dates it.
    version = pytest_cudagraph.__version__
    (tmp_path / f"pytest_cudagraph-{version}-py3-none-any.whl").write_text("")
    changelog = (Path(__file__).resolve().parents[2] / "CHANGELOG.md").read_text()
    unreleased = "(unreleased)" in changelog.split("\n## ", 2)[1].splitlines()[0]
    assert main([f"v{version}", str(tmp_path)]) == (1 if unreleased else 0)
    assert ("unreleased; date it" in capsys.readouterr().err) == unreleased
