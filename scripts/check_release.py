"""Whether a release tag agrees with what is released: the tag names the version of every built
distribution (wheels and sdists in DIST), and CHANGELOG.md's latest heading is that version,
dated rather than unreleased. The release workflow runs it before anything is uploaded.

    python scripts/check_release.py v0.3.0 dist/
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from packaging.utils import parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

CHANGELOG = Path(__file__).resolve().parents[1] / "CHANGELOG.md"


def built_versions(dist: Path) -> dict[str, Version]:
    """File name -> version, for each wheel and sdist in ``dist``."""
    found: dict[str, Version] = {}
    for path in sorted(dist.iterdir()):
        if path.name.endswith(".whl"):
            found[path.name] = parse_wheel_filename(path.name)[1]
        elif path.name.endswith(".tar.gz"):
            found[path.name] = parse_sdist_filename(path.name)[1]
    return found


def release_problems(tag: str, built: dict[str, Version], changelog: str) -> list[str]:
    """Each way the tag, the built files and the changelog disagree (none: release)."""
    if not tag.startswith("v"):
        return [f"tag {tag!r} is not v followed by a version, e.g. v0.3.0"]
    try:
        version = Version(tag[1:])
    except InvalidVersion:
        return [f"tag {tag!r} is not v followed by a version, e.g. v0.3.0"]
    problems = [] if built else ["no wheel or sdist was built"]
    problems += [
        f"{name} is version {found}, the tag {tag}"
        for name, found in built.items()
        if found != version
    ]
    heading = re.search(r"^## (\S+)(.*)$", changelog, re.M)
    if heading is None:
        return [*problems, "CHANGELOG.md has no version heading"]
    if heading[1] != str(version):
        problems.append(f"CHANGELOG.md's latest heading is {heading[1]}, the tag {tag}")
    if "unreleased" in heading[2]:
        problems.append(f"CHANGELOG.md still calls {heading[1]} unreleased; date it")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tag", help="the release tag, e.g. v0.3.0")
    parser.add_argument("dist", type=Path, help="the folder of the built distributions")
    args = parser.parse_args(argv)
    problems = release_problems(args.tag, built_versions(args.dist), CHANGELOG.read_text())
    for problem in problems:
        print(f"not releasable: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
