"""The wheel gate: checks that each arch folder of a prebuilt dir can ship.

``check_arch`` lists the files a wheel carries (each room's records, the
bands some libs.json names, the stored objects) and refuses, naming the
folder, room or key and the fix command:

- a missing or empty arch folder, or a room with no entries;
- a room of a release the build matrix does not build;
- a room its own verdict (``verdict.problems``) finds unsound, or a key
  whose entry does not describe its code (``integrity.key_problems``);
- a room whose mono sources digest is not its release's in
  build_matrix.yaml (no installed vLLM of that release could match it);
- whatever the arch folder's verdict (``listing.folder_problems``) finds:
  a room of a release dsv41-aot does not know, objects or bands no room names.

Used by setup.py (every kernels wheel build), ci/wheels.sh and the CI
workflow. PyYAML, tomllib and packaging are imported where they are used:
cibuildwheel's repair step imports this module without them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dsv41_aot import commands, verdict  # noqa: E402
from dsv41_aot.errors import AotError, ManifestError  # noqa: E402
from dsv41_aot.aot.integrity import key_problems  # noqa: E402
from dsv41_aot.aot.jit import VERIFIED  # noqa: E402
from dsv41_aot.facts.releases import deployed_arches, version_order  # noqa: E402
from dsv41_aot.manifest import LIB, LIBS_JSON, MANIFEST, folder_name  # noqa: E402
from dsv41_aot.room import Room  # noqa: E402
from dsv41_aot.listing import built_arches, folder_problems, rooms_in, rooms_of  # noqa: E402


@dataclass
class ArchContents:
    """What one checked arch folder holds, as a wheel will carry it."""

    arch: str
    dir: Path
    rooms: list = field(default_factory=list)  # [room.Room], each checked, oldest release first
    files: list = field(default_factory=list)  # paths relative to the arch folder


def fix_for(root: Path, arch, release: str | None = None) -> str:
    """The commands that build and link ``arch`` (one name or several) into ``root``."""
    words = [w for a in ([arch] if isinstance(arch, str) else arch) for w in ("--arch", a)]
    return f"{commands.build(root, release=release, options=words)} && {commands.relink(root, arch=arch)}"


def refuse(problems: list, root: Path, where: str = "") -> None:
    """Raise the first of ``problems`` (``verdict.Problem``) as its own error, counting the rest, with every fix."""
    if problems:
        more = f" (and {len(problems) - 1} more: dsv41-aot verify --dir {root})" if len(problems) > 1 else ""
        raise type(problems[0].error())(f"{where}{problems[0].message}{more}",
                                        fix=" && ".join(dict.fromkeys(p.fix for p in problems)))


def matrix_digests(matrix_path=None) -> dict:
    """Map each release to its mono sources digest in build_matrix.yaml."""
    from dsv41_aot.aot import matrix

    return matrix.load(matrix_path).releases


def _check_room(root: Path, arch: str, release: str, digests: dict) -> Room:
    """Check one room: its own verdict, then the build matrix's digest; return it.

    The verdict (``verdict.problems``) allows no problem, serving or builder's.
    """
    fix = fix_for(root, arch, release)
    room = Room(root, arch, release)
    if release not in digests:
        raise ManifestError(f"{room.dir}: vLLM {release} is not a release of the build matrix "
                            f"({', '.join(sorted(digests, key=version_order))}): refusing to ship keys no build serves",
                            fix=f"add vLLM {release} to build_matrix.yaml's releases, or remove {room.dir}")
    man = room.manifest()
    if not man.entries:
        raise ManifestError(f"{man.path} has no entries: refusing to build a wheel with an empty room {room.name}",
                            fix=fix)
    refuse(verdict.problems(room), root, f"room {room.name}: ")  # what the loader refuses, missing or altered objects
    refuse(key_problems(room), root, f"room {room.name}: ")  # each entry against its code, as verify judges it
    source = next(iter(man.entries.values())).source  # one identity: problems() found no "sources" problem
    digest = man.mono_sources
    if digest != digests[release]:
        raise ManifestError(f"room {room.name}: built from mono sources {digest!r}, but vLLM {release}'s are "
                            f"{digests[release]!r} (build_matrix.yaml): no vLLM {release} install could use it",
                            fix=f"rebuild the room from vLLM {release}'s own tree (dsv41-aot fetch-vllm {release}): {fix}")
    if source.vllm_version != release:
        raise ManifestError(f"room {room.name}: its keys were built from vLLM {source.vllm_version}, "
                            f"not {release}", fix=fix)
    return room


def check_arch(root: Path, arch: str, digests: dict | None = None) -> ArchContents:
    """Check every room of ``root/arch`` and list the files a wheel takes from it.

    The files are relative to the arch folder, objects last. ``digests``
    maps a release to its mono sources digest (default: build_matrix.yaml's).
    """
    root = Path(root).resolve()
    adir = root / arch
    digests = matrix_digests() if digests is None else digests
    fix = fix_for(root, arch)
    releases = [r.release for r in rooms_of(adir) if r.known]  # one without manifest.json too: refused, not skipped
    if not releases:
        have = [d.name for d in built_arches(root)]
        where = f"it holds {', '.join(have)}" if have else "it holds no built arch"
        raise ManifestError(f"no prebuilt kernels for {arch} in {root} (no {adir}/vllm-<release>/{MANIFEST}; {where})",
                            fix=fix)
    out = ArchContents(arch=arch, dir=adir)
    for release in releases:
        out.rooms.append(_check_room(root, arch, release, digests))
        folder = folder_name(release)
        out.files += [f"{folder}/{MANIFEST}", f"{folder}/{LIBS_JSON}"]
        if (adir / folder / VERIFIED).is_file():
            out.files.append(f"{folder}/{VERIFIED}")  # the proof against vLLM's JIT; the loader ignores it

    refuse(folder_problems(adir, root), root)  # what no room names: a foreign room, an orphan object, a stray band
    out.files += [f"{LIB}/{name}" for name in sorted({b.file for r in out.rooms for b in r.links().bands})]
    out.files += sorted({e.object for r in out.rooms for e in r.manifest().entries.values()})
    return out


def check_dir(root: Path, arches=None) -> list:
    """Run check_arch on every arch folder of ``root`` (or on ``arches``)."""
    root = Path(root)
    arches = list(arches or sorted({r.arch for r in rooms_in(root)}))
    if not arches:  # the fix builds every arch some release runs on
        raise ManifestError(f"no prebuilt kernels in {root} (no <arch>/vllm-<release>/{MANIFEST})",
                            fix=fix_for(root, deployed_arches()))
    digests = matrix_digests()  # loaded once for every arch
    return [check_arch(root, a, digests) for a in arches]


def vllm_extra(pyproject: str) -> str:
    """The version range of pyproject.toml's ``vllm`` extra: the vLLM releases a wheel serves."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the build-system requirements install tomli there
        import tomli as tomllib
    from packaging.requirements import InvalidRequirement, Requirement

    fix = 'add vllm = ["vllm>=X,<Y"] under [project.optional-dependencies] in pyproject.toml'
    try:
        extra = tomllib.loads(pyproject).get("project", {}).get("optional-dependencies", {}).get("vllm", [])
        reqs = [Requirement(r) for r in extra]
    except (tomllib.TOMLDecodeError, InvalidRequirement) as e:
        raise ManifestError(f"pyproject.toml: the vllm extra cannot be read: {e}", fix=fix) from None
    specs = [r.specifier for r in reqs if r.name == "vllm"]
    if len(specs) != 1 or not str(specs[0]):
        raise ManifestError("pyproject.toml has no vllm extra with a version range: a kernels wheel must say "
                            "which vLLM releases it serves", fix=fix)
    return str(specs[0])


def main(argv=None) -> int:
    """Check a prebuilt dir's arches (default: all): ``python ci/prebuilt.py DIR [ARCH ...]``."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("arch", nargs="*")
    args = ap.parse_args(argv)
    try:
        for c in check_dir(Path(args.dir), args.arch):
            for r in c.rooms:
                man = r.manifest()
                print(f"{r.name}: {len(man.entries)} keys, vLLM {r.release} (mono sources {man.mono_sources}): ok")
            print(f"{c.arch}: {len(c.files)} files to ship")
    except AotError as e:
        print(f"ci/prebuilt.py: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
