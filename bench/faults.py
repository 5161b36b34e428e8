"""The fault suite's counts: faults tried, survived, refused with the right error.

Runs every test marked ``faults`` (tests/test_faults_*.py and the fault tests
of the plugin and loader suites) and tallies them from pytest's JUnit XML.
Each fault test injects one real fault (kill -9 mid-build or mid-link, a byte
flip in an object, library or manifest, a traversal path, an ABI with a slot
removed, two builders on one directory, a thread race on one Launcher, a
corrupt library behind vLLM's runner) and asserts what must happen: the build
survives and resumes to the same bytes, or the artifact is refused with the
named error, or vLLM falls back per key. A test that fails is a fault that got
through.

    .venv/bin/python bench/faults.py [-k EXPR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", help="pytest -k expression to narrow the faults")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dsv41-faults-") as tmp:
        xml = Path(tmp) / "faults.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "faults", "-p", "no:randomly", f"--junitxml={xml}", "tests"]
        if args.k:
            cmd += ["-k", args.k]
        proc = subprocess.run(cmd, cwd=REPO)
        if not xml.is_file():
            print(f"pytest wrote no report (exit {proc.returncode})", file=sys.stderr)
            return 2
        rows = []
        for case in ET.parse(xml).getroot().iter("testcase"):
            outcome = "held"
            if case.find("failure") is not None or case.find("error") is not None:
                outcome = "GOT THROUGH"
            elif case.find("skipped") is not None:
                outcome = "skipped"
            rows.append((case.get("classname", "").rsplit(".", 1)[-1], case.get("name", ""), outcome))
    width = max((len(f"{m}::{n}") for m, n, _ in rows), default=10)
    for module, name, outcome in rows:
        print(f"{module + '::' + name:{width}}  {outcome}")
    tried = sum(o != "skipped" for *_, o in rows)
    held = sum(o == "held" for *_, o in rows)
    print(f"\nfaults tried {tried}, held (survived or refused with the right error) {held}, "
          f"got through {tried - held}, skipped {len(rows) - tried}")
    return 0 if held == tried else 1


if __name__ == "__main__":
    sys.exit(main())
