"""Is one arch folder of a prebuilt directory complete enough to ship?

A wheel carries exactly what the runtime loader opens: the arch's
``manifest.json`` and its linked ``lib/`` (``libs.json`` + the xz-compressed
library bands); the stored ``objects/`` they were linked from are checked
too. ``check_arch`` refuses, with the folder or key named and the command that
fixes it:

- an empty or missing folder (no manifest, or a manifest with no entries);
- a partial one: entries whose object is missing or altered, objects no entry
  names, a link record that is missing, stale (a key linked from another
  object) or names a missing / altered library, libraries nothing records;
- a mixed-source one: entries built from different source identities
  (vLLM mono digest and version, helpers, FlyDSL, linker), which no single
  installed vLLM can match;
- a library that needs anything from the build machine (DT_NEEDED).

Used by setup.py (every wheel build), ci/merge.py and ci/check_wheel.py.
Imports only dsv41_aot's standard-library modules: no FlyDSL, torch or vLLM.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dsv41_aot.errors import AotError, IntegrityError, ManifestError  # noqa: E402
from dsv41_aot.build.jit import VERIFIED  # noqa: E402
from dsv41_aot.build.link import dynamic_info  # noqa: E402
from dsv41_aot.manifest import LIB, LIBS_JSON, MANIFEST, OBJECTS, Manifest  # noqa: E402
from dsv41_aot.manifest import BAND_RE, LIBS_SCHEMA  # noqa: E402
from dsv41_aot.runtime.loader import read_band  # noqa: E402


@dataclass
class ArchContents:
    """What one checked arch folder holds, as a wheel will carry it."""

    arch: str
    dir: Path
    keys: list
    source: dict
    files: list = field(default_factory=list)  # paths relative to the arch folder

    @property
    def vllm_version(self) -> str:
        return str(self.source.get("vllm_version"))


def fix_for(root: Path, arch: str) -> str:
    return f"dsv41-aot build --arch {arch} --out {root} && dsv41-aot link --dir {root} --arch {arch}"


def check_arch(root: Path, arch: str) -> ArchContents:
    """Check ``root/arch`` and list the files a wheel takes from it."""
    root = Path(root).resolve()
    adir = root / arch
    fix = fix_for(root, arch)
    if not (adir / MANIFEST).is_file():
        have = sorted(p.parent.name for p in root.glob(f"*/{MANIFEST}")) if root.is_dir() else []
        where = f"it holds {', '.join(have)}" if have else "it holds no built arch"
        raise ManifestError(f"no prebuilt kernels for {arch} in {root} ({adir / MANIFEST} missing; {where})", fix=fix)
    man = Manifest.read(adir, arch)
    if not man.entries:
        raise ManifestError(f"{adir / MANIFEST} has no entries: refusing to build a wheel without kernels", fix=fix)

    for key in sorted(man.entries):
        man.check_object(key)  # missing or altered object: IntegrityError naming the key
    orphans = man.orphans()
    if orphans:
        raise IntegrityError(
            f"{adir / OBJECTS}: {len(orphans)} object(s) no manifest entry names, e.g. {orphans[0].name} "
            f"(a partial copy or an interrupted build)",
            fix=f"rebuild to clean it: {fix}",
        )

    sources = {}
    for key, e in man.entries.items():
        sources.setdefault(json.dumps(e["source"], sort_keys=True), []).append(key)
    if len(sources) > 1:
        parts = [f"{json.loads(s)} ({len(ks)} keys, e.g. {sorted(ks)[0]})" for s, ks in sorted(sources.items())]
        raise ManifestError(
            f"{adir / MANIFEST} mixes {len(sources)} source identities: " + "; ".join(parts),
            fix=f"rebuild every key from one vLLM / FlyDSL: {fix}",
        )

    libs_path = adir / LIB / LIBS_JSON
    try:
        libs = json.loads(libs_path.read_bytes())
    except FileNotFoundError:
        raise IntegrityError(f"{libs_path} is missing: the objects of {adir} were never linked",
                             fix=f"dsv41-aot link --dir {root} --arch {arch}") from None
    except ValueError as e:
        raise ManifestError(f"{libs_path}: malformed JSON ({e})", fix=f"dsv41-aot link --dir {root} --arch {arch}") from None
    relink = f"dsv41-aot link --dir {root} --arch {arch}"
    if libs.get("schema") != LIBS_SCHEMA:
        raise IntegrityError(f"{libs_path}: link record schema {libs.get('schema')!r}, not {LIBS_SCHEMA} "
                             f"(compressed bands): linked by an older dsv41-aot", fix=relink)
    linked: dict = {}
    files = [MANIFEST, f"{LIB}/{LIBS_JSON}"]
    for lib in libs.get("libraries", []):
        if not BAND_RE.fullmatch(str(lib["file"])):
            raise ManifestError(f"{libs_path}: library file {lib['file']!r} is not a band inside {adir / LIB}",
                                fix=relink)
        path = adir / LIB / lib["file"]
        if path.is_symlink() or not path.is_file():
            raise IntegrityError(f"{path} is missing (named by {libs_path})", fix=relink)
        raw = read_band(path, lib, fix=relink)  # compressed and raw sha256
        info = dynamic_info(raw)
        if info["needed"]:
            raise IntegrityError(f"{path} records DT_NEEDED {info['needed']}: it would tie users to this build "
                                 f"machine's libraries", fix=relink)
        for key, obj_sha in lib["entries"].items():
            linked[key] = obj_sha
        files.append(f"{LIB}/{lib['file']}")
    listed = {f.split("/", 1)[1] for f in files[1:]}
    stray = sorted(p.name for p in (adir / LIB).iterdir() if p.name not in listed and not p.name.startswith("."))
    if stray:
        raise IntegrityError(f"{adir / LIB}: {', '.join(stray[:5])} not named by {LIBS_JSON}", fix=relink)
    for key, e in sorted(man.entries.items()):
        if linked.get(key) != e["sha256"]:
            why = "is not linked" if key not in linked else "was linked from an older object"
            raise IntegrityError(f"{key} {why} ({libs_path} is older than {adir / MANIFEST})", fix=relink)
    extra = sorted(set(linked) - set(man.entries))
    if extra:
        raise IntegrityError(f"{libs_path} links keys the manifest lacks, e.g. {extra[0]}", fix=relink)

    files += sorted({e["object"] for e in man.entries.values()})
    if (adir / VERIFIED).is_file():
        files.append(VERIFIED)  # the proof against vLLM's JIT ships beside the manifest; the loader ignores it
    source = json.loads(next(iter(sources)))
    return ArchContents(arch=arch, dir=adir, keys=sorted(man.entries), source=source, files=files)


def main(argv=None) -> int:
    """``python ci/prebuilt.py DIR [ARCH ...]``: check the arches (default: all)."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("arch", nargs="*")
    args = ap.parse_args(argv)
    root = Path(args.dir)
    arches = args.arch or sorted(p.parent.name for p in root.glob(f"*/{MANIFEST}"))
    if not arches:
        print(f"ci/prebuilt.py: error: {root} holds no built arch\n  fix: {fix_for(root, 'gfx950')}", file=sys.stderr)
        return 2
    try:
        for a in arches:
            c = check_arch(root, a)
            print(f"{a}: {len(c.keys)} keys, {len(c.files)} files, vLLM {c.vllm_version}: ok")
    except AotError as e:
        print(f"ci/prebuilt.py: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
