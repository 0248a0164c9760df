"""Checking a results document (``--cudagraph-json``) against the JSON Schema the package ships."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from pytest_cudagraph import results


def assert_valid_results(document: Mapping[str, object]) -> None:
    """Fail unless ``document`` follows results.schema.json; skip where jsonschema is missing
    (a host without the test extra, such as an offline GPU host)."""
    jsonschema = pytest.importorskip(
        "jsonschema", reason="checking against the schema needs jsonschema (the test extra)"
    )
    validator = jsonschema.Draft202012Validator(results.schema())
    problems = [
        f"{'/'.join(map(str, error.absolute_path)) or '(document)'}: {error.message}"
        for error in validator.iter_errors(document)
    ]
    assert not problems, "\n".join(problems)
