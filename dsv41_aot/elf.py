"""The little ELF64 reading dsv41-aot needs: sections, symbols, notes, dynamic info.

An exported FlyDSL object (``export_to_c``) is an x86-64 relocatable ELF
holding ``<entry>__metadata`` (JSON: ABI slots, arch, FlyDSL version) and
``<entry>__kernels_binary`` (the GPU code object, an AMDGPU ELF whose notes
carry the kernel's resource metadata).

Shared core: standard library only.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

ELF_MAGIC = b"\x7fELF"
SHT_SYMTAB = 2
SHT_DYNAMIC = 6
SHT_NOTE = 7
SHT_NOBITS = 8
SHT_DYNSYM = 11
DT_NULL = 0
DT_NEEDED = 1
DT_SONAME = 14
EM_AMDGPU = 224  # e_machine of a GPU code object
SHN_ABS = 0xFFF1
STB_LOCAL = 0
STT_TLS = 6
# the symbol types the dynamic linker binds (NOTYPE, OBJECT, FUNC, COMMON, TLS, GNU_IFUNC), and the
# visibilities it skips (INTERNAL, HIDDEN): glibc's symbol lookup, as dlsym and so ctypes meet it
STT_BOUND = frozenset({0, 1, 2, 5, 6, 10})
STV_HIDDEN_OR_INTERNAL = frozenset({1, 2})


class ElfError(ValueError):
    """Bytes that are not the ELF64 little-endian file we expect."""


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    addr: int
    offset: int
    size: int
    link: int


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int
    size: int
    shndx: int
    info: int = 0  # st_info: binding in the high four bits, type in the low four
    other: int = 0  # st_other: visibility in the low two bits

    @property
    def bindable(self) -> bool:
        """Whether the dynamic linker binds another object's reference to it (dlsym finds it by name)."""
        kind = self.info & 0xF
        placed = self.value != 0 or self.shndx == SHN_ABS or kind == STT_TLS  # an address, or needs none
        return (self.shndx != 0 and self.info >> 4 != STB_LOCAL and kind in STT_BOUND
                and self.other & 3 not in STV_HIDDEN_OR_INTERNAL and placed)


class Elf:
    """An ELF64 little-endian file's sections, read from its bytes."""

    def __init__(self, data: bytes):
        if data[:4] != ELF_MAGIC or data[4] != 2 or data[5] != 1:
            raise ElfError("not an ELF64 little-endian file")
        self.data = data
        _, _, _, _, _, shoff, _, _, _, _, shentsize, shnum, shstrndx = struct.unpack_from("<HHIQQQIHHHHHH", data, 16)
        if shoff == 0 or shoff + shnum * shentsize > len(data):
            raise ElfError("truncated section header table")
        raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        names = raw[shstrndx]
        self.sections = [
            Section(self._str(names[4], r[0]), r[1], r[3], r[4], r[5], r[6]) for r in raw
        ]

    def _str(self, table_off: int, idx: int) -> str:
        end = self.data.index(b"\0", table_off + idx)
        return self.data[table_off + idx : end].decode()

    def section_bytes(self, s: Section) -> bytes:
        if s.type == SHT_NOBITS:
            return b""
        if s.offset + s.size > len(self.data):
            raise ElfError(f"section {s.name} runs past the end of the file")
        return self.data[s.offset : s.offset + s.size]

    def symbols(self, table: int = SHT_SYMTAB) -> list[Symbol]:
        """Every symbol of the ``table`` sections (SHT_SYMTAB or SHT_DYNSYM), the null symbol first."""
        out = []
        for s in self.sections:
            if s.type != table:
                continue
            strtab = self.sections[s.link]
            for off in range(s.offset, s.offset + s.size, 24):  # an Elf64_Sym is 24 bytes, whatever sh_entsize says
                name, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", self.data, off)
                out.append(Symbol(self._str(strtab.offset, name), value, size, shndx, info, other))
        return out

    def symbol_bytes(self, name: str) -> bytes:
        """The bytes a data symbol of a relocatable object covers."""
        for sym in self.symbols():
            if sym.name == name:
                sec = self.sections[sym.shndx]
                return self.section_bytes(sec)[sym.value : sym.value + sym.size]
        raise ElfError(f"no symbol {name}")

    def notes(self):
        """(name, type, desc) of every note in the SHT_NOTE sections."""
        for s in self.sections:
            if s.type != SHT_NOTE:
                continue
            buf, pos = self.section_bytes(s), 0
            while pos + 12 <= len(buf):
                namesz, descsz, ntype = struct.unpack_from("<III", buf, pos)
                pos += 12
                name = buf[pos : pos + namesz].rstrip(b"\0").decode(errors="replace")
                pos += (namesz + 3) & ~3
                desc = buf[pos : pos + descsz]
                pos += (descsz + 3) & ~3
                yield name, ntype, desc


def exported_parts(obj: bytes, entry: str) -> tuple[bytes, bytes]:
    """(metadata JSON bytes, GPU code object) of the export object ``obj`` of C entry ``entry``."""
    elf = Elf(obj)
    meta = elf.symbol_bytes(f"{entry}__metadata").rstrip(b"\0")
    code = elf.symbol_bytes(f"{entry}__kernels_binary")
    if code[:4] != ELF_MAGIC:
        raise ElfError(f"{entry}__kernels_binary is not an ELF code object")
    return meta, code


def dynamic_info(data: bytes, *, symbols: bool = True) -> dict:
    """A shared library's DT_NEEDED, SONAME, the dynamic symbols it leaves undefined and those it exports.

    Exported: defined, and bound by the dynamic linker (``Symbol.bindable``);
    a local or hidden one, a section or file symbol, or one without an
    address is in neither list, as dlsym does not find it. Without
    ``symbols`` the symbol table is not read (both lists stay empty).
    ElfError for bytes that are not such a library, truncated ones included."""
    out = {"needed": [], "soname": None, "undefined": [], "exported": []}
    try:
        elf = Elf(data)
        for sym in elf.symbols(SHT_DYNSYM)[1:] if symbols else ():  # one SHT_DYNSYM; its entry 0: the null symbol
            if sym.shndx == 0:
                out["undefined"].append(sym.name)
            elif sym.bindable:
                out["exported"].append(sym.name)
        for s in elf.sections:
            if s.type == SHT_DYNAMIC:
                strtab = elf.sections[s.link]
                for off in range(s.offset, s.offset + s.size, 16):
                    tag, val = struct.unpack_from("<qQ", data, off)
                    if tag == DT_NEEDED:
                        out["needed"].append(elf._str(strtab.offset, val))
                    elif tag == DT_SONAME:
                        out["soname"] = elf._str(strtab.offset, val)
                    elif tag == DT_NULL:
                        break
    except (IndexError, struct.error) as e:  # an offset past the end of the bytes
        raise ElfError(f"not a whole ELF shared library ({e})") from None
    return out


def embedded_code_objects(data: bytes) -> dict[str, bytes]:
    """The AMDGPU code objects embedded whole in a host library, by their sha256.

    A band's library holds each key's GPU code object (its
    ``__kernels_binary``) as a complete ELF in its read-only data; each one
    ends with its section header table, where ld.lld writes it."""
    head = ELF_MAGIC + b"\x02\x01\x01"  # 64-bit, little-endian, version 1
    out = {}
    at = data.find(head, 1)  # past the library's own header
    while at >= 0:
        if struct.unpack_from("<H", data, at + 18)[0] == EM_AMDGPU:
            shoff, = struct.unpack_from("<Q", data, at + 40)
            shentsize, shnum = struct.unpack_from("<HH", data, at + 58)
            end = at + shoff + shnum * shentsize
            if shoff and end <= len(data):
                image = data[at:end]
                out[hashlib.sha256(image).hexdigest()] = image
        at = data.find(head, at + 1)
    return out


def kernel_names(code: bytes) -> list[str]:
    """The kernels a GPU code object defines: its kernel descriptors (``<name>.kd``), which HIP finds by name."""
    try:
        return sorted(s.name[:-3] for s in Elf(code).symbols(SHT_DYNSYM) if s.name.endswith(".kd") and s.shndx)
    except (IndexError, struct.error) as e:  # an offset past the end of the bytes
        raise ElfError(f"not a whole GPU code object ({e})") from None
