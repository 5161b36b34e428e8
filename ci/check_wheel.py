"""Check a built dsv41-aot wheel before it is uploaded.

    python ci/check_wheel.py WHEEL [--prebuilt DIR] [--no-auditwheel] [--json]

- tag: a kernels wheel is ``py3-none-manylinux_2_28_x86_64`` (host shared
  libraries, no Python extension), a wheel without kernels ``py3-none-any``;
- version: ``<version>+<arch>.vllm<vLLM version>`` matching what it holds;
- metadata: no runtime requirement (FlyDSL, torch and vLLM only under the
  ``build`` extra); LICENSE and NOTICE in the dist-info;
- contents: exactly one arch under dsv41_aot/kernels_prebuilt/, every manifest
  key linked into a packaged library whose sha256 is the link record's, no
  library with a DT_NEEDED; with ``--prebuilt``, the manifest and libraries
  are byte for byte the prebuilt dir's;
- ``auditwheel show``: no external shared library but libamdhip64 (the host's
  ROCm provides it; excluded on purpose, never grafted).

Exit 0 ok, 1 a check failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dsv41_aot.build.link import dynamic_info  # noqa: E402

PLAT = "manylinux_2_28_x86_64"
PKG = "dsv41_aot/kernels_prebuilt/"
HEAVY = ("flydsl", "torch", "vllm")
ALLOWED_EXTERNAL = ("libamdhip64.so",)  # prefix: any SONAME version of the host's HIP runtime


def auditwheel_externals(wheel: Path) -> tuple[list, str]:
    """(external shared libraries auditwheel show reports, its output)."""
    exe = shutil.which("auditwheel") or str(Path(sys.executable).with_name("auditwheel"))
    r = subprocess.run([exe, "show", str(wheel)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    text = r.stdout
    if r.returncode:
        raise RuntimeError(f"auditwheel show failed: {text.strip()[-800:]}")
    libs = []
    if "requires no external shared libraries" not in text:
        # "The following external shared libraries are required by the wheel: {json}"
        m = re.search(r"required by the wheel:\s*(\{.*?\})\s*(?:\n\n|$)", text, re.S)
        if m:
            libs = sorted(json.loads(m.group(1)))
        else:
            libs = ["<unparsed auditwheel output>"]
    return libs, text


def check(wheel: Path, prebuilt: Path | None = None, auditwheel: bool = True) -> dict:
    problems: list = []
    out = {"wheel": wheel.name, "bytes": wheel.stat().st_size, "problems": problems}
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        meta = email.parser.Parser().parsestr(z.read(f"{dist_info}/METADATA").decode())
        tags = [v for k, v in email.parser.Parser().parsestr(z.read(f"{dist_info}/WHEEL").decode()).items()
                if k == "Tag"]
        out.update(name=meta["Name"], version=meta["Version"], tags=tags)
        arches = sorted({n[len(PKG):].split("/")[0] for n in names if n.startswith(PKG) and n.count("/") > 2})
        out["arches"] = arches

        for req in meta.get_all("Requires-Dist") or []:
            name = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower()
            if "extra ==" not in req:
                problems.append(f"runtime requirement {req!r}: the runtime needs only the standard library")
            elif name in HEAVY and 'extra == "build"' not in req:
                problems.append(f"{req!r} outside the build extra")
        for lic in ("LICENSE", "NOTICE"):
            if not any(n.startswith(dist_info) and n.rsplit("/", 1)[-1] == lic for n in names):
                problems.append(f"{lic} missing from {dist_info}")

        if not arches:
            if tags != ["py3-none-any"]:
                problems.append(f"a wheel without kernels tagged {tags}, expected py3-none-any")
            if "+" in meta["Version"]:
                problems.append(f"a wheel without kernels has a local version {meta['Version']}")
            return out
        if len(arches) > 1:
            problems.append(f"holds {len(arches)} arches ({', '.join(arches)}): one wheel per arch")
        arch = arches[0]
        if tags != [f"py3-none-{PLAT}"]:
            problems.append(f"kernels wheel tagged {tags}, expected py3-none-{PLAT}")
        base = f"{PKG}{arch}/"
        man = json.loads(z.read(base + "manifest.json"))
        libs = json.loads(z.read(base + "lib/libs.json"))
        vllm = {e["source"]["vllm_version"] for e in man["entries"].values()}
        if len(vllm) != 1:
            problems.append(f"manifest mixes vLLM versions {sorted(vllm)}")
        local = f"{arch}.vllm{re.sub(r'[^A-Za-z0-9.]+', '.', next(iter(vllm))).strip('.').lower()}"
        if meta["Version"].split("+", 1)[-1] != local:
            problems.append(f"version {meta['Version']} does not say +{local}")
        linked = {}
        for lib in libs["libraries"]:
            path = f"{base}lib/{lib['file']}"
            if path not in names:
                problems.append(f"{path} named by libs.json is not in the wheel")
                continue
            data = z.read(path)
            if hashlib.sha256(data).hexdigest() != lib["sha256"]:
                problems.append(f"{path}: sha256 differs from libs.json")
            if dynamic_info(data)["needed"]:
                problems.append(f"{path}: DT_NEEDED {dynamic_info(data)['needed']}")
            linked.update(lib["entries"])
        for key, e in man["entries"].items():
            if linked.get(key) != e["sha256"]:
                problems.append(f"{key}: not linked from its object in the packaged libs.json")
        out["keys"] = len(man["entries"])
        out["kernel_bytes"] = sum(z.getinfo(n).file_size for n in names if n.startswith(base))
        out["kernel_compressed_bytes"] = sum(z.getinfo(n).compress_size for n in names if n.startswith(base))
        if prebuilt is not None:
            src = Path(prebuilt) / arch
            for n in names:
                if n.startswith(base) and not n.endswith("/"):
                    rel = n[len(base):]
                    if not (src / rel).is_file() or (src / rel).read_bytes() != z.read(n):
                        problems.append(f"{n} differs from {src / rel}")
    if auditwheel:
        try:
            ext, _ = auditwheel_externals(wheel)
        except RuntimeError as e:
            problems.append(str(e))
        else:
            out["auditwheel_external"] = ext
            bad = [x for x in ext if not x.startswith(ALLOWED_EXTERNAL)]
            if bad:
                problems.append(f"auditwheel: external libraries besides libamdhip64: {', '.join(bad)}")
    return out


# the files a wheel build reads (setup.py, pyproject.toml and what they pack)
SOURCE_FILES = ("pyproject.toml", "setup.py", "LICENSE", "NOTICE", "README.md", "dsv41_aot", "ci")


def source_tree(dest: Path, root: Path = Path(__file__).resolve().parents[1]) -> Path:
    """A copy of the files a wheel build reads, so that concurrent wheel
    builds never share setuptools' build/ folder."""
    dest.mkdir(parents=True)
    for name in SOURCE_FILES:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copyfile(src, dest / name)
    return dest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheels", nargs="+")
    ap.add_argument("--prebuilt", help="the prebuilt dir the wheel was built from")
    ap.add_argument("--no-auditwheel", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    results, rc = [], 0
    for w in args.wheels:
        path = Path(w)
        if not path.is_file():
            print(f"ci/check_wheel.py: error: no wheel at {path}", file=sys.stderr)
            return 2
        r = check(path, Path(args.prebuilt) if args.prebuilt else None, not args.no_auditwheel)
        results.append(r)
        rc |= bool(r["problems"])
        if not args.json:
            what = f"{r.get('keys', 0)} keys of {', '.join(r['arches'])}" if r["arches"] else "no kernels"
            print(f"{r['wheel']}: {r['bytes']} bytes, {what}: {'FAILED' if r['problems'] else 'ok'}")
            for p in r["problems"]:
                print(f"  {p}", file=sys.stderr)
    if args.json:
        print(json.dumps(results, indent=1))
    return 1 if rc else 0


if __name__ == "__main__":
    sys.exit(main())
