"""A build under another FlyDSL (or linker) than the one a room's keys were
built with: which keys moved toolchain only, and the judgement that keeps a
stored object when the new toolchain compiles the same GPU code object.

The exported object records the FlyDSL version in its metadata, so its
bytes (and every band's sha256) change with the toolchain even where the
GPU code does not. What a room serves is the GPU code object; a key whose
entry differs from the build's source identity only in the toolchain parts
is compiled once under the new toolchain (or proven under it beforehand by
``verify --against-jit --record``) and keeps its stored object, entry and
bands when that code object is the same; only keys whose code object
changed are rebuilt (docs/building.md, "Moving to another FlyDSL")."""

from __future__ import annotations

from ..errors import IntegrityError, ManifestError
from ..proof import PROVEN

# source identity parts whose effect on what is served the GPU code object judges
TOOLCHAIN = ("flydsl_version", "linker")


def served(ident: dict) -> dict:
    """The source identity without its toolchain parts: what must be equal
    for two entries to serve code of the same vLLM source."""
    return {k: v for k, v in (ident or {}).items() if k not in TOOLCHAIN}


def moved(m, key, ident: dict) -> bool:
    """Whether ``key``'s entry in manifest ``m`` differs from ``ident`` only
    in its toolchain parts, with its stored object intact and whole."""
    e = m.entries.get(str(key))
    if e is None or e.source == ident or served(e.source) != served(ident) or type(e.export_bytes) is not int:
        return False
    try:
        m.check_object(str(key))
    except IntegrityError:
        return False
    return True


def proven_under(room, entry, flydsl: str) -> bool:
    """Whether the room's verified.json holds a PROVEN proof of ``entry``'s
    code object made under FlyDSL ``flydsl`` (an unreadable record: no)."""
    try:
        proofs = room.proof().all()
    except ManifestError:
        return False
    return any(p.key == entry.key and p.flydsl == flydsl and p.verdict(entry) == PROVEN for p in proofs)


def same_code(old, new) -> bool:
    """Whether ``new`` (an Entry, or a worker's JSON of one) holds the GPU
    code object of the stored entry ``old``."""
    doc = new if isinstance(new, dict) else new.to_dict()
    return doc.get("code_object_sha256") == old.code_object_sha256 and doc.get("code_object_bytes") == old.code_object_bytes
