"""What the two distributions hold, built here from a copy of the tree: the plugin's sdist is
the whole source tree (tests, docs, changelog, reasyn_ref), its wheel the plugin alone, and
reasyn-ref's wheel the reference with the three conformance targets."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def setuptools_version() -> Version | None:
    try:
        import setuptools
    except ImportError:
        return None
    return Version(setuptools.__version__)


def tracked_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return listed.stdout.splitlines() if listed.returncode == 0 else []


def present_tracked_files() -> list[str]:
    """The tracked files, as the working tree has them (uncommitted edits count too)."""
    return [name for name in tracked_files() if (ROOT / name).is_file()]


needs_the_build_tools = pytest.mark.skipif(
    not tracked_files() or (setuptools_version() or Version("0")) < Version("77"),
    reason="needs a git clone and setuptools 77 or later (the SPDX license string), as .ci/run has",
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin's sdist and wheel and reasyn-ref's wheel, built from a copy of the tracked
    files (building writes egg-info beside the sources)."""
    copy = tmp_path_factory.mktemp("tree")
    for name in present_tracked_files():
        source, target = ROOT / name, copy / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            target.write_bytes(source.read_bytes())
    out = tmp_path_factory.mktemp("dist")
    build = (
        "import sys; from setuptools import build_meta as b; "
        "b.build_sdist(sys.argv[1]) if sys.argv[2] == 'sdist' else b.build_wheel(sys.argv[1])"
    )
    for folder, kinds in ((copy, ("sdist", "wheel")), (copy / "reasyn_ref", ("wheel",))):
        for kind in kinds:
            subprocess.run(
                [sys.executable, "-c", build, str(out), kind],
                cwd=folder,
                capture_output=True,
                check=True,
            )
    return out


def only(folder: Path, pattern: str) -> Path:
    [path] = folder.glob(pattern)
    return path


@pytest.mark.slow
@needs_the_build_tools
def test_the_sdist_is_the_whole_source_tree(built: Path) -> None:
    with tarfile.open(only(built, "pytest_cudagraph-*.tar.gz")) as sdist:
        files = [member.name for member in sdist.getmembers() if not member.isdir()]
    names = {name.split("/", 1)[1] for name in files}
    missing = sorted(set(present_tracked_files()) - names)
    assert missing == [], f"tracked files left out of the sdist: {missing}"
    assert {"CHANGELOG.md", "tests/conftest.py", "docs/ci.md", "reasyn_ref/model.py"} <= names
    # And nothing else but what setuptools writes of its own.
    extra = names - set(tracked_files())
    assert {name for name in extra if not name.startswith("pytest_cudagraph.egg-info/")} == {
        "PKG-INFO",
        "setup.cfg",
    }


@needs_the_build_tools
def test_the_plugin_wheel_holds_the_plugin_alone(built: Path) -> None:
    with zipfile.ZipFile(only(built, "pytest_cudagraph-*.whl")) as wheel:
        names = wheel.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        registered = wheel.read(entry_points).decode()
    tops = {name.split("/", 1)[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"pytest_cudagraph"}
    assert "pytest_cudagraph/conformance/checks/test_01_parity.py" in names  # the suite ships
    # The own-graphs examples ship too, runnable from the install (docs/own-graphs.md).
    assert "pytest_cudagraph/examples/graphed_layer_target.py" in names
    assert "pytest_cudagraph.targets" not in registered


@needs_the_build_tools
def test_the_reasyn_ref_wheel_holds_the_reference_and_its_targets(built: Path) -> None:
    with zipfile.ZipFile(only(built, "reasyn_ref-*.whl")) as wheel:
        names = wheel.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        registered = wheel.read(entry_points).decode().splitlines()
    packaged = {name for name in names if not name.split("/", 1)[0].endswith(".dist-info")}
    sources = {
        name
        for name in present_tracked_files()
        if name.startswith("reasyn_ref/") and name.endswith(".py")
    }
    assert packaged == sources | {"reasyn_ref/py.typed"}
    targets = registered[registered.index("[pytest_cudagraph.targets]") + 1 :]
    assert sorted(line.split(" = ")[0] for line in targets if line) == [
        "reasyn",
        "reasyn-kv",
        "reasyn-lean",
    ]
