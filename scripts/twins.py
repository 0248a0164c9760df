"""The broken twins of the conformance suite's own tests, found by reading their modules (the
GPU recipe plans with them before anything is installed): every public function of a
``broken_*targets.py`` that makes a target from the device alone,
``def name(device) -> CudaGraphTarget``, as ``module:function`` for ``--cudagraph-target``
with that folder importable."""

from __future__ import annotations

import ast
from pathlib import Path


def twins(folder: Path) -> list[str]:
    found = []
    for path in sorted(folder.glob("broken_*targets.py")):
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.FunctionDef)
                and not node.name.startswith("_")
                and node.returns is not None
                and ast.unparse(node.returns) == "CudaGraphTarget"
                and len(node.args.args) - len(node.args.defaults) == 1
            ):
                found.append(f"{path.stem}:{node.name}")
    return found
