"""The ELF reader at the edges real bands and code objects rarely reach.

Built here byte by byte (the smallest files the reader accepts), so each
edge is exact: a section that ends where the file ends, a note whose name
fills its 4-byte alignment, a GPU code object that ends where its host
library ends. An off-by-one at any of them would refuse a sound file or read
past a truncated one.
"""

from __future__ import annotations

import hashlib
import struct

import pytest

from dsv41_aot.elf import EM_AMDGPU, SHN_ABS, SHT_NOBITS, SHT_NOTE, Elf, ElfError, Symbol, embedded_code_objects

SHT_PROGBITS = 1
SHT_STRTAB = 3


def elf_file(sections: list[tuple[int, bytes]], machine: int = 62, headers_last: bool = False) -> bytes:
    """An ELF64 little-endian file of ``sections`` ((type, bytes), after the null section).

    Its section header table follows its header, so the last section ends
    where the file ends; ``headers_last`` puts the table at the end instead,
    where ld.lld writes it."""
    body = b"".join(data for _, data in sections)
    table = 64 + len(body) if headers_last else 64
    at = 64 if headers_last else 64 + 64 * (len(sections) + 1)
    heads = [bytes(64)]
    for kind, data in sections:
        heads.append(struct.pack("<IIQQQQIIQQ", 0, kind, 0, 0, at, len(data), 0, 0, 1, 0))
        at += len(data)
    ident = b"\x7fELF\x02\x01\x01" + bytes(9)
    head = ident + struct.pack("<HHIQQQIHHHHHH", 3, machine, 1, 0, 0, table, 0, 64, 0, 0, 64, len(heads), 0)
    return head + (body + b"".join(heads) if headers_last else b"".join(heads) + body)


def test_a_section_that_ends_where_the_file_ends_is_read_whole():
    data = elf_file([(SHT_PROGBITS, b"kernels!")])
    elf = Elf(data)
    assert elf.section_bytes(elf.sections[1]) == b"kernels!"
    cut = Elf(data[:-1])  # one byte short: the section runs past the end
    with pytest.raises(ElfError, match="runs past the end"):
        cut.section_bytes(cut.sections[1])


def test_a_section_that_runs_past_the_end_is_named():
    data = bytearray(elf_file([(SHT_STRTAB, b"\0.text\0"), (SHT_PROGBITS, b"kernels!")]))
    struct.pack_into("<H", data, 62, 1)  # e_shstrndx: section 1 holds the section names
    struct.pack_into("<I", data, 64 + 2 * 64, 1)  # section 2 is named ".text"
    cut = Elf(bytes(data[:-1]))
    assert [s.name for s in cut.sections[1:]] == ["", ".text"]
    with pytest.raises(ElfError, match=r"^section \.text runs past the end of the file$"):
        cut.section_bytes(cut.sections[2])


def test_a_section_header_table_that_ends_where_the_file_ends_is_read_and_a_cut_one_is_not():
    data = elf_file([(SHT_PROGBITS, b"kernels!")], headers_last=True)
    assert len(Elf(data).sections) == 2
    for cut in (data[:-1], data[:16 + 24] + bytes(8) + data[16 + 32:]):  # one byte short; no table at all
        with pytest.raises(ElfError, match="^truncated section header table$"):
            Elf(cut)


@pytest.mark.parametrize("name", [b"AMDGPU\0", b"AMDGP\0", b"AMDGPU.\0"], ids=["7 bytes", "6 bytes", "8 bytes"])
def test_notes_are_read_at_their_4_byte_alignment_whatever_their_names_length(name):
    def note(ntype: int, desc: bytes, name: bytes = name) -> bytes:
        pad = lambda b: b + bytes(-len(b) % 4)  # noqa: E731
        return struct.pack("<III", len(name), len(desc), ntype) + pad(name) + pad(desc)

    # a description of 4 bytes needs no padding; the last note, a bare 12-byte header, ends where the section does
    elf = Elf(elf_file([(SHT_NOTE, note(32, b"four") + note(33, b"second!") + note(34, b"", b""))]))
    text = name.rstrip(b"\0").decode()
    assert list(elf.notes()) == [(text, 32, b"four"), (text, 33, b"second!"), ("", 34, b"")]


def test_a_gpu_code_object_ending_where_its_library_ends_is_found_and_a_cut_one_is_not():
    code = elf_file([(SHT_PROGBITS, b"isa")], machine=EM_AMDGPU, headers_last=True)
    host = elf_file([(SHT_PROGBITS, b"host")])
    found = embedded_code_objects(host + code)
    assert found == {hashlib.sha256(code).hexdigest(): code}
    # the code object's section header table is its last part: one byte short, it is no whole code object
    assert embedded_code_objects(host + code[:-1]) == {}
    assert embedded_code_objects(host + code + code) == {hashlib.sha256(code).hexdigest(): code}


@pytest.mark.parametrize("change", [(0, b"\x7fELG"), (4, b"\x01"), (5, b"\x02")],
                         ids=["another magic", "32-bit", "big-endian"])
def test_a_file_that_is_not_elf64_little_endian_is_refused_saying_so(change):
    """The reader knows one layout: anything else is refused before a field is read, never misread."""
    at, data = change
    good = elf_file([(SHT_PROGBITS, b"kernels!")])
    assert Elf(good).sections
    with pytest.raises(ElfError, match="^not an ELF64 little-endian file$"):
        Elf(good[:at] + data + good[at + len(data):])


def test_a_nobits_section_reads_as_empty_wherever_it_claims_to_lie():
    """A section with no bytes in the file (.bss: SHT_NOBITS) reads as empty, even when its offset and size
    point past the end, where a section with bytes is refused."""
    data = bytearray(elf_file([(SHT_PROGBITS, b"kernels!")]))
    struct.pack_into("<I", data, 64 + 64 + 4, SHT_NOBITS)  # section 1's type
    struct.pack_into("<Q", data, 64 + 64 + 32, 1 << 20)  # its size: far past the end of the file
    elf = Elf(bytes(data))
    assert elf.section_bytes(elf.sections[1]) == b""


# (st_info, st_other, st_shndx, st_value) -> whether dlsym finds the symbol: glibc's rules, each row but the
# protected one checked by hand against ctypes on a gcc-built library with its .dynsym entry edited the same
# way (protected symbols are exported by the ELF gABI's definition; the library edited to protected crashed
# the process that loaded it, so that row was not run)
BINDINGS = [
    ((0x12, 0, 12, 0x1100), True),  # a global function
    ((0x22, 0, 12, 0x1100), True),  # weak
    ((0x10, 0, 12, 0x1100), True),  # no type
    ((0x11, 3, 12, 0x1100), True),  # protected
    ((0x10, 0, SHN_ABS, 0), True),  # absolute, at 0
    ((0x16, 0, 12, 0), True),  # thread-local, at offset 0 of its block
    ((0x02, 0, 12, 0x1100), False),  # local
    ((0x12, 2, 12, 0x1100), False),  # hidden
    ((0x12, 1, 12, 0x1100), False),  # internal
    ((0x13, 0, 12, 0x1100), False),  # a section symbol
    ((0x14, 0, 12, 0x1100), False),  # a file symbol
    ((0x12, 0, 12, 0), False),  # no address
    ((0x12, 0, 0, 0x1100), False),  # undefined (an executable gives some an address: their PLT slot)
]


@pytest.mark.parametrize("fields, found", BINDINGS, ids=[f"{f[0]:#x}-{f[1]}-{f[2]}-{f[3]:#x}" for f, _ in BINDINGS])
def test_a_symbol_is_exported_only_where_the_dynamic_linker_binds_it(fields, found):
    info, other, shndx, value = fields
    assert Symbol("entry", value, 16, shndx, info, other).bindable is found
