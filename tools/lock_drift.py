"""Print how the running environment differs from a lock file.

Run it with the environment's own interpreter::

    .venv-latest/bin/python tools/lock_drift.py requirements/lock.txt

It prints the versions of the packages whose APIs gna_interp uses most (always), then every
package whose installed version differs from the lock, is missing, or is not in the lock.
It reports; it does not fail: whether drift matters is for the test suite run after it.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

WATCHED = ("torch", "transformers", "transformer-lens", "nnsight", "lm-eval", "circuitsvis")
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


def read_lock(path: Path) -> dict[str, str]:
    """``{canonical name: version}`` of every ``name==version`` line of a pip requirements lock."""
    if not path.is_file():
        raise SystemExit(f"lock_drift: no lock file at {str(path)!r} (expected a requirements file such as requirements/lock.txt)")
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        match = PIN.match(line.strip())
        if match:
            pins[canonicalize_name(match[1])] = match[2]
    if not pins:
        raise SystemExit(f"lock_drift: {str(path)!r} pins nothing (expected lines such as 'transformers==5.24.0')")
    return pins


def installed() -> dict[str, str]:
    """``{canonical name: version}`` of every distribution in this interpreter's environment."""
    return {canonicalize_name(dist.metadata["Name"]): dist.version for dist in metadata.distributions() if dist.metadata["Name"]}


def drift(locked: dict[str, str], present: dict[str, str], ignore: set[str]) -> list[tuple[str, str, str]]:
    """``(name, locked, installed)`` for every package whose version differs ("-" where absent)."""
    names = (set(locked) | set(present)) - ignore
    rows = [(name, locked.get(name, "-"), present.get(name, "-")) for name in sorted(names)]
    return [row for row in rows if row[1] != row[2]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lock", type=Path, help="the lock file, e.g. requirements/lock.txt")
    args = parser.parse_args(argv)
    locked, present = read_lock(args.lock), installed()
    # The project itself and the installers are not part of the lock.
    ignore = {canonicalize_name(name) for name in ("gna-interp", "pip", "setuptools", "wheel")}

    print(f"Python {sys.version.split()[0]}; versions against {args.lock}:")
    width = max(len(name) for name in WATCHED)
    for name in WATCHED:
        mark = "" if locked.get(name) == present.get(name) else "   <- differs from the lock"
        print(f"  {name:<{width}}  locked {locked.get(name, '-'):<12} here {present.get(name, '-'):<12}{mark}")
    rows = drift(locked, present, ignore)
    if not rows:
        print("Every installed package is at its locked version.")
        return 0
    print(f"{len(rows)} package(s) differ from the lock:")
    width = max(len(name) for name, _, _ in rows)
    for name, was, now in rows:
        print(f"  {name:<{width}}  {was:>12} -> {now}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
