"""The call ABI of a launch symbol: slot C types and their compiled layout.

``Abi`` compiles one slot list once into a struct layout, each slot's
offset in it, the ``void*`` array type and the entry's C prototype.
"""

from __future__ import annotations

import ctypes
import struct

from ..errors import ManifestError

# slot ctype -> struct code (the export metadata's C types; "pointer" is the stream)
CODES = {
    "int64": "q", "uint64": "Q", "int32": "i", "uint32": "I", "int16": "h", "uint16": "H",
    "int8": "b", "uint8": "B", "bool": "?", "float": "f", "double": "d", "pointer": "Q",
}


class Abi:
    """One ABI (slot list) compiled once, to pack integers straight into a buffer."""

    def __init__(self, slots: list, aid: str):
        if not isinstance(slots, list) or not all(isinstance(s, dict) for s in slots):
            raise ManifestError(f"ABI {aid}: not a list of slots")
        if not slots or slots[-1].get("name") != "stream" or slots[-1].get("ctype") != "pointer":
            raise ManifestError(f"ABI {aid} {slots[-1:] if slots else '[]'} does not end with the stream slot")
        fmt, offsets, pos = "<", [], 0
        for slot in slots:
            code, size = CODES.get(slot.get("ctype")), slot.get("size")
            if code is None or struct.calcsize("<" + code) != size:
                raise ManifestError(f"ABI {aid} slot {slot} has an unknown C type or size")
            pad = -pos % size
            fmt += "x" * pad + code
            offsets.append(pos + pad)
            pos += pad + size
        self.id = aid
        self.slots = slots
        self.names = [s["name"] for s in slots[:-1]]
        # what the library's export metadata must say, slot by slot
        self.signature = [(s["name"], s["ctype"], s["size"]) for s in slots]
        self.struct = struct.Struct(fmt)
        self.offsets = offsets
        self.argv_type = ctypes.c_void_p * len(slots)
        self.proto = ctypes.PYFUNCTYPE(ctypes.c_int32, self.argv_type)
