"""The smoke profile, built once per test session and linked: what the loader
and link tests run against. ``DSV41_AOT_TEST_PREBUILT=DIR`` names an already
built smoke directory instead (it is copied, never changed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dsv41_aot.aot import matrix  # noqa: E402
from dsv41_aot.facts.releases import NEWEST  # noqa: E402
from dsv41_aot.manifest import LIB  # noqa: E402
from dsv41_aot.room import room_dir  # noqa: E402

# the smoke profile's keys, from build_matrix.yaml (what every smoke build
# holds): SMOKE_KEYS are the newest release's (the key strings of its rooms),
# SMOKE_RELEASE_KEYS every release's
SMOKE_RELEASE_KEYS: dict = {}
for _k in matrix.load().select("smoke"):
    SMOKE_RELEASE_KEYS.setdefault(_k.release, []).append(str(_k))
SMOKE_KEYS = sorted(SMOKE_RELEASE_KEYS[NEWEST])
OLD = min(SMOKE_RELEASE_KEYS)  # the older release the smoke profile holds (0.32.0)


# the workplace's real full deployments: beside the checkout, or beside a worktree's parent
SHARED = next((p / "shared" for p in REPO.parents[0:3] if (p / "shared").is_dir()), REPO.parent / "shared")
DEPLOYMENTS = {  # name -> (arch, env variable naming its folder, default folder, keys of each release)
    "gfx950-tp4": ("gfx950", "DSV41_AOT_FULL_DEPLOYMENT", SHARED / "prebuilt-gfx950-tp4", {"0.33.0": 912, "0.32.0": 240}),
    "gfx942-tp4": ("gfx942", "DSV41_AOT_FULL_DEPLOYMENT_GFX942", SHARED / "prebuilt-gfx942-tp4", {"0.33.0": 630}),
    "gfx950-tp2": ("gfx950", "DSV41_AOT_FULL_DEPLOYMENT_GFX950_TP2", SHARED / "prebuilt-gfx950-tp2",
                   {"0.33.0": 912, "0.32.0": 240}),
}


def deployment(name: str) -> Path:
    """The folder of the shared full deployment ``name``; skipped when absent, a failure under CI=true."""
    import pytest

    from dsv41_aot.room import Room

    arch, var, default, shipped = DEPLOYMENTS[name]
    d = Path(os.environ.get(var) or default)
    if not all(Room(d, arch, r).libs_path.is_file() for r in shipped):
        why = f"no full {name} deployment of vLLM {', '.join(shipped)} at {d} (the shared folder, or {var}=DIR)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why} (CI=true: these tests must run, not skip)")
        pytest.skip(why)
    return d.resolve()


def smoke_count(arch: str | None = None, release: str = NEWEST) -> int:
    return sum(1 for k in SMOKE_RELEASE_KEYS[release] if arch is None or f"@{arch}:" in k)


def room(root: Path, arch: str, release: str = NEWEST) -> Path:
    """A room of a prebuilt dir: <root>/<arch>/vllm-<release> (manifest.json, libs.json)."""
    return room_dir(Path(root) / arch, release)


def libdir(root: Path, arch: str) -> Path:
    """An arch's band folder (shared by its releases): <root>/<arch>/lib."""
    return Path(root) / arch / LIB


def libs_json(root: Path, arch: str = "gfx950", release: str = NEWEST) -> tuple[Path, dict]:
    """A room's libs.json: its path and its document, to read or to damage and write back."""
    path = room(root, arch, release) / "libs.json"
    return path, json.loads(path.read_text())


def stand_in_entry(text: str, release: str, sha256: str = "0" * 64) -> dict:
    """A made-up manifest entry of key ``text`` (no object behind it), as ``Manifest.put`` takes one.

    Its mono sources digest is made from ``release``, so two releases' rooms differ."""
    from dsv41_aot.keys import BuildKey

    k = BuildKey.parse(text, release)
    source = {"vllm_version": release, "mono_sources": release.replace(".", "") * 3, "linker": "LLD 19",
              "helpers": {"impl": "dsv41_aot.compat", "digest": "0" * 16}, "flydsl_version": "0.4.2"}
    return {"key": text, "kind": k.kind, "arch": k.arch, "fields": k.build_fields(), "symbol": k.kernel_symbol,
            "entry": k.entry, "object": f"objects/{k.entry}.o", "sha256": sha256, "bytes": 1,
            "code_object_sha256": "0" * 64, "code_object_bytes": 1, "source": source}


def band_of(doc: dict, key: str) -> dict:
    """The band of a libs.json document whose entries hold ``key``."""
    return next(lib for lib in doc["libraries"] if key in lib["entries"])


def forge_band(root: Path, arch: str, path: Path, doc: dict, lib: dict, packed: bytes, **fields) -> None:
    """Put ``packed`` in place of band ``lib`` (of ``doc``, the libs.json at ``path``) under the name its sha256
    makes, libs.json forged to match: every record agrees, as a forger would leave it. ``fields`` too are set."""
    import hashlib

    from dsv41_aot.linkrecord import band_file

    (libdir(root, arch) / lib["file"]).unlink()
    lib.update(sha256=hashlib.sha256(packed).hexdigest(), bytes=len(packed), **fields)
    lib["file"] = band_file(lib["chunk"], lib["sha256"])
    (libdir(root, arch) / lib["file"]).write_bytes(packed)
    path.write_text(json.dumps(doc))


def forge_library(root: Path, arch: str, path: Path, doc: dict, lib: dict, raw: bytes) -> None:
    """Put library ``raw``, packed as xz, in place of band ``lib``: ``forge_band`` with its raw digests forged too."""
    import hashlib
    import lzma

    forge_band(root, arch, path, doc, lib, lzma.compress(bytes(raw), format=lzma.FORMAT_XZ),
               raw_sha256=hashlib.sha256(raw).hexdigest(), raw_bytes=len(raw))


def cli(*args, check: bool = False, cwd=REPO, timeout: float = 1800, **kw) -> subprocess.CompletedProcess:
    """``dsv41-aot ARGS`` in a subprocess, the suite's one CLI runner: its CompletedProcess (text).

    The dsv41_aot package imported is the one in ``cwd`` (the repository's by
    default); ``kw`` goes to subprocess.run (``env``, ``input``). With
    ``check``, an exit other than 0 fails, naming the command and its output."""
    proc = subprocess.run([sys.executable, "-m", "dsv41_aot.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"dsv41-aot {' '.join(map(str, args))} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_cli(*args, check: bool = True, **kw) -> tuple[int, str, str]:
    """``cli(ARGS)``, checked by default, as (exit code, stdout, stderr)."""
    proc = cli(*args, check=check, **kw)
    return proc.returncode, proc.stdout, proc.stderr


_READY: set = set()  # smoke folders built and linked by this process


def smoke_dir(tmp_path_factory) -> Path:
    """The session's one built and linked smoke prebuilt directory, for every
    module that asks (whichever asks first builds it; tests read it and copy
    it to change it). A test must not assume it compiled anything: with
    ``DSV41_AOT_TEST_PREBUILT`` it is a copy brought up to date."""
    out = tmp_path_factory.getbasetemp() / "smoke-prebuilt"
    if out in _READY:
        return out
    given = os.environ.get("DSV41_AOT_TEST_PREBUILT")
    if given and not out.exists():
        shutil.copytree(given, out, ignore=shutil.ignore_patterns("lib", ".build.lock"))
    r = cli("build", "--profile", "smoke", "--out", out, "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    r = cli("link", "--dir", out)
    assert r.returncode == 0, r.stdout + r.stderr
    _READY.add(out)
    return out


def build_wheel(prebuilt: Path, out: Path) -> Path:
    """The kernels wheel ``ci/release.py build-wheel`` makes of ``prebuilt`` in ``out`` (seconds, no Docker)."""
    r = subprocess.run([sys.executable, "ci/release.py", "build-wheel", str(prebuilt), str(out)], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (w,) = Path(out).glob("*.whl")
    return w


def install_into(wheel: Path, site: Path) -> Path:
    """Install ``wheel`` with pip into the folder ``site`` (``--target``, no dependencies, no index): ``site``."""
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                        str(wheel)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return site


def copy_of(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".build.lock"))
    return dst


def replace_code_object(root: Path, arch: str, release: str, key: str, change) -> Path:
    """Put ``change(code, codes)`` (bytes of the same size; ``codes``: the band's code objects by sha256) in
    place of ``key``'s GPU code object in its band, and update every record naming it: libs.json (sha256,
    sizes, the band's file name), the manifest's and the proof's code_object_sha256. Returns the new band."""
    import hashlib

    from dsv41_aot import elf
    from dsv41_aot.aot.link import compress_band
    from dsv41_aot.linkrecord import band_file
    from dsv41_aot.room import Room

    r = Room(root, arch, release)
    band = r.links().band_of[key]
    raw = r.read_band(band)
    codes = elf.embedded_code_objects(raw)
    old = codes[r.manifest().entries[key].code_object_sha256]
    new = change(old, codes)
    assert len(new) == len(old) and raw.count(old) == 1
    raw = raw.replace(old, new)
    data = compress_band(raw)
    (r.lib / band.file).unlink()
    doc = json.loads(r.libs_path.read_text())
    lib = next(lib for lib in doc["libraries"] if lib["file"] == band.file)
    lib.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data), raw_sha256=hashlib.sha256(raw).hexdigest())
    lib["file"] = band_file(lib["chunk"], lib["sha256"])
    (r.lib / lib["file"]).write_bytes(data)
    r.libs_path.write_text(json.dumps(doc))
    for path, field in ((r.manifest_path, "entries"), (r.verified_path, "keys")):
        doc = json.loads(path.read_text())
        doc[field][key]["code_object_sha256"] = hashlib.sha256(new).hexdigest()
        path.write_text(json.dumps(doc))
    return r.lib / lib["file"]
