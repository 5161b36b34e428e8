#!/usr/bin/env python
"""What a FlyDSL release costs a built room, measured in one run.

    .venv/bin/python bench/release.py --other-python PY [--key KEY ...] [--out DIR]

``PY`` is a Python whose FlyDSL is another supported release (made as
tests/conftest.py ``flydsl_python`` makes one). The keys (default: two of
the cheapest smoke keys) are built under this environment's FlyDSL into a
fresh folder, then, under the other FlyDSL, each path is timed in CPU
seconds (user + system of the commands and their workers):

- prove: ``verify --against-jit --record`` (one JIT compile per key), after
  which ``build`` is up to date for the move without compiling;
- move: ``build`` on the room built under this FlyDSL, with no proof under
  the other (one compile per key, objects and bands kept when the GPU code
  object is the same);
- today: a rebuild of every key (``build --no-cache`` into a fresh folder)
  plus its re-proof (``verify --against-jit``), what the move cost before.

Bands' sha256 before and after the move and the prove path are compared.
Figures only: nothing here is asserted by the suite.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dsv41_aot.facts.releases import NEWEST  # noqa: E402

KEYS = ("k1@gfx950:s=4,tp=4,r=1", "k1@gfx942:s=4,tp=4,r=1")


def cpu(python: str, *args) -> float:
    """CPU seconds ``python -m dsv41_aot.cli ARGS`` and its children took."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = dict(os.environ)
    env.pop("DSV41_AOT_BUILD_CACHE", None)
    r = subprocess.run([python, "-m", "dsv41_aot.cli", *map(str, args)], capture_output=True, text=True, cwd=REPO,
                       env=env)
    if r.returncode != 0:
        sys.exit(f"dsv41-aot {' '.join(map(str, args))} -> {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bands(out: Path) -> dict:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*/lib/*"))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other-python", required=True, help="a Python whose FlyDSL is another supported release")
    ap.add_argument("--key", action="append", help=f"keys of vLLM {NEWEST} (default: {', '.join(KEYS)})")
    ap.add_argument("--out", help="folder for the rooms (default: a temporary one)")
    a = ap.parse_args()
    keys = a.key or list(KEYS)
    root = Path(a.out or tempfile.mkdtemp(prefix="dsv41-release-"))
    ver = lambda py: subprocess.run([py, "-c", "from importlib.metadata import version; print(version('flydsl'))"],
                                    capture_output=True, text=True, check=True).stdout.strip()
    x, y = ver(sys.executable), ver(a.other_python)
    build = ("build", "--release", NEWEST, "--key", *keys, "--no-progress", "--no-cache")
    print(f"load before: {Path('/proc/loadavg').read_text().strip()}")
    print(f"{len(keys)} keys of vLLM {NEWEST}, built under FlyDSL {x}, moved to FlyDSL {y}")
    base = cpu(sys.executable, *build, "--out", root / "x")
    print(f"  build under {x} (the room to move): {base:.1f} CPU s")
    for name in ("move", "prove"):
        subprocess.run(["cp", "-a", str(root / "x"), str(root / name)], check=True)
    before = bands(root / "x")
    prove = cpu(a.other_python, "verify", "--dir", root / "prove", "--against-jit", "--record", "--no-progress")
    prove_build = cpu(a.other_python, *build, "--out", root / "prove")
    move = cpu(a.other_python, *build, "--out", root / "move")
    rebuild = cpu(a.other_python, *build, "--out", root / "today")
    reprove = cpu(a.other_python, "verify", "--dir", root / "today", "--against-jit", "--no-progress")
    print(f"  prove under {y} (verify --against-jit --record), then build: {prove:.1f} + {prove_build:.1f} CPU s; "
          f"bands {'unchanged' if bands(root / 'prove') == before else 'CHANGED'}")
    print(f"  move (build under {y}, no proof under it):           {move:.1f} CPU s; "
          f"bands {'unchanged' if bands(root / 'move') == before else 'CHANGED'}")
    print(f"  today (rebuild every key + re-prove):                {rebuild:.1f} + {reprove:.1f} = "
          f"{rebuild + reprove:.1f} CPU s; bands {'unchanged' if bands(root / 'today') == before else 'all new'}")
    print(f"load after: {Path('/proc/loadavg').read_text().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
