"""A build under another FlyDSL or linker than a room's keys were built with.

A key that moved toolchain only keeps its stored object, entry and bands
when the new toolchain compiles the same GPU code object. See
docs/building.md, "Moving to another FlyDSL".
"""

from __future__ import annotations

from ..errors import ManifestError
from ..proof import PROVEN
from .integrity import check_entry
from .recover import recovered


def moved(m, key, ident) -> bool:
    """Whether ``key``'s entry differs from ``ident`` (a SourceIdentity) only in toolchain, and describes its object.

    The object's own export records the FlyDSL that made it: an entry whose
    FlyDSL was edited is not a key that moved toolchain."""
    e = m.entries.get(str(key))
    if e is None or e.source == ident or e.source.served != ident.served or recovered(e):
        return False
    return check_entry(m, str(key))[0].ok  # an entry that no longer describes its object is rebuilt, whatever its proof


def proven_under(room, entry, flydsl: str) -> bool:
    """Whether the room holds a PROVEN proof of ``entry`` made under FlyDSL ``flydsl``."""
    try:
        proofs = room.proof().all()
    except ManifestError:
        return False
    return any(p.key == entry.key and p.flydsl == flydsl and p.verdict(entry) == PROVEN for p in proofs)


def same_code(old, new) -> bool:
    """Whether ``new`` (an Entry, or a worker's JSON of one) has ``old``'s code object."""
    doc = new if isinstance(new, dict) else new.to_dict()
    return doc.get("code_object_sha256") == old.code_object_sha256 and doc.get("code_object_bytes") == old.code_object_bytes
