"""The package says what it is: license, project URLs and the test extra, as installed."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = "https://github.com/pytest-cudagraph/pytest-cudagraph"


def metadata() -> importlib.metadata.PackageMetadata:
    # Read from the install, so a pyproject change shows only after `pip install -e .` again.
    return importlib.metadata.metadata("pytest-cudagraph")


def test_license_is_mit_in_the_file_and_the_metadata():
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")
    assert metadata()["License"] == "MIT"
    assert "License :: OSI Approved :: MIT License" in metadata().get_all("Classifier")


def test_project_urls_point_at_the_repository():
    urls = dict(entry.split(", ", 1) for entry in metadata().get_all("Project-URL"))
    assert set(urls) == {"Homepage", "Source", "Issues", "Changelog"}
    assert all(url.startswith(REPOSITORY) for url in urls.values())
    assert urls["Changelog"].endswith("/CHANGELOG.md")


def test_the_test_extra_pins_pyyaml_to_a_major_version():
    requirements = [Requirement(text) for text in metadata().get_all("Requires-Dist")]
    test_extra = {
        requirement.name.lower(): requirement.specifier
        for requirement in requirements
        if requirement.marker is not None and requirement.marker.evaluate({"extra": "test"})
    }
    assert "pyyaml" in test_extra
    assert test_extra["pyyaml"].contains("6.0.4") and not test_extra["pyyaml"].contains("7.0")
