"""The rooms (one vLLM release's keys on one arch): ``_Index``, a room's
manifest and link record read once; ``_index``, the room of a release, made
once per process; ``_no_room``, what to say when there is none; and
``release_of``, the room that serves the running vLLM.

Runtime-side module: standard library only.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from . import state
from .abi import _Abi
from .host import _ARCH_RE, ENV_ALLOW_SOURCE, ENV_ARCH, _installed_vllm, _warn_once
from ..manifest import BAND_RE, LIB, LIBS_JSON, LIBS_SCHEMA, MANIFEST, OBJECTS, Manifest, abi_id, releases_in
from ..facts.releases import NEWEST
from ..errors import ArchMismatchError, ManifestError, ReleaseMismatchError

_SHA_RE = re.compile(r"[0-9a-f]{64}")


class _Index:
    """One room's manifest and link record (the keys of one vLLM release on
    one arch), read once. Its bands are in the arch's lib/."""

    def __init__(self, root: Path, arch: str, release: str):
        self.root = root
        self.arch = arch
        self.release = release
        self.dir = root / arch
        self.manifest = Manifest.read(self.dir, arch, release=release)
        self.entries = self.manifest.entries
        self.link_cmd = f"dsv41-aot link --dir {root} --arch {arch} --release {release}"
        fix = f"link it: {self.link_cmd}" if (self.dir / OBJECTS).is_dir() else self.fix_reinstall
        path = self.manifest.room / LIBS_JSON
        self.libs_path = path
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            raise ManifestError(f"{path} is missing: the objects of {self.dir} were never linked", fix=fix) from None
        except ValueError as e:
            raise ManifestError(f"{path}: malformed JSON ({e})", fix=fix) from None
        self.libdir = self.dir / LIB
        self.lib_of: dict = {}
        try:
            if doc.get("arch") != arch or doc.get("release") != release:
                raise ManifestError(f"{path}: link record for {doc.get('arch')!r} vLLM {doc.get('release')!r} in "
                                    f"the {arch} vLLM {release} folder", fix=fix)
            if doc.get("schema") != LIBS_SCHEMA:
                raise ManifestError(f"{path}: link record schema {doc.get('schema')!r}, this loader reads "
                                    f"{LIBS_SCHEMA} (compressed bands)", fix=fix)
            for lib in doc["libraries"]:
                name = lib["file"]
                if not isinstance(name, str) or not BAND_RE.fullmatch(name):
                    raise ManifestError(f"{path}: library {lib.get('chunk')!r} names file {name!r}, not a band "
                                        f"file inside {self.libdir}", fix=fix)
                if not all(isinstance(lib[f], str) and _SHA_RE.fullmatch(lib[f]) for f in ("sha256", "raw_sha256")) \
                        or not all(type(lib[f]) is int for f in ("bytes", "raw_bytes")):
                    raise ManifestError(f"{path}: library {name}: sha256 / raw_sha256 / bytes / raw_bytes malformed",
                                        fix=fix)
                for key, obj_sha in lib["entries"].items():
                    self.lib_of[key] = (lib, obj_sha)
        except (KeyError, TypeError, AttributeError):
            raise ManifestError(f"{path}: not a dsv41-aot link record", fix=fix) from None
        self.fix_link = fix
        self.abis: dict = {}

    def abi(self, aid: str) -> _Abi:
        """The compiled ABI ``aid``, whose id must be the hash of its slots."""
        a = self.abis.get(aid)
        if a is None:
            slots = self.manifest.abis[aid]
            if abi_id(slots) != aid:
                raise ManifestError(f"{self.manifest.path}: ABI {aid} does not hash to its id ({abi_id(slots)}): "
                                    f"its slots were altered", fix=self.fix_reinstall)
            a = self.abis[aid] = _Abi(slots, aid)
        return a

    @property
    def fix_reinstall(self) -> str:
        """How to get a good copy of this arch folder: rebuild where it was
        built (objects/ present), else reinstall the wheel it came from."""
        if (self.dir / OBJECTS).is_dir():
            return (f"rebuild and relink: dsv41-aot build --arch {self.arch} --release {self.release} "
                    f"--out {self.root} && {self.link_cmd}")
        return "reinstall the kernels: pip install --force-reinstall --no-deps dsv41-aot"


def _index(root: Path, arch: str, release: str | None = None) -> _Index:
    """The room of ``release`` (default: the running vLLM's, :func:`release_of`) on ``arch``."""
    if not isinstance(arch, str) or not _ARCH_RE.fullmatch(arch):  # never a path: no "/", no ".."
        raise ManifestError(f"arch {arch!r} is not a GPU arch name (gfx...): refusing to look for it under {root}",
                            fix=f"name it like gfx950: {ENV_ARCH}=gfx950 (or arch=...)")
    folder = root / arch
    if release is None:
        release = release_of(root, arch)
    idx = state._state.indexes.get((folder, release))
    if idx is None:
        with state._state.lock:
            idx = state._state.indexes.get((folder, release))
            if idx is None:
                held = releases_in(folder)
                if release not in held:
                    _no_room(root, arch, release, held)
                idx = state._state.indexes[(folder, release)] = _Index(root, arch, release)
    return idx


def _no_room(root: Path, arch: str, release: str, held: list) -> None:
    folder = root / arch
    build = f"dsv41-aot build --arch {arch} --release {release} --out {root} && dsv41-aot link --dir {root}"
    if held:
        raise ReleaseMismatchError(
            f"{folder} holds prebuilt kernels for vLLM {', '.join(held)}, not vLLM {release}",
            fix=f"install the dsv41-aot wheel that serves vLLM {release}, or build: {build}")
    others = sorted({p.parent.parent.name for p in root.glob(f"*/vllm-*/{MANIFEST}")})
    if others:
        raise ArchMismatchError(
            f"{root} holds prebuilt kernels for {', '.join(others)}, not {arch}",
            fix=f"install the {arch} wheel, or build: dsv41-aot build --arch {arch} --out {root}",
        )
    raise ManifestError(f"no prebuilt kernels for {arch} at {folder} (no vllm-<release>/manifest.json)",
                        fix=f"build them: {build}")


def release_of(root: Path, arch: str) -> str:
    """The release whose room serves this process on ``arch``: the room whose
    manifest records the installed vLLM's mono sources digest, computed once
    (without importing vLLM); without vLLM installed, the newest room. A
    vLLM whose digest no room has is a ReleaseMismatchError, or with
    DSV41_AOT_ALLOW_SOURCE_MISMATCH=1 the room of its version (else the newest),
    with a warning."""
    folder = root / arch
    picked = state._state.picked.get(folder)
    if picked is not None:
        return picked
    held = releases_in(folder)
    if not held:
        _no_room(root, arch, NEWEST, held)
    digest, src, mono = _installed_vllm()
    if digest is None:
        pick = held[-1]
    else:
        digests, broken = {}, {}
        for release in held:
            try:
                digests[release] = Manifest.read(folder, arch, release=release).mono_sources
            except ManifestError as e:
                broken[release] = e  # a corrupt room is reported when it is the one asked for
        match = [r for r, d in digests.items() if d == digest]
        if match:
            pick = match[-1]
        elif src.version in broken:  # the running release's own room is corrupt: say so, not "no release"
            raise broken[src.version]
        else:
            have = ", ".join(f"vLLM {r} ({d})" for r, d in digests.items()) or "none readable"
            msg = (f"running vLLM {src.version} mono sources ({mono}) digest {digest} matches no prebuilt "
                   f"release in {folder}: {have}")
            fallback = src.version if src.version in held else held[-1]
            if os.environ.get(ENV_ALLOW_SOURCE) != "1":
                raise ReleaseMismatchError(
                    msg, fix=f"install one of those vLLM releases, or build this one's kernels "
                             f"(dsv41-aot build --release {src.version} ...), or run vLLM {fallback}'s kernels "
                             f"anyway with {ENV_ALLOW_SOURCE}=1")
            _warn_once(("release", digest), f"{msg}; using vLLM {fallback}'s ({ENV_ALLOW_SOURCE}=1)")
            pick = fallback
    state._state.picked[folder] = pick
    return pick
