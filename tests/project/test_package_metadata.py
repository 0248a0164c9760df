"""The two distributions say what they are: license, authors, project URLs, the test extra, and
one version, the changelog's latest, as installed."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

import pytest_cudagraph

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = "https://github.com/pytest-cudagraph/pytest-cudagraph"
DISTRIBUTIONS = ("pytest-cudagraph", "reasyn-ref")


def metadata(name: str = "pytest-cudagraph") -> importlib.metadata.PackageMetadata:
    # Read from the install, so a pyproject change shows only after `pip install -e .` again.
    return importlib.metadata.metadata(name)


def requirements(name: str) -> list[Requirement]:
    return [Requirement(text) for text in metadata(name).get_all("Requires-Dist") or []]


def test_license_is_mit_in_the_file_and_an_spdx_expression_in_the_metadata():
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")
    # reasyn-ref's folder links to the one file rather than keeping a copy.
    assert (ROOT / "reasyn_ref" / "LICENSE").resolve() == (ROOT / "LICENSE").resolve()
    for name in DISTRIBUTIONS:
        assert metadata(name)["License-Expression"] == "MIT"
        assert metadata(name).get_all("License-File") == ["LICENSE"]
        # The old free-text field and the license classifiers are what the expression replaces.
        assert metadata(name)["License"] is None
        assert not [c for c in metadata(name).get_all("Classifier") if c.startswith("License")]


def test_the_authors_are_the_licenses_copyright_holders():
    holders = re.search(r"^Copyright \(c\) \d{4} (.+)$", (ROOT / "LICENSE").read_text(), re.M)
    assert holders is not None
    for name in DISTRIBUTIONS:
        assert metadata(name)["Author"] == holders[1]


def test_project_urls_point_at_the_repository():
    urls = dict(entry.split(", ", 1) for entry in metadata().get_all("Project-URL"))
    assert set(urls) == {"Homepage", "Source", "Issues", "Changelog"}
    assert all(url.startswith(REPOSITORY) for url in urls.values())
    assert urls["Changelog"].endswith("/CHANGELOG.md")


def test_the_test_extra_pins_pyyaml_to_a_major_version():
    test_extra = {
        requirement.name.lower(): requirement.specifier
        for requirement in requirements("pytest-cudagraph")
        if requirement.marker is not None and requirement.marker.evaluate({"extra": "test"})
    }
    assert "pyyaml" in test_extra
    assert test_extra["pyyaml"].contains("6.0.4") and not test_extra["pyyaml"].contains("7.0")


def test_the_version_is_the_changelogs_latest():
    headings = re.findall(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert headings, "CHANGELOG.md has no version heading"
    assert Version(metadata()["Version"]) == Version(headings[0])
    # What the package says of itself (the results JSON records it) is that version too.
    assert pytest_cudagraph.__version__ == metadata()["Version"]


def test_reasyn_ref_moves_in_lock_step_with_the_plugin():
    version = metadata()["Version"]
    assert metadata("reasyn-ref")["Version"] == version
    pins = [req for req in requirements("reasyn-ref") if req.name == "pytest-cudagraph"]
    assert [str(pin.specifier) for pin in pins] == [f"=={version}"]
    # The plugin needs nothing of reasyn-ref.
    assert "reasyn-ref" not in {req.name for req in requirements("pytest-cudagraph")}
