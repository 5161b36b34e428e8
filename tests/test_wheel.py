"""Kernels wheels: built per arch from a real smoke build, checked (tag,
metadata, auditwheel), installed into a fresh venv with no FlyDSL, torch or
vLLM, and every key loaded there through the loader; bad prebuilt dirs are
refused by the wheel build itself.

The GPU is the only thing absent: loading resolves each key's library against
Debian's libamdhip64 (ROCm 5.2) and returns Launchers; a launch then fails
with a HIP error, which the test expects.
"""

from __future__ import annotations

import json
import os
import re
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

from _smoke import smoke_count, smoke_dir  # noqa: E402

PY = sys.executable
ARCHES = ("gfx950", "gfx942")

pytestmark = pytest.mark.slow


def run(cmd, cwd=ROOT, env=None, **kw):
    full = dict(os.environ, **(env or {}))
    for var in ("DSV41_AOT_ARCH", "DSV41_AOT_PREBUILT", "DSV41_AOT_WHEEL_OBJECTS", "PYTHONPATH"):
        if var not in (env or {}):
            full.pop(var, None)
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=full, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, **kw)


def pip_wheel(src: Path, out: Path, arch: str | None, prebuilt: Path | None, isolated: bool = True):
    env = {}
    if arch:
        env["DSV41_AOT_ARCH"] = arch
    if prebuilt:
        env["DSV41_AOT_PREBUILT"] = str(prebuilt)
    cmd = [PY, "-m", "pip", "wheel", "--no-deps", "-w", out, "."]
    if not isolated:
        cmd.insert(4, "--no-build-isolation")
    return run(cmd, cwd=src, env=env)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The session's smoke build, built for real and linked."""
    return smoke_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def wheels(smoke, tmp_path_factory):
    """arch -> wheel: gfx950 through `pip wheel`, gfx942 through `python -m build --wheel`."""
    tmp = tmp_path_factory.mktemp("wheels")
    src = source_tree(tmp / "src")
    out = {}
    r = pip_wheel(src, tmp / "dist", "gfx950", smoke)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = run([PY, "-m", "build", "--wheel", "--outdir", tmp / "dist", "."], cwd=src,
            env={"DSV41_AOT_ARCH": "gfx942", "DSV41_AOT_PREBUILT": str(smoke)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for w in (tmp / "dist").glob("*.whl"):
        arch = re.search(r"\+(gfx[0-9a-f]+)\.", w.name).group(1)
        out[arch] = w
    assert sorted(out) == sorted(ARCHES)
    return out


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh venv: the standard library, pip, nothing else."""
    path = tmp_path_factory.mktemp("venv") / "v"
    r = run([PY, "-m", "venv", path])
    assert r.returncode == 0, r.stderr
    return path


def test_wheel_names_tags_and_metadata(wheels, smoke):
    for arch, w in wheels.items():
        assert w.name == f"dsv41_aot-0.1.0+{arch}.vllm0.33.0-py3-none-manylinux_2_28_x86_64.whl"
        result = check_wheel.check(w, smoke)  # includes auditwheel show
        assert result["problems"] == [], result["problems"]
        assert result["arches"] == [arch] and result["keys"] == smoke_count(arch)
        assert result["auditwheel_external"] == []  # no DT_NEEDED at all: HIP is the host's
        with zipfile.ZipFile(w) as z:
            names = z.namelist()
            meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        # only this arch, only the manifest and linked libraries (objects stay out)
        kernels = [n for n in names if "kernels_prebuilt/" in n]
        assert all(f"kernels_prebuilt/{arch}/" in n for n in kernels)
        assert not [n for n in kernels if "/objects/" in n]
        assert any(n.endswith(".so") for n in kernels)
        assert all(n.startswith("dsv41_aot") for n in names)  # platlib root, not .data/purelib
        runtime = [line for line in meta.splitlines() if line.startswith("Requires-Dist") and "extra ==" not in line]
        assert runtime == []
        assert 'Requires-Dist: flydsl==0.4.2; extra == "build"' in meta


def test_installed_wheel_loads_every_key_without_flydsl_torch_or_vllm(wheels, venv, smoke):
    # one arch per environment (one distribution, the arch in its local
    # version): installing the other arch's wheel replaces it
    for arch in ("gfx942", "gfx950"):
        r = run([venv / "bin" / "python", "-m", "pip", "install", "--no-deps", "--no-index", wheels[arch]])
        assert r.returncode == 0, r.stderr
        # ci/check_installed.py runs from outside the checkout: it imports the installed package
        r = run([venv / "bin" / "python", ROOT / "ci" / "check_installed.py", "--json"], cwd=venv)
        assert r.returncode == 0, r.stdout + r.stderr
        doc = json.loads(r.stdout)
        assert doc["installed_heavy"] == [] and doc["problems"] == []
        assert doc["package"].startswith(str(venv))
        assert list(doc["arches"]) == [arch]
        expect = json.loads((smoke / arch / "manifest.json").read_bytes())["entries"]
        got = doc["arches"][arch]["resolved"]
        assert sorted(got) == sorted(expect)
        for key, launcher in got.items():
            assert launcher["kernel"] == expect[key]["symbol"]

    # the public API, every key, then one launch: no GPU here, so a HIP error (not a crash)
    probe = (
        "import json, sys, dsv41_aot\n"
        "from dsv41_aot.errors import LaunchError\n"
        "keys = json.loads(sys.argv[1])\n"
        "ls = [dsv41_aot.load_key(k) for k in keys]\n"
        "assert [l.kernel_name for l in ls] == json.loads(sys.argv[2])\n"
        "assert not {'flydsl', 'torch', 'vllm'} & set(sys.modules)\n"
        "try:\n"
        "    ls[0](*[0] * (len(ls[0].abi) - 1), stream=0)\n"
        "except LaunchError as e:\n"
        "    print('LaunchError', e)\n"
    )
    keys = sorted(json.loads((smoke / "gfx950" / "manifest.json").read_bytes())["entries"].items())
    r = run([venv / "bin" / "python", "-c", probe, json.dumps([k for k, _ in keys]),
             json.dumps([e["symbol"] for _, e in keys])], cwd=venv)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("LaunchError") and "hip" in r.stdout.lower()


def test_no_arch_gives_a_pure_wheel_without_kernels(tmp_path):
    src = source_tree(tmp_path / "src")
    (src / "kernels_prebuilt").mkdir()  # never looked at without DSV41_AOT_ARCH
    r = pip_wheel(src, tmp_path / "dist", None, None, isolated=False)
    assert r.returncode == 0, r.stderr
    (w,) = (tmp_path / "dist").glob("*.whl")
    assert w.name == "dsv41_aot-0.1.0-py3-none-any.whl"
    assert check_wheel.check(w)["problems"] == []
    with zipfile.ZipFile(w) as z:
        assert not [n for n in z.namelist() if "kernels_prebuilt" in n]


def _broken(smoke: Path, dest: Path, how: str) -> Path:
    shutil.copytree(smoke, dest)
    a = dest / "gfx950"
    man = json.loads((a / "manifest.json").read_bytes())
    key = sorted(man["entries"])[0]
    if how == "empty":
        shutil.rmtree(dest)
        dest.mkdir()
    elif how == "no_entries":
        man["entries"] = {}
        (a / "manifest.json").write_text(json.dumps(man))
    elif how == "missing_object":
        (a / man["entries"][key]["object"]).unlink()
    elif how == "orphan_object":
        (a / "objects" / ("0" * 64 + ".o")).write_bytes(b"\x7fELF stray")
    elif how == "missing_library":
        next((a / "lib").glob("*.so")).unlink()
    elif how == "unlinked":
        shutil.rmtree(a / "lib")
    elif how == "mixed_source":
        e = man["entries"][key]
        e["source"] = dict(e["source"], mono_sources="0123456789abcdef")
        (a / "manifest.json").write_text(json.dumps(man))
    return dest


REFUSALS = {
    "empty": "no prebuilt kernels for gfx950",
    "no_entries": "has no entries",
    "missing_object": "is missing",
    "orphan_object": "no manifest entry names",
    "missing_library": "is missing",
    "unlinked": "never linked",
    "mixed_source": "mixes 2 source identities",
}


@pytest.mark.parametrize("how", sorted(REFUSALS))
def test_wheel_build_refuses_a_bad_prebuilt_dir(smoke, tmp_path, how):
    bad = _broken(smoke, tmp_path / "bad", how)
    src = source_tree(tmp_path / "src")
    r = pip_wheel(src, tmp_path / "dist", "gfx950", bad, isolated=False)
    text = r.stdout + r.stderr
    assert r.returncode != 0
    assert REFUSALS[how] in text, text[-2000:]
    assert str(bad) in text and "fix: " in text and "dsv41-aot " in text
    assert not list((tmp_path / "dist").glob("*.whl")) if (tmp_path / "dist").exists() else True
