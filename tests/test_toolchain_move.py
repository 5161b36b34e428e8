"""A build under another supported FlyDSL on a room built under the
installed one (aot/toolmove.py): where the GPU code objects are the same,
nothing is rebuilt and every band keeps its sha256; where one differs
(simulated), exactly that key is rebuilt and named. Two of the cheapest
smoke keys; the other FlyDSL is the session's second environment
(tests/conftest.py ``flydsl_python``)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from dsv41_aot.facts.flydsl import FLYDSL
from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.room import Room

REPO = Path(__file__).resolve().parents[1]
INSTALLED = version("flydsl")
OTHERS = sorted(set(FLYDSL) - {INSTALLED})
KEPT, CHANGED = "k1@gfx950:s=4,tp=4,r=1", "k1@gfx942:s=4,tp=4,r=1"  # the cheapest smoke keys, one room each

# the build under the other FlyDSL with the judgement of aot/toolmove.py made
# to see CHANGED's code object as different (a simulated code change)
SIMULATE = ("import sys; from dsv41_aot.aot import toolmove; same = toolmove.same_code; "
            f"toolmove.same_code = lambda old, new: old.key != {CHANGED!r} and same(old, new); "
            "from dsv41_aot.cli import main; sys.exit(main(sys.argv[1:]))")


def _build(python: str, out: Path, *extra, simulate=False) -> tuple[dict, str]:
    lead = ["-c", SIMULATE] if simulate else ["-m", "dsv41_aot.cli"]
    args = ["build", "--release", NEWEST, "--key", KEPT, CHANGED, "--out", str(out), "--no-progress", *extra]
    r = subprocess.run([python, *lead, *args, "--json"], capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout), r.stderr


def _bands(out: Path) -> dict:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.glob("*/lib/*")) if p.is_file()}


def _served(out: Path) -> dict:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "timings.json" and not p.name.startswith(".")}


@pytest.mark.slow
@pytest.mark.parametrize("other", OTHERS)
def test_a_flydsl_move_rebuilds_only_keys_whose_code_object_changed(flydsl_python, tmp_path, other):
    out = tmp_path / "room"
    py = flydsl_python(other)
    first, _ = _build(sys.executable, out)
    assert first["failed"] == 0 and _bands(out), first
    before_bands, before = _bands(out), _served(out)

    # the move, same code objects: each key compiles once under the other FlyDSL, nothing is written
    moved, _ = _build(py, out, "--no-cache")
    kept = sorted(k["key"] for k in moved["toolchain_kept"])
    assert kept == sorted([KEPT, CHANGED]) and moved["toolchain_changed"] == [], moved
    assert (moved["compiled"], moved["up_to_date"]) == (2, 0), moved  # compiled to tell: counted so (P13e)
    assert _bands(out) == before_bands and _served(out) == before, "a toolchain move with the same code objects " \
        "rebuilt, relinked or rewrote something"

    # a changed code object (simulated) for one key: exactly that key is rebuilt and named; the other stays
    r = subprocess.run([py, "-c", SIMULATE, "build", "--release", NEWEST, "--key", KEPT, CHANGED, "--out", str(out),
                        "--no-progress"], capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    named = [line.split()[1].rstrip(":") for line in r.stdout.splitlines() if line.strip().startswith("rebuilt ")]
    assert named == [CHANGED] and "1 key(s) built before under another FlyDSL" in r.stdout, r.stdout
    kept = Room(out, "gfx950", NEWEST).manifest().entries[KEPT]
    rebuilt = Room(out, "gfx942", NEWEST).manifest().entries[CHANGED]
    assert kept.source.flydsl_version == INSTALLED and rebuilt.source.flydsl_version == other
    after = _bands(out)
    assert {k: v for k, v in after.items() if k.startswith("gfx950/")} == \
        {k: v for k, v in before_bands.items() if k.startswith("gfx950/")}
    assert {k: v for k, v in after.items() if k.startswith("gfx942/")} != \
        {k: v for k, v in before_bands.items() if k.startswith("gfx942/")}

    # once rebuilt, the key is of this toolchain: a build again is up to date
    again, _ = _build(py, out)
    # KEPT is still the old FlyDSL's: told again by the object the simulated build cached; CHANGED is up to date
    assert (again["cached"], again["up_to_date"], again["toolchain_changed"]) == (1, 1, []), again
    assert again["toolchain_kept"] == [{"key": KEPT, "release": NEWEST}], again
