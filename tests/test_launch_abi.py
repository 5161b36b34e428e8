"""Launch-ABI fidelity for ABIs no release exports yet: every integer handed
to a Launcher arrives, at its own width and sign, in the slot the C entry
reads it from, when slots are narrower than 8 bytes.

The real ABIs are launched through the real exported host code and checked
byte for byte against the code objects' own metadata, every key of both
full deployments and every smoke key, in tests/test_every_key_launched.py
(the recording HIP). Those ABIs have every int32 slot followed by an int64
one, so every slot starts at 8 * i and a loader stepping slot pointers 8
bytes (MUTATIONS.md M07) hands the same pointers: it is caught only here,
on a *narrowed* ABI (a real one with its int64 slots rewritten to 1-, 2- and
4-byte C types, as a new FlyDSL or vLLM could export; hosted by the gfx942
keys of the smoke build). No code object takes such arguments, so the
key's stored object is swapped for a gcc-built stub that carries the real
object's own ``__kernels_binary`` and the narrowed ``__metadata`` (the
build's ``describe_object`` derives its manifest entry and ABI, the loader's
ABI check passes) and whose ``int ENTRY(void **args)``, generated from that
ABI, copies the value behind each ``args[i]``, read at the slot's C type,
into an exported ``int64_t ENTRY__seen[]``. The stubs are linked into bands
by the real ``link``, bound by ``load_key`` and called through
``Launcher.__call__``; only the device is mocked (MOCK-GPU).
"""

from __future__ import annotations

import ctypes
import json
import subprocess

import pytest
from _smoke import SMOKE_RELEASE_KEYS, copy_of, room

from dsv41_aot import elf
from dsv41_aot.aot.compiler import describe_object
from dsv41_aot.aot.link import link_dir
from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.keys import BuildKey
from dsv41_aot.manifest import atomic_write
from dsv41_aot.room import Room

# the cases: (release, key, narrowed), one per kind
CASES = [(NEWEST, k, True) for k in sorted(SMOKE_RELEASE_KEYS[NEWEST]) if "@gfx942:" in k]
# the C type the stub reads each slot as ("pointer" is the stream), and its ctypes twin
C_TYPES = {"int64": ("int64_t", ctypes.c_int64), "uint64": ("uint64_t", ctypes.c_uint64),
           "int32": ("int32_t", ctypes.c_int32), "uint32": ("uint32_t", ctypes.c_uint32),
           "int16": ("int16_t", ctypes.c_int16), "uint16": ("uint16_t", ctypes.c_uint16),
           "int8": ("int8_t", ctypes.c_int8), "uint8": ("uint8_t", ctypes.c_uint8),
           "pointer": ("uintptr_t", ctypes.c_void_p)}
# what a narrowed ABI's int64 slots become, in turn (int64 kept among them: padding before it)
NARROW = ("int32", "int16", "uint8", "int64", "int8", "uint16", "uint32", "int64", "int32", "int32")


def test_the_cases_are_one_narrowed_abi_of_each_kind():
    assert sorted(BuildKey.parse(k, NEWEST).kind for _, k, _ in CASES) == ["ffn", "k1", "k2"]


def narrowed(meta: dict) -> dict:
    """The export metadata ``meta`` with its int64 slots rewritten by NARROW."""
    abi, n = [], 0
    for slot in meta["abi"]:
        if slot["ctype"] == "int64":
            ctype, n = NARROW[n % len(NARROW)], n + 1
            size = ctypes.sizeof(C_TYPES[ctype][1])
            slot = dict(slot, ctype=ctype, size=size, alignment=size)
        abi.append(slot)
    return dict(meta, abi=abi)


def value(i: int, ctype: str, size: int) -> int:
    """The distinct value slot ``i`` is sent: int64 beyond 32 bits, alternating
    in sign; narrower signed types negative (high bits set), unsigned near
    their maximum; the stream a pointer-like handle."""
    bits = 8 * size
    if ctype == "pointer":
        return 0x7FFE_0000_0000 + i
    if ctype.startswith("uint"):
        return (1 << bits) - 2 - i
    if bits == 64:
        return (-1) ** i * (((i + 1) << 33) + i + 1)
    return -(1 << (bits - 2)) - i


def stub_source(entry: str, slots: list, meta_file, code_file) -> str:
    """C source of a stub export object: the real entry's symbols, its
    metadata and code object as data (.incbin), and an entry that records
    what each ``args[i]`` points at, read as slot i's C type."""
    n = len(slots)
    lines = ["#include <stdint.h>", f"int64_t {entry}__seen[{n}];", f"int {entry}__calls;", "static int loaded;"]
    # the metadata a C string (the loader reads it up to its NUL), the code object exactly its bytes
    for sym, path, bind, tail in (("__metadata", meta_file, ".globl", "\\n.byte 0"),
                                  ("__kernels_binary", code_file, ".local", "")):
        name = entry + sym
        lines.append(f'__asm__(".pushsection .rodata\\n{bind} {name}\\n.type {name}, @object\\n.p2align 4\\n'
                     f'{name}:\\n.incbin \\"{path}\\"{tail}\\n.size {name}, .-{name}\\n.popsection\\n");')
    lines += [f"int {entry}__module_init(void) {{ return 0; }}",
              f"int {entry}__module_load(int device) {{ (void)device; loaded = 1; return 0; }}",
              f"int {entry}__module_unload(void) {{ loaded = 0; return 0; }}",
              f"int {entry}(void **args) {{",
              "    if (!loaded) return -2; /* FLYDSL_AOT_ERR_NOT_LOADED */"]
    for i, s in enumerate(slots):
        t = C_TYPES[s["ctype"]][0]
        lines.append(f"    {{ _Static_assert(sizeof({t}) == {s['size']}, \"slot {i}\"); {t} v; "
                     f"__builtin_memcpy(&v, args[{i}], sizeof v); {entry}__seen[{i}] = (int64_t)v; }}")
    lines += [f"    {entry}__calls += 1;", "    return 0;", "}"]
    return "\n".join(lines) + "\n"


def put_stub(root, release: str, key: str, narrow: bool, work) -> None:
    """Replace ``key``'s stored object by its stub, and its manifest entry by
    the one the build derives from the stub (describe_object)."""
    bk = BuildKey.parse(key, release)
    man = Room(root, bk.arch, release).manifest()
    old = man.entries[key]
    meta_bytes, code = elf.exported_parts(man.object_path(key).read_bytes(), bk.entry)
    meta = json.loads(meta_bytes)
    assert meta["symbol"] == bk.entry and meta["abi"][-1]["ctype"] == "pointer"
    if narrow:
        meta_bytes = json.dumps(narrowed(meta), sort_keys=True, separators=(",", ":")).encode()
    meta_file, code_file = work / "metadata.json", work / "code.hsaco"
    meta_file.write_bytes(meta_bytes)
    code_file.write_bytes(code)
    slots = json.loads(meta_bytes)["abi"]
    c, o = work / "stub.c", work / "stub.o"
    c.write_text(stub_source(bk.entry, slots, meta_file, code_file))
    subprocess.run(["gcc", "-c", "-O2", "-fPIC", "-Wall", "-Werror", "-o", str(o), str(c)], check=True)
    data = o.read_bytes()
    entry, abi = describe_object(bk, data, old.source)
    new, was = entry.to_dict(), old.to_dict()
    changed = sorted(f for f in new if new[f] != was[f])
    # only what names the object changes, and the ABI's id where the stub's ABI is narrowed
    assert changed == ["abi"] * narrow + ["bytes", "object", "sha256"], changed
    assert [(s["name"], s["ctype"], s["size"]) for s in abi] == [(s["arg_name"], s["ctype"], s["size"]) for s in slots]
    assert (abi == man.abi(key)) is not narrow
    atomic_write(root / bk.arch / entry.object, data)
    man.put({**was, **new}, abi)
    man.write()


@pytest.fixture(scope="module")
def stubbed(smoke_dir, tmp_path_factory):
    """A copy of the smoke build whose case keys hold stubs, relinked by the real link."""
    root = copy_of(smoke_dir, tmp_path_factory.mktemp("abi") / "prebuilt")
    for release, key, narrow in CASES:
        put_stub(root, release, key, narrow, tmp_path_factory.mktemp("stub"))
    summary = link_dir(root)
    assert sum(s["linked"] for s in summary) >= 1  # the gfx942 room with the stubs got a new band
    for release, key, _ in CASES:
        bk = BuildKey.parse(key, release)
        libs = json.loads((room(root, bk.arch, release) / "libs.json").read_text())
        want = Room(root, bk.arch, release).manifest().entries[key].sha256
        assert [lib["entries"][key] for lib in libs["libraries"] if key in lib["entries"]] == [want]
    return root


@pytest.mark.parametrize("release,key,narrow", CASES,
                         ids=[f"{r}-{k.partition('@')[0]}{'-narrowed' if n else ''}" for r, k, n in CASES])
def test_every_value_arrives_in_every_slot(stubbed, fresh, monkeypatch, release, key, narrow):
    from dsv41_aot.runtime import hip, state

    bk = BuildKey.parse(key, release)
    monkeypatch.setenv(fresh.ENV_ALLOW_SOURCE, "1")  # the installed vLLM is one release; both are launched here
    # MOCK-GPU: device 0, of the key's arch, not capturing; the stub's own
    # __module_init / __module_load (no device work) are called for real
    monkeypatch.setattr(state.current(), "archs", {0: bk.arch})
    monkeypatch.setattr(hip.Hip, "current_device", lambda self: (0, 0))
    monkeypatch.setattr(hip.Hip, "stream_capturing", lambda self, stream, what="": False)

    launcher = fresh.load_key(key, release=release, prebuilt=stubbed)
    slots = launcher.abi
    # the slots' C struct layout (ctypes', not the loader's): 8 bytes apart in
    # the real ABIs, not in the narrowed ones
    layout = type("Slots", (ctypes.Structure,), {"_fields_": [(f"s{i}", C_TYPES[s["ctype"]][1])
                                                              for i, s in enumerate(slots)]})
    offsets = [getattr(layout, f"s{i}").offset for i in range(len(slots))]
    assert (offsets == [8 * i for i in range(len(slots))]) is not narrow
    sent = [value(i, s["ctype"], s["size"]) for i, s in enumerate(slots)]
    if not narrow:
        assert any(s["ctype"] == "int32" for s in slots) and any(v < -(1 << 32) for v in sent)
    launcher(*sent[:-1], stream=sent[-1])

    lib = launcher._lib
    assert ctypes.c_int.in_dll(lib, bk.entry + "__calls").value == 1
    seen = list((ctypes.c_int64 * len(slots)).in_dll(lib, bk.entry + "__seen"))
    wrong = [(i, s["name"], s["ctype"], v, got) for i, (s, v, got) in enumerate(zip(slots, sent, seen))
             if ctypes.c_int64(v).value != got]
    assert not wrong, f"{key} (vLLM {release}): {len(wrong)} of {len(slots)} slots wrong (slot, name, ctype, " \
                      f"sent, entry read): {wrong[:6]}"
    # a second call, other values: the thread's buffer is repacked, not stale
    again = [v // 3 if s["ctype"] != "pointer" else v + 1 for s, v in zip(slots, sent)]
    launcher(*again[:-1], stream=again[-1])
    seen = list((ctypes.c_int64 * len(slots)).in_dll(lib, bk.entry + "__seen"))
    assert [ctypes.c_int64(v).value for v in again] == seen
