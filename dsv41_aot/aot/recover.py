"""Rebuild a room's corrupt manifest.json from its arch's stored objects.

The corrupt file is set aside first. Each object carries what its entry
says: its C entry point names the key (``dsv41_<kind>_<arch>_s4_tp4_r1`` is
``<kind>@<arch>:s=4,tp=4,r=1``), its export metadata the ABI and arch, its
code object the kernel and figures, its file name the sha256. An object is
recovered only when it passes a fresh compile's checks
(``compiler.describe_object``), is the only object for its key, is named
by no other release's manifest, and holds the kernel this release names
(``kernel_symbol``). Any other key is compiled again.

An object does not carry its source identity, so recovered entries take
the recovering build's (once the FlyDSL version matches). Nor does it carry
``export_bytes``, so the build does not count a recovered entry up to date
(``buildroom.up_to_date``): the cache or a compile writes the clean entry,
and a recovered manifest ends byte-identical to a clean build's.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from pathlib import Path

from .. import elf
from ..errors import AotError, ManifestError, message_of
from ..keys import BuildKey
from ..manifest import OBJECTS, Entry, Manifest, SourceIdentity, read_timings

_ENTRY_RE = re.compile(r"dsv41_([a-z0-9]+)_(gfx[0-9a-f]+)_([a-z]+[0-9]+(?:_[a-z]+[0-9]+)*)")


def key_of_entry(entry: str, release: str) -> BuildKey:
    """The key of vLLM ``release`` whose C entry point is ``entry``."""
    m = _ENTRY_RE.fullmatch(entry)
    if not m:
        raise AotError(f"{entry!r} is not a dsv41-aot entry point name")
    fields = ",".join(re.sub(r"^([a-z]+)([0-9]+)$", r"\1=\2", part) for part in m[3].split("_"))
    text = f"{m[1]}@{m[2]}:{fields}"
    key = BuildKey.parse(text, release)
    if key.entry != entry:
        raise AotError(f"{entry!r} names {key}, whose entry point is {key.entry}")
    return key


def entry_of_object(path: Path, arch: str, identity: SourceIdentity, release: str) -> tuple["Entry", list]:
    """Re-derive (manifest entry, ABI) from one stored object.

    Raises AotError, ElfError or ValueError saying why it cannot."""
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != path.stem:
        raise AotError(f"{path.name}: content does not match its sha256 name (corrupt)")
    names = {s.name for s in elf.Elf(data).symbols()}
    entries = sorted(n[: -len("__metadata")] for n in names if n.startswith("dsv41_") and n.endswith("__metadata"))
    if len(entries) != 1:
        raise AotError(f"{path.name}: exports {len(entries)} dsv41 entry points, expected 1")
    key = key_of_entry(entries[0], release)
    if key.arch != arch:
        raise AotError(f"{path.name}: holds {key}, not a {arch} key")
    from .compiler import describe_object  # it refuses an export another FlyDSL made

    return describe_object(key, data, identity)


def recovered(e: Entry) -> bool:
    """Whether an entry is one recovered from its object: it lacks ``export_bytes``, FlyDSL's unstripped size."""
    return type(e.export_bytes) is not int


def set_aside(path: Path) -> Path:
    """Rename a corrupt file out of the way (never over an earlier one)."""
    for n in itertools.count():
        aside = path.with_name(f"{path.name}.corrupt" + (f"-{n}" if n else ""))
        if not aside.exists():
            os.replace(path, aside)
            return aside


def recover(room, identity: SourceIdentity) -> tuple[Manifest, dict]:
    """Set ``room``'s corrupt manifest aside and write one rebuilt from its arch's objects.

    Returns the manifest and {"arch", "release", "set_aside", "recovered",
    "skipped": [why, ...]}."""
    from ..room import Room
    from ..listing import built_releases

    aside = set_aside(room.manifest_path)
    others: set = set()  # objects another release's (readable) manifest names
    for other in built_releases(room.arch_dir):
        if other != room.release:
            try:
                others |= {e.object for e in Room(room.root, room.arch, other).manifest().entries.values()}
            except ManifestError:
                pass
    found: dict = {}
    skipped = []
    for path in sorted(room.objects.glob("*.o")) if room.objects.is_dir() else []:
        if f"{OBJECTS}/{path.name}" in others:
            continue
        try:
            entry, abi = entry_of_object(path, room.arch, identity, room.release)
        except (AotError, elf.ElfError, ValueError, KeyError, OSError) as e:
            skipped.append(f"{path.name}: {message_of(e)}")
            continue
        found.setdefault(entry.key, []).append((entry, abi))
    man = Manifest(room.arch_dir, room.arch, timings=read_timings(room.dir), release=room.release)
    for key, cands in sorted(found.items()):
        if len(cands) > 1:
            skipped.append(f"{key}: {len(cands)} objects hold it and none is known to be current")
            continue
        man.put(*cands[0])
    man.write()
    return man, {"arch": room.arch, "release": room.release, "set_aside": str(aside), "recovered": len(man.entries),
                 "skipped": skipped}
