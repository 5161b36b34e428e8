"""The kernels wheel: ONE wheel for both arches and both vLLM releases (every
room <arch>/vllm-<release>/ of a real smoke build, and the bands its rooms
share), built with pip wheel and python -m build in the project's own
environment (no index is asked for setuptools), checked (name, tag, metadata,
bands, auditwheel on the raw libraries), installed into a fresh venv with no
FlyDSL, torch or vLLM, and every key of every room listed and bound there by
release (band sha256, memfd dlopen, entry, ABI); bad prebuilt dirs (a room of
another release's sources, a stray band, ...) are refused by the build itself.

The GPU is the only thing absent: binding resolves each band against
Debian's libamdhip64 (ROCm 5.2, accepted by DSV41_AOT_ALLOW_HIP_VERSION=5.2
from conftest); a launch then fails with a HIP error, which the test expects.
"""

from __future__ import annotations

import json
import lzma
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci import check_wheel  # noqa: E402
from ci.check_wheel import source_tree  # noqa: E402


from dsv41_aot.aot import matrix  # noqa: E402
from dsv41_aot.manifest import folder_name

PY = sys.executable
ARCHES = ("gfx950", "gfx942")
# the smoke profile's rooms: (arch, release) with keys
SMOKE = matrix.load().select("smoke")
ROOMS = sorted({(k.arch, k.release) for k in SMOKE})


def room(root: Path, arch: str, release: str) -> Path:
    return root / arch / folder_name(release)


def entries(root: Path, arch: str, release: str) -> dict:
    return json.loads((room(root, arch, release) / "manifest.json").read_bytes())["entries"]

pytestmark = pytest.mark.slow


def run(cmd, cwd=ROOT, env=None, **kw):
    full = dict(os.environ, **(env or {}))
    for var in ("DSV41_AOT_ARCH", "DSV41_AOT_PREBUILT", "DSV41_AOT_WHEEL_OBJECTS", "PYTHONPATH"):
        if var not in (env or {}):
            full.pop(var, None)
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=full, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, **kw)


def pip_wheel(src: Path, out: Path, prebuilt: Path | None):
    """`pip wheel` in this environment (--no-build-isolation: setuptools is
    the project's own, nothing is fetched)."""
    env = {"DSV41_AOT_PREBUILT": str(prebuilt)} if prebuilt else {}
    return run([PY, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", out, "."], cwd=src, env=env)


@pytest.fixture(scope="module")
def smoke(smoke_dir):
    """The session's smoke build, built for real and linked."""
    return smoke_dir


@pytest.fixture(scope="module")
def wheel(smoke, tmp_path_factory):
    """The one wheel of both arches, through `pip wheel`; `python -m build
    --wheel` gives the same name and the same kernels."""
    tmp = tmp_path_factory.mktemp("wheels")
    src = source_tree(tmp / "src")
    r = pip_wheel(src, tmp / "dist", smoke)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (w,) = (tmp / "dist").glob("*.whl")
    src2 = source_tree(tmp / "src2")
    r = run([PY, "-m", "build", "--wheel", "--no-isolation", "--outdir", tmp / "dist-build", "."], cwd=src2,
            env={"DSV41_AOT_PREBUILT": str(smoke)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (w2,) = (tmp / "dist-build").glob("*.whl")
    assert w2.name == w.name
    with zipfile.ZipFile(w) as a, zipfile.ZipFile(w2) as b:
        kernels = sorted(n for n in a.namelist() if "kernels_prebuilt/" in n)
        assert kernels == sorted(n for n in b.namelist() if "kernels_prebuilt/" in n)
        assert all(a.read(n) == b.read(n) for n in kernels)
    return w


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh venv: the standard library, pip, nothing else."""
    path = tmp_path_factory.mktemp("venv") / "v"
    r = run([PY, "-m", "venv", path])
    assert r.returncode == 0, r.stderr
    return path


def test_one_wheel_name_tag_metadata_and_bands(wheel, smoke):
    assert {r for _, r in ROOMS} == {"0.32.0", "0.33.0"}  # the smoke build holds both releases
    assert wheel.name == "dsv41_aot-0.1.0-py3-none-manylinux_2_28_x86_64.whl"  # no local version label
    result = check_wheel.check(wheel, smoke)  # includes auditwheel on the unpacked raw libraries
    assert result["problems"] == [], result["problems"]
    assert result["arches"] == sorted(ARCHES) and result["keys"] == len(SMOKE)
    assert result["keys_by_arch"] == {a: sum(1 for k in SMOKE if k.arch == a) for a in ARCHES}
    assert result["keys_by_room"] == {f"{a}/{folder_name(r)}": len(entries(smoke, a, r)) for a, r in ROOMS}
    assert result["vllm"] == ["0.32.0", "0.33.0"]
    assert result["auditwheel_external"] == []  # no DT_NEEDED at all: HIP is the host's
    assert result["raw_library_bytes"] > 2 * result["kernel_bytes"]  # the bands are xz, not raw
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    kernels = sorted(n.split("kernels_prebuilt/")[1] for n in names if "kernels_prebuilt/" in n)
    assert {n.split("/")[0] for n in kernels} == set(ARCHES)
    assert not [n for n in kernels if "/objects/" in n]
    assert not [n for n in kernels if n.endswith("timings.json")]  # measured: never shipped
    assert {n.rsplit("/", 1)[0] for n in kernels if n.endswith("manifest.json")} == \
        {f"{a}/{folder_name(r)}" for a, r in ROOMS}
    assert not [n for n in names if n.endswith(".so")]  # nothing raw
    # the bands of an arch: those its rooms' libs.json name, once each, in <arch>/lib/
    named = {f"{a}/lib/{lib['file']}" for a, r in ROOMS
             for lib in json.loads((room(smoke, a, r) / "libs.json").read_text())["libraries"]}
    assert sorted(n for n in kernels if n.endswith(".so.xz")) == sorted(named)
    assert all(n.startswith("dsv41_aot") for n in names)  # platlib root, not .data/purelib
    runtime = [line for line in meta.splitlines() if line.startswith("Requires-Dist") and "extra ==" not in line]
    assert runtime == []
    assert 'Requires-Dist: flydsl==0.4.2; extra == "build"' in meta
    (vllm,) = [line for line in meta.splitlines() if line.startswith("Requires-Dist: vllm") and '"vllm"' in line]
    spec = vllm.split(";")[0]
    assert "==" not in spec and ">=0.32.0" in spec and "<0.34" in spec  # both releases it serves, not one pin
    readme = meta.split("\n\n", 1)[1]
    assert "vLLM 0.33.0" in readme and "vLLM 0.32.0" in readme  # and the README names them


def test_check_wheel_catches_a_raw_library_and_an_external_one(wheel, tmp_path):
    """The checker itself: a wheel with a raw .so beside its bands, and a band
    whose library needs an external one, both fail."""
    bad = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as z, zipfile.ZipFile(bad, "w", zipfile.ZIP_DEFLATED) as out:
        for info in z.infolist():
            out.writestr(info, z.read(info))
        out.writestr("dsv41_aot/kernels_prebuilt/gfx950/lib/stray.so", b"\x7fELF")
        out.writestr("dsv41_aot/kernels_prebuilt/gfx950/vllm-0.32.0/timings.json", b"{}")
    problems = check_wheel.check(bad, auditwheel=False)["problems"]
    assert any("raw shared libraries" in p for p in problems)
    assert any("timings in the wheel" in p and "vllm-0.32.0/timings.json" in p for p in problems)
    libz = next(Path(p) for p in ("/usr/lib/x86_64-linux-gnu/libpng16.so.16", "/usr/lib/x86_64-linux-gnu/libxml2.so.2")
                if Path(p).is_file())
    assert check_wheel.audit_raw({"x/needs-external.so": libz.read_bytes()}) != []


def test_installed_wheel_lists_and_binds_every_room_without_flydsl_torch_or_vllm(wheel, venv, smoke, tmp_path):
    r = run([venv / "bin" / "python", "-m", "pip", "install", "--no-deps", "--no-index", wheel])
    assert r.returncode == 0, r.stderr
    site = next((venv / "lib").glob("python3*/site-packages"))
    before = sorted(str(p) for p in site.rglob("*"))
    home = tmp_path / "home"
    home.mkdir()
    # ci/check_installed.py runs from outside the checkout: it imports the
    # installed package, and ignores a DSV41_AOT_PREBUILT naming another dir
    r = run([venv / "bin" / "python", ROOT / "ci" / "check_installed.py", "--json"], cwd=venv,
            env={"DSV41_AOT_PREBUILT": str(tmp_path / "elsewhere"), "HOME": str(home)})
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["installed_heavy"] == [] and doc["problems"] == []
    assert doc["package"].startswith(str(venv)) and doc["ignored_DSV41_AOT_PREBUILT"] == str(tmp_path / "elsewhere")
    assert sorted(doc["arches"]) == sorted(ARCHES) and doc["mapped_from_memory"] is True
    assert sorted((a, r) for a, by in doc["arches"].items() for r in by) == ROOMS
    for arch, release in ROOMS:
        expect = entries(smoke, arch, release)
        got = doc["arches"][arch][release]["bound"]
        assert sorted(got) == sorted(expect)
        for key, launcher in got.items():
            assert launcher["kernel"] == expect[key]["symbol"]

    # the public API: keys(arch, release=) lists each room's keys, then every
    # key of every room is bound by its release (a key string two releases
    # build names two kernels), then one launch: no GPU here, so a HIP error
    # (not a crash); nothing mapped from site-packages
    probe = (
        "import json, sys, dsv41_aot\n"
        "from dsv41_aot.errors import LaunchError\n"
        "rooms = json.loads(sys.argv[1])\n"
        "listed = {f'{a} {r}': dsv41_aot.keys(a, release=r) for a, r in rooms}\n"
        "ls = [dsv41_aot.load_key(k, release=r) for a, r in rooms for k in listed[f'{a} {r}']]\n"
        "[l.bind() for l in ls]\n"
        "assert not {'flydsl', 'torch', 'vllm'} & set(sys.modules)\n"
        "maps = open('/proc/self/maps').read()\n"
        "assert 'kernels_prebuilt' not in maps and maps.count('/memfd:libdsv41_') > 0\n"
        "print(json.dumps({'listed': listed, 'kernels': [l.kernel_name for l in ls]}))\n"
        "try:\n"
        "    ls[0](*[0] * (len(ls[0].abi) - 1), stream=0)\n"
        "except LaunchError as e:\n"
        "    print('LaunchError', e)\n"
    )
    r = run([venv / "bin" / "python", "-c", probe, json.dumps(ROOMS)], cwd=venv, env={"HOME": str(home)})
    assert r.returncode == 0, r.stderr
    first, rest = r.stdout.split("\n", 1)
    got = json.loads(first)
    assert got["listed"] == {f"{a} {r}": sorted(entries(smoke, a, r)) for a, r in ROOMS}
    assert got["kernels"] == [entries(smoke, a, r)[k]["symbol"] for a, r in ROOMS for k in sorted(entries(smoke, a, r))]
    # the same key string in both gfx950 rooms binds each release's own kernel object
    both = sorted(set(entries(smoke, "gfx950", "0.32.0")) & set(entries(smoke, "gfx950", "0.33.0")))
    assert both and any(entries(smoke, "gfx950", "0.32.0")[k]["sha256"] != entries(smoke, "gfx950", "0.33.0")[k]["sha256"]
                        for k in both)
    assert rest.startswith("LaunchError") and "hip" in rest.lower()
    # nothing written to site-packages or the home directory
    assert sorted(str(p) for p in site.rglob("*") if "__pycache__" not in str(p)) == \
        [p for p in before if "__pycache__" not in p]
    assert list(home.rglob("*")) == []


def test_a_band_of_another_room_fails_both_wheel_checks(wheel, tmp_path):
    """N1 in a wheel: the 0.32.0 room's libs.json names the 0.33.0 s01-08
    band, with its real sha256 and sizes. verify --wheel (wheel.judge) and
    ci/check_wheel.py both refuse it: the band was not linked from the
    objects the 0.32.0 room names."""
    from dsv41_aot.aot.wheel import judge

    pkg = "dsv41_aot/kernels_prebuilt/gfx950/"
    bad = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as z, zipfile.ZipFile(bad, "w", zipfile.ZIP_DEFLATED) as out:
        docs = {r: json.loads(z.read(f"{pkg}{folder_name(r)}/libs.json")) for r in ("0.32.0", "0.33.0")}
        chunk = "libdsv41_gfx950_tp4_s01-08"
        mine, theirs = ([lib for lib in docs[r]["libraries"] if lib["chunk"] == chunk][0] for r in ("0.32.0", "0.33.0"))
        mine.update({f: theirs[f] for f in ("file", "sha256", "bytes", "raw_sha256", "raw_bytes")})
        for info in z.infolist():
            forged = info.filename == f"{pkg}{folder_name('0.32.0')}/libs.json"
            out.writestr(info, json.dumps(docs["0.32.0"]) if forged else z.read(info))
    for problems in (judge(bad)["problems"], check_wheel.check(bad, auditwheel=False)["problems"]):
        assert any("was not linked from the objects libs.json names" in p for p in problems), problems


def test_no_arch_gives_a_pure_wheel_without_kernels(tmp_path):
    src = source_tree(tmp_path / "src")
    (src / "kernels_prebuilt" / "gfx950").mkdir(parents=True)  # never looked at without DSV41_AOT_PREBUILT
    r = pip_wheel(src, tmp_path / "dist", None)
    assert r.returncode == 0, r.stderr
    (w,) = (tmp_path / "dist").glob("*.whl")
    assert w.name == "dsv41_aot-0.1.0-py3-none-any.whl"
    assert check_wheel.check(w)["problems"] == []
    with zipfile.ZipFile(w) as z:
        assert not [n for n in z.namelist() if "kernels_prebuilt" in n]


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_wheel_is_reproducible_from_its_commit(smoke, tmp_path, monkeypatch):
    """Two builds of the same commit and prebuilt dir, from two copies in two
    folders, with the two frontends (pip wheel, python -m build), through
    ci/wheels.sh's path with SOURCE_DATE_EPOCH unset: the same sha256, every
    file stamped with the commit's time. A plain build in a git checkout
    stamps its files with that checkout's commit time (setup.py), and so
    gets another sha256."""
    import time

    from ci import release
    from ci.stages import source_date_epoch

    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    epoch = source_date_epoch(ROOT)
    assert epoch and epoch == subprocess.run(["git", "-C", ROOT, "log", "-1", "--format=%ct"], capture_output=True,
                                             text=True).stdout.strip()
    a = release.build_wheel(smoke, tmp_path / "a" / "dist", frontend="pip")
    b = release.build_wheel(smoke, tmp_path / "b" / "elsewhere", frontend="build")
    assert a.name == b.name and _sha256(a) == _sha256(b), "two builds of one commit differ"
    t = time.gmtime(int(epoch))
    stamp = (*t[:5], t[5] // 2 * 2)  # a zip entry's time is to the even second
    with zipfile.ZipFile(a) as z:
        assert {i.date_time for i in z.infolist()} == {stamp}
    # a plain pip wheel in a git checkout of these files (nothing sets SOURCE_DATE_EPOCH): setup.py stamps
    # them with that checkout's commit time
    clone = source_tree(tmp_path / "checkout")
    when = "1767225600"  # 2026-01-01T00:00:00Z, the commit's time
    git = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@localhost", "GIT_COMMITTER_DATE": f"@{when}", "GIT_AUTHOR_DATE": f"@{when}"}
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the wheel's sources"]):
        r = run(["git", *cmd], cwd=clone, env=git)
        assert r.returncode == 0, r.stderr
    r = pip_wheel(clone, tmp_path / "checkout-dist", smoke)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (c,) = (tmp_path / "checkout-dist").glob("*.whl")
    with zipfile.ZipFile(c) as z:
        assert {i.date_time for i in z.infolist()} == {time.gmtime(int(when))[:6]}
    # the same files stamped with another time: another sha256 (the stamp is what made them differ)
    assert c.name == a.name and _sha256(c) != _sha256(a)
    print(f"wheel sha256 (commit time {epoch}): {_sha256(a)} twice")


def _broken(smoke: Path, dest: Path, how: str) -> Path:
    shutil.copytree(smoke, dest)
    a = dest / "gfx950"
    path = room(dest, "gfx950", "0.33.0") / "manifest.json"
    man = json.loads(path.read_bytes())
    key = sorted(man["entries"])[0]
    if how == "empty":
        shutil.rmtree(dest)
        dest.mkdir()
    elif how == "no_entries":
        man["entries"] = {}
        path.write_text(json.dumps(man))
    elif how == "missing_object":
        (a / man["entries"][key]["object"]).unlink()
    elif how == "orphan_object":
        (a / "objects" / ("0" * 64 + ".o")).write_bytes(b"\x7fELF stray")
    elif how == "missing_library":
        next((a / "lib").glob("*.so.xz")).unlink()
    elif how == "raw_library":  # a band replaced by its raw library, libs.json unchanged
        band = next((a / "lib").glob("*.so.xz"))
        band.write_bytes(lzma.decompress(band.read_bytes()))
    elif how == "stray_band":  # a real band no room's libs.json names
        band = next((a / "lib").glob("*.so.xz"))
        shutil.copyfile(band, a / "lib" / "libdsv41_stray.0123456789ab.so.xz")
    elif how == "other_vllm":  # the 0.33.0 room's keys say they were built from vLLM 0.32.0
        for e in man["entries"].values():
            e["source"] = dict(e["source"], vllm_version="0.32.0")
        path.write_text(json.dumps(man))
    elif how == "other_digest":  # the 0.32.0 room built from sources that are not 0.32.0's (consistently)
        p32 = room(dest, "gfx950", "0.32.0") / "manifest.json"
        m32 = json.loads(p32.read_bytes())
        for e in m32["entries"].values():
            e["source"] = dict(e["source"], mono_sources="0123456789abcdef")
        m32["mono_sources"] = "0123456789abcdef"
        p32.write_text(json.dumps(m32))
    elif how == "unknown_release":  # a room of a release neither dsv41-aot nor the matrix knows
        shutil.copytree(room(dest, "gfx950", "0.32.0"), a / "vllm-0.31.0")
    elif how == "other_band":  # N1: 0.32.0's libs.json names 0.33.0's s01-08 band, its real sha256 and sizes
        docs = {r: json.loads((room(dest, "gfx950", r) / "libs.json").read_bytes()) for r in ("0.32.0", "0.33.0")}
        mine, theirs = ([lib for lib in docs[r]["libraries"] if lib["chunk"].endswith("_s01-08")][0]
                        for r in ("0.32.0", "0.33.0"))
        mine.update({f: theirs[f] for f in ("file", "sha256", "bytes", "raw_sha256", "raw_bytes")})
        (room(dest, "gfx950", "0.32.0") / "libs.json").write_text(json.dumps(docs["0.32.0"]))
    elif how == "unlinked":
        (room(dest, "gfx950", "0.33.0") / "libs.json").unlink()
    elif how == "mixed_source":  # one entry from other sources (what a write of mixed entries records)
        e = man["entries"][key]
        e["source"] = dict(e["source"], mono_sources="0123456789abcdef")
        man["mono_sources"] = None
        path.write_text(json.dumps(man))
    return dest


REFUSALS = {
    "empty": "no prebuilt kernels in",
    "raw_library": "does not match the sha256",
    "stray_band": "libdsv41_stray.0123456789ab.so.xz is named by no room's libs.json",
    "other_vllm": "room gfx950/vllm-0.33.0: its keys were built from vLLM 0.32.0, not 0.33.0",
    "other_digest": "room gfx950/vllm-0.32.0: built from mono sources '0123456789abcdef', but vLLM 0.32.0's are",
    "unknown_release": "vllm-0.31.0 is a release this dsv41-aot does not know (it knows 0.32.0, 0.33.0)",
    "no_entries": "has no entries",
    "missing_object": "is missing",
    "orphan_object": "a stored object no room's manifest names",
    "missing_library": "is missing",
    "unlinked": "vllm-0.33.0/libs.json is missing: the objects of",
    "mixed_source": "mixes 2 source identities",
    "other_band": "was not linked from the objects libs.json names",
}
# the room each refusal must name (the wheel holds several rooms of an arch)
NAMES_ROOM = {"other_band": "gfx950/vllm-0.32.0", "other_vllm": "gfx950/vllm-0.33.0", "other_digest": "gfx950/vllm-0.32.0",
              "mixed_source": "gfx950/vllm-0.33.0", "unlinked": "gfx950/vllm-0.33.0", "no_entries": "gfx950/vllm-0.33.0"}


@pytest.mark.parametrize("how", sorted(REFUSALS))
def test_wheel_build_refuses_a_bad_prebuilt_dir(smoke, tmp_path, how):
    bad = _broken(smoke, tmp_path / "bad", how)
    src = source_tree(tmp_path / "src")
    r = pip_wheel(src, tmp_path / "dist", bad)
    text = r.stdout + r.stderr
    assert r.returncode != 0
    assert REFUSALS[how] in text, text[-2000:]
    assert NAMES_ROOM.get(how, "") in text
    assert str(bad) in text and "fix: " in text and "dsv41-aot " in text
    assert not list((tmp_path / "dist").glob("*.whl")) if (tmp_path / "dist").exists() else True


# ---------------------------------------------------------------- wheels judged as pip judges them


def _rewritten(wheel: Path, dest: Path, change=None, extra: dict | None = None, drop=()) -> Path:
    """A copy of ``wheel`` under its own name in ``dest``: each member's bytes
    through ``change(name, data)`` (RECORD left as it was), the members
    ending in one of ``drop`` left out, then the ``extra`` members added."""
    dest.mkdir()
    out = dest / wheel.name
    with zipfile.ZipFile(wheel) as z, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as w:
        for info in z.infolist():
            if info.filename.endswith(tuple(drop)) and drop:
                continue
            data = z.read(info)
            w.writestr(info, change(info.filename, data) if change else data)
        for name, data in (extra or {}).items():
            w.writestr(name, data)
    return out


def _offline(wheel: Path) -> list:
    """(exit code, output) of the offline checks a user and the release run."""
    return [(r.returncode, r.stdout + r.stderr) for r in (
        run([PY, "-m", "dsv41_aot.cli", "verify", "--wheel", wheel]),
        run([PY, "ci/check_wheel.py", "--no-auditwheel", wheel]))]


def test_a_key_linked_from_another_object_fails_both_wheel_checks(wheel, tmp_path):
    """A room's libs.json in the wheel links a key from another key's object
    (a well-formed sha256, the band's own sha256s intact): the key is linked,
    but not from its own object, and both checks say so."""
    from dsv41_aot.aot.wheel import judge

    member = "dsv41_aot/kernels_prebuilt/gfx950/vllm-0.33.0/libs.json"

    def relink(name, data):
        if name != member:
            return data
        doc = json.loads(data)
        (a, sha_a), (b, sha_b) = sorted(doc["libraries"][0]["entries"].items())[:2]
        doc["libraries"][0]["entries"][a] = sha_b
        relink.key = a
        return json.dumps(doc).encode()

    bad = _rewritten(wheel, tmp_path / "bad", relink)
    want = f"{relink.key} (vLLM 0.33.0): not linked from its object"
    assert any(want in p for p in check_wheel.check(bad, auditwheel=False)["problems"])
    assert any(want in p for p in judge(bad)["problems"])


@pytest.mark.parametrize("name", ["../escaped", "dsv41_aot/kernels_prebuilt/gfx950/lib/../../../../../escaped",
                                  "/tmp/dsv41-escaped"])
def test_a_member_outside_the_install_tree_is_refused_as_pip_refuses_it(wheel, tmp_path, name):
    bad = _rewritten(wheel, tmp_path / "bad", extra={name: b"x"})
    r = run([PY, "-m", "pip", "install", "--no-deps", "--no-index", "--target", tmp_path / "site", bad])
    assert r.returncode != 0 and "outside the target directory" in r.stdout + r.stderr, r.stdout + r.stderr
    assert not Path("/tmp/dsv41-escaped").exists()
    for code, out in _offline(bad):
        assert code == 1 and name in out and "outside the install tree" in out and "Traceback" not in out, out


@pytest.mark.parametrize("how", ["empty", "truncated", "not a zip", "damaged member"])
def test_a_file_that_is_not_a_sound_zip_is_bad_input(wheel, tmp_path, how):
    bad = tmp_path / wheel.name
    data = wheel.read_bytes()
    if how == "damaged member":  # the zip's directory intact, one band's compressed bytes flipped
        with zipfile.ZipFile(wheel) as z:
            info = next(i for i in z.infolist() if i.filename.endswith(".so.xz"))
        at = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + info.compress_size // 2
        data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]
    bad.write_bytes({"empty": b"", "truncated": data[: len(data) // 2], "not a zip": b"not a wheel\n"}.get(how, data))
    for code, out in _offline(bad):
        assert code == 2 and str(bad) in out and "not a sound zip" in out and "Traceback" not in out, out


# ---------------------------------------------------------------- one judge: every gate refuses the same wheels


def _gates(wheel: Path, prebuilt: Path) -> dict:
    """(exit code, output) of each wheel gate: the user's, the script's, and the pre-upload stage's."""
    return {name: (r.returncode, r.stdout + r.stderr) for name, r in (
        ("verify --wheel", run([PY, "-m", "dsv41_aot.cli", "verify", "--wheel", wheel])),
        ("check_wheel.py --prebuilt", run([PY, "ci/check_wheel.py", "--no-auditwheel", "--prebuilt", prebuilt, wheel])),
        ("release.py checkwheel", run([PY, "ci/release.py", "checkwheel", "--prebuilt", prebuilt, "--require-proofs",
                                       wheel.parent])))}


@pytest.mark.faults
def test_a_room_of_an_unknown_release_skips_no_check(wheel, smoke, tmp_path):
    """P2 of the fault report at 24a0152: a foreign room's manifest ({}) used
    to make the script and the pre-upload stage skip every later check. Now
    each gate refuses the wheel and names the foreign room, the stray band,
    the stray file, and the members RECORD does not list."""
    pkg = "dsv41_aot/kernels_prebuilt/gfx950/"
    band = next(n for n in zipfile.ZipFile(wheel).namelist() if n.startswith(pkg + "lib/") and n.endswith(".so.xz"))
    stray_band = pkg + "lib/libdsv41_gfx950_tp4_s09-16.0123456789abcdef.so.xz"

    bad = _rewritten(wheel, tmp_path / "bad", extra={
        pkg + "vllm-0.34.0/manifest.json": b"{}", stray_band: zipfile.ZipFile(wheel).read(band),
        pkg + "lib/notes.txt": b"notes\n"})
    for gate, (code, out) in _gates(bad, smoke).items():
        assert code == 1, (gate, out)
        assert "vllm-0.34.0" in out and "a release this dsv41-aot does not know" in out, (gate, out)
        assert stray_band in out and "lib/notes.txt" in out, (gate, out)
        assert "is not in" in out and "RECORD" in out, (gate, out)


@pytest.mark.faults
@pytest.mark.parametrize("how", ["no RECORD", "edited module", "added module", "stray file in lib", "raw library",
                                 "timings"])
def test_what_pip_or_record_would_show_is_refused_by_every_gate(wheel, smoke, tmp_path, how):
    """P6 of the fault report at 24a0152: RECORD checked as pip checks it,
    and stray files refused by verify --wheel as by the other gates."""
    pkg = "dsv41_aot/kernels_prebuilt/gfx950/"
    drop, change, extra, want = (), None, {}, None
    if how == "no RECORD":
        drop, want = (".dist-info/RECORD",), "pip refuses to install a wheel without one"
    elif how == "edited module":
        change = lambda n, d: d + b"\n# edited\n" if n == "dsv41_aot/runtime/bands.py" else d  # noqa: E731
        want = "dsv41_aot/runtime/bands.py differs from its"
    elif how == "added module":
        extra, want = {"dsv41_aot/evil.py": b"print(1)\n"}, "dsv41_aot/evil.py is not in"
    elif how == "stray file in lib":
        extra, want = {pkg + "lib/extra.txt": b"x"}, pkg + "lib/extra.txt"
    elif how == "raw library":
        extra, want = {pkg + "lib/libx.so": b"\x7fELF"}, pkg + "lib/libx.so"
    else:
        extra, want = {pkg + "vllm-0.33.0/timings.json": b"{}"}, pkg + "vllm-0.33.0/timings.json"
    bad = _rewritten(wheel, tmp_path / "bad", change, extra=extra, drop=drop)
    if how == "no RECORD":
        r = run([PY, "-m", "pip", "install", "--no-deps", "--no-index", "--target", tmp_path / "site", bad])
        assert r.returncode != 0 and "RECORD" in r.stdout + r.stderr
    for gate, (code, out) in _gates(bad, smoke).items():
        assert code == 1 and want in out and "Traceback" not in out, (gate, out)
