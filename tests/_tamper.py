"""The tamper matrix: every damage a record can take, in every artifact form (issue 47).

A tampering damages one record of a prebuilt dir (a room's manifest.json,
libs.json, verified.json, timings.json; an arch's .build-pending.json; a
band; an object; what lib/, objects/ or a room folder hold) or of a kernels
wheel (RECORD, METADATA, WHEEL, a module). None is listed by hand: the
records come from the base artifact's own layout (its rooms, their link
records' bands, their manifests' objects, the wheel's members), the fields
from walking each parsed document, and every value put in from another key,
room, release, arch or FlyDSL release of the same base (or, when none
differs, the field's own value changed by its type).

Each tampering is applied to each form that can hold it: ``built`` (a
builder's folder, objects/ present), ``shipped`` (the same without
objects/), ``wheel`` (the kernels wheel, its RECORD rewritten to match
unless RECORD itself is the record damaged) and ``installed`` (``pip
install --target`` of the wheel, changed as a tampered wheel would have
installed). tests/_tamper_readers.py holds the readers and runs a case;
tests/test_tamper_matrix.py samples the cases and bench/faults.py runs them
all. The verdict tables at the end say which disagreements are by design and
which are open defects.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import lzma
import os
import posixpath
import re
import shutil
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

FORMS = ("built", "shipped", "wheel", "installed")
KERNELS = "dsv41_aot/kernels_prebuilt/"  # the prebuilt dir inside the wheel and the installed package
HEX = re.compile(r"[0-9a-f]+")
VERSION = re.compile(r"\d+\.\d+\.\d+")


# ---------------------------------------------------------------- one form of the base, changed file by file


class Tree:
    """A prebuilt dir in one form. Paths are relative to it; ``../..`` reaches the wheel's (or site's) root.

    ``changed`` maps each member written or removed (its name in the wheel
    and in RECORD) to its new bytes, or None."""

    form: str
    record: str | None = None  # RECORD's path, for the forms that have one

    def __init__(self):
        self.changed: dict = {}

    def member(self, rel: str) -> str:
        return posixpath.normpath(KERNELS + rel)


class FolderTree(Tree):
    """A prebuilt dir on disk: a builder's folder, a shipped copy, or an installed package's."""

    def __init__(self, root: Path, form: str):
        super().__init__()
        self.root, self.form = Path(root), form
        if form == "installed":
            site = self.root.parent.parent
            self.record = os.path.relpath(next(site.glob("*.dist-info/RECORD")), self.root)

    def path(self, rel: str) -> Path:
        return Path(os.path.normpath(self.root / rel))

    def read(self, rel: str) -> bytes | None:
        p = self.path(rel)
        return p.read_bytes() if p.is_file() else None

    def is_dir(self, rel: str) -> bool:
        return self.path(rel).is_dir()

    def write(self, rel: str, data: bytes) -> None:
        p = self.path(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        self.changed[self.member(rel)] = data

    def remove(self, rel: str) -> None:
        p = self.path(rel)
        if p.is_dir():
            for f in p.rglob("*"):
                if f.is_file():
                    self.changed[self.member(os.path.relpath(f, self.root))] = None
            shutil.rmtree(p)
        else:
            p.unlink()
            self.changed[self.member(rel)] = None


class ZipTree(Tree):
    """A kernels wheel's members in memory (``members``: name -> bytes), written out by :meth:`save`."""

    form = "wheel"

    def __init__(self, members: dict, infos: dict):
        super().__init__()
        self.members, self.infos = dict(members), infos
        self.record = os.path.relpath(next(n for n in members if n.endswith(".dist-info/RECORD")), KERNELS)

    def read(self, rel: str) -> bytes | None:
        return self.members.get(self.member(rel))

    def is_dir(self, rel: str) -> bool:
        return any(n.startswith(self.member(rel) + "/") for n in self.members)

    def write(self, rel: str, data: bytes) -> None:
        self.members[self.member(rel)] = self.changed[self.member(rel)] = data

    def remove(self, rel: str) -> None:
        name = self.member(rel)
        for n in [n for n in self.members if n == name or n.startswith(name + "/")]:
            del self.members[n]
            self.changed[n] = None

    def save(self, path: Path) -> Path:
        import zipfile

        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in self.members.items():
                info = self.infos.get(name)
                if info is None:
                    info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
                    info.external_attr = 0o644 << 16
                z.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
        return path


def record_row(name: str, data: bytes) -> str:
    """A RECORD row as pip writes and checks it."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def rewrite_record(tree: Tree) -> None:
    """Make the tree's RECORD list what changed, as a wheel built from the tampered tree would."""
    if tree.record is None or not tree.changed:
        return
    own = tree.member(tree.record)
    rows = {line.split(",")[0]: line for line in tree.read(tree.record).decode().splitlines() if line}
    for name, data in tree.changed.items():
        if name == own:
            continue
        if data is None:
            rows.pop(name, None)
        else:
            rows[name] = record_row(name, data)
    rows[own] = rows.pop(own, f"{own},,")
    data = ("\n".join(rows.values()) + "\n").encode()
    tree.write(tree.record, data)


# ---------------------------------------------------------------- a tampering


@dataclass(frozen=True)
class Tampering:
    """One damage to one record, applicable to every form that holds the record.

    ``kind`` (action, record and the generic field path or source) is what
    the verdict tables name; ``name`` adds where, so every tampering has its
    own. ``key``: the key the damage is about, which a refusal must name."""

    action: str  # flip, truncate, remove, field, swap, copy, codeswap, add, stray
    record: str  # manifest.json, libs.json, verified.json, timings.json, .build-pending.json, band, object, lib,
    #              objects, foreign, roomfile, archfile, rootfile, RECORD, METADATA, WHEEL, module
    path: str  # the file (or folder) damaged, relative to the prebuilt dir
    apply: Callable = field(compare=False, repr=False)
    detail: str = ""
    key: str | None = None
    room: str | None = None  # "<arch>/vllm-<release>" of a room's record
    needs: str | None = None  # the path that must exist in a form for the damage to apply (default: ``path``)
    stale_record: bool = False  # RECORD left as it was: only RECORD's own damages
    forms: tuple = FORMS  # the forms it is tried in (those holding ``needs`` among them)

    @property
    def family(self) -> str:
        return f"{self.action} {self.record}"

    @property
    def kind(self) -> str:
        return f"{self.family} {self.detail}".strip()

    @property
    def name(self) -> str:
        return f"{self.kind} @ {self.path}"

    @property
    def arch(self) -> str | None:
        head = self.path.split("/")[0]
        return head if head.startswith("gfx") else None

    def applies(self, tree: Tree) -> bool:
        if tree.form not in self.forms:
            return False
        need = self.path if self.needs is None else self.needs
        return tree.read(need) is not None or tree.is_dir(need)

    def damage(self, tree: Tree) -> None:
        """Apply the damage, then RECORD as a wheel of the damaged tree would have it."""
        self.apply(tree)
        if not self.stale_record:
            rewrite_record(tree)


# ---------------------------------------------------------------- documents and their fields


def _dump(doc, like: bytes) -> bytes:
    """``doc`` written as the bytes ``like`` were (the writer's own format), so only the edit differs."""
    for kw in ({"indent": 1, "sort_keys": True}, {"indent": 1}, {"indent": 2, "sort_keys": True}, {}):
        text = json.dumps(doc, **kw)
        for end in ("\n", ""):
            if json.dumps(json.loads(like), **kw) + end == like.decode():
                return (text + end).encode()
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def leaves(node, path=()):
    """(path, value) of every scalar in a parsed JSON document."""
    if isinstance(node, dict):
        for k in sorted(node):
            yield from leaves(node[k], path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, path + (i,))
    else:
        yield path, node


def generic(path: tuple) -> tuple:
    """A field path with what names one key, band, ABI or release made generic: the same field of another."""
    out = []
    for i, p in enumerate(path):
        before = path[i - 1] if i else None
        if isinstance(p, str) and "@" in p:
            out.append("<key>")
        elif before == "libraries":
            out.append("<band>")
        elif before == "abis":
            out.append("<abi>")
        elif before in ("keys", "flydsl") and isinstance(p, str) and VERSION.fullmatch(p):
            out.append("<version>")
        else:
            out.append(p)
    return tuple(out)


def put(doc, path: tuple, value) -> None:
    for p in path[:-1]:
        doc = doc[p]
    doc[path[-1]] = value


def get(doc, path: tuple):
    for p in path:
        doc = doc[p]
    return doc


def changed_value(value, others: list, versions: list):
    """Another plausible value of a field: the same field's of another key, room or release, else by type."""
    same = sorted({json.dumps(v) for v in others if type(v) is type(value) and v != value})
    if same:
        return json.loads(same[0])
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        if value and len(value) <= 64 and HEX.fullmatch(value):
            return hashlib.sha256(value.encode()).hexdigest()[:len(value)]
        if VERSION.fullmatch(value):
            return next((v for v in versions if v != value), value + "1")
        return value + "x"
    return None  # null: left out


def json_path(path: tuple) -> str:
    return ".".join(map(str, path))


def _flip(path: str):
    def apply(tree):
        data = bytearray(tree.read(path))
        data[len(data) // 2] ^= 0x40
        tree.write(path, bytes(data))
    return apply


def _truncate(path: str):
    def apply(tree):
        tree.write(path, tree.read(path)[: len(tree.read(path)) // 2])
    return apply


def _remove(path: str):
    return lambda tree: tree.remove(path)


def _write(path: str, data: bytes):
    return lambda tree: tree.write(path, data)


def _edit(path: str, change: Callable):
    """Edit the JSON document at ``path`` in place with ``change(doc)``, written in its writer's format."""
    def apply(tree):
        like = tree.read(path)
        doc = json.loads(like)
        change(doc)
        tree.write(path, _dump(doc, like))
    return apply


def _all(*applies):
    def apply(tree):
        for a in applies:
            a(tree)
    return apply


def damaged_bytes(record: str, path: str, **kw) -> list[Tampering]:
    """A file's byte flip, truncation and removal."""
    return [Tampering(a, record, path, f(path), **kw) for a, f in (("flip", _flip), ("truncate", _truncate),
                                                                 ("remove", _remove))]


# ---------------------------------------------------------------- generating every tampering of a base


@dataclass
class Doc:
    """One JSON record of one room of the base: where it is and what it holds."""

    room: object  # dsv41_aot.room.Room
    name: str
    doc: dict

    @property
    def path(self) -> str:
        return f"{self.room.name}/{self.name}"


def target_keys(man) -> tuple[str, str | None]:
    """The key a room's field walk is about (its smallest code object), and another (in another band if any)."""
    entries = man.entries
    k = min(sorted(entries), key=lambda x: entries[x].code_object_bytes)
    others = [x for x in sorted(entries) if x != k]
    return k, (others[-1] if others else None)


def _about(rec: str, path: tuple, key: str, band: int | None) -> bool:
    """Whether a field of record ``rec`` is one of the room's own fields or one about ``key``."""
    top = path[0]
    if rec == "manifest.json":
        return top not in ("entries", "abis", "refused") or path[:2] == ("entries", key)
    if rec == "libs.json":
        return top != "libraries" or (path[1] == band and (path[2] != "entries" or path[3] == key))
    if rec == "verified.json":
        return top not in ("keys", "flydsl") or path[:2] == ("keys", key)
    return path == (key,)


def field_tamperings(d: Doc, key: str, pool: dict, abi: str | None, band: int | None) -> list[Tampering]:
    """Each field of ``d`` about the room or ``key`` given another value (``pool``: values by generic path)."""
    from dsv41_aot.facts.flydsl import FLYDSL
    from dsv41_aot.facts.releases import RELEASES

    out = []
    paths = [p for p, _ in leaves(d.doc) if _about(d.name, p, key, band)]
    slot = {}  # the key's ABI: its first slot and its last (the stream), named so in the kind
    if abi is not None:
        slots = d.doc["abis"][abi]
        slot = {0: "first", len(slots) - 1: "last"}
        paths += [("abis", abi, i, f) for i in sorted(slot) for f in sorted(slots[i])]
    for path in paths:
        value = get(d.doc, path)
        versions = sorted(FLYDSL) if "flydsl" in str(path[-1]) else sorted(RELEASES)
        new = changed_value(value, pool.get(generic(path), []), versions)
        if new is None:
            continue
        out.append(Tampering("field", d.name, d.path, _edit(d.path, lambda doc, p=path, v=new: put(doc, p, v)),
                             detail=json_path(generic(path[:2]) + (slot[path[2]],) + path[3:] if path[0] == "abis"
                                              else generic(path)),
                             key=key if key in path else None, room=d.room.name))
    return out


def room_tamperings(docs: dict, room, rooms: list, field_rooms: set) -> list[Tampering]:
    """Every tampering of one room's records, its key's object and its key's band."""
    man, links = room.manifest(), room.links()
    key, other = target_keys(man)
    entry = man.entries[key]
    band = links.band_of[key]
    band_at = [b.file for b in links.bands].index(band.file)
    out: list[Tampering] = []
    mine = {name: d for (r, name), d in docs.items() if r == room.name}
    pool: dict = {}
    for (r, name), d in docs.items():
        for p, v in leaves(d.doc):
            pool.setdefault((name, generic(p)), []).append(v)
    for name, d in mine.items():
        out += damaged_bytes(name, d.path, room=room.name)
        if room.name in field_rooms:
            out += field_tamperings(d, key, {g: v for (n, g), v in pool.items() if n == name},
                                    entry.abi if name == "manifest.json" else None, band_at)
        if other is not None:  # the key's part swapped with another key's
            out.append(Tampering("swap", name, d.path, _edit(d.path, _swapper(name, key, other)), key=key,
                                 detail="with another key's", room=room.name))
        for o in rooms:  # the record, and the key's part of it, copied from another room
            if o is room or (o.arch != room.arch and o.release != room.release) or (o.name, name) not in docs:
                continue
            src = docs[o.name, name]
            whence = f"from release {o.release}" if o.arch == room.arch else f"from arch {o.arch}"
            data = (Path(o.dir) / name).read_bytes()
            out.append(Tampering("copy", name, d.path, _write(d.path, data), detail=whence, room=room.name))
            theirs = key.replace(f"@{room.arch}:", f"@{o.arch}:")
            part = _part(name, src.doc, theirs)
            if part is not None:  # libs.json's part is the key's band record: every key of the band's
                out.append(Tampering("copy", name, d.path, _edit(d.path, _putter(name, key, part)),
                                     detail=f"the key's part {whence}", key=None if name == "libs.json" else key,
                                     room=room.name))
    obj = f"{room.arch}/{entry.object}"
    out += damaged_bytes("object", obj, key=key, room=room.name)
    if other is not None:
        out.append(Tampering("swap", "object", obj, _write(obj, man.object_path(other).read_bytes()), key=key,
                             detail="with another key's", room=room.name))
    bpath = f"{room.arch}/lib/{band.file}"
    out += damaged_bytes("band", bpath, room=room.name)
    theirs = [b for b in links.bands if b.file != band.file]
    if theirs:
        out.append(Tampering("swap", "band", bpath, _write(bpath, room.lib.joinpath(theirs[0].file).read_bytes()),
                             detail="with another band's", room=room.name))
    for o in rooms:  # the band (and the key's object) of the same chunk in another room
        ob = next((b for b in o.links().bands if b.chunk.split("_")[2:] == band.chunk.split("_")[2:]), None)
        if o is room or ob is None or ob.file == band.file:
            continue
        whence = f"from release {o.release}" if o.arch == room.arch else f"from arch {o.arch}"
        out.append(Tampering("copy", "band", bpath, _write(bpath, o.lib.joinpath(ob.file).read_bytes()),
                             detail=whence, room=room.name))
        theirs_e = o.manifest().entries.get(key) if o.arch == room.arch else None
        if theirs_e is not None and theirs_e.sha256 != entry.sha256:
            out.append(Tampering("copy", "object", obj, _write(obj, o.manifest().object_path(key).read_bytes()),
                                 detail=whence, key=key, room=room.name))
    out += [codeswap(room, key, rename) for rename in (False, True)]
    out.append(codeswap(room, key, rename=True, garble=True))
    return out


def _part(name: str, doc: dict, key: str):
    """The part of a record about ``key`` (an entry, a proof, the band record linking it), or None."""
    if name == "manifest.json":
        return doc["entries"].get(key)
    if name == "verified.json":
        return doc["keys"].get(key)
    if name == "timings.json":
        return doc.get(key)
    band = next((b for b in doc["libraries"] if key in b["entries"]), None)
    return None if band is None else {f: v for f, v in band.items() if f not in ("chunk", "entries")}


def _putter(name: str, key: str, part):
    def change(doc):
        if name == "manifest.json":
            doc["entries"][key] = part
        elif name == "verified.json":
            doc["keys"][key] = part
        elif name == "timings.json":
            doc[key] = part
        else:
            next(b for b in doc["libraries"] if key in b["entries"]).update(part)
    return change


def _swapper(name: str, a: str, b: str):
    def change(doc):
        if name == "libs.json":
            ba = next(x for x in doc["libraries"] if a in x["entries"])
            bb = next(x for x in doc["libraries"] if b in x["entries"])
            ba["entries"][a], bb["entries"][b] = bb["entries"][b], ba["entries"][a]
            return
        table = {"manifest.json": doc.get("entries"), "verified.json": doc.get("keys")}.get(name, doc)
        table[a], table[b] = table[b], table[a]
    return change


def donor(room, key: str) -> bytes:
    """A GPU code object of another key of ``room``'s arch, as many bytes as ``key``'s (S8 of the fault report).

    From a shared full deployment when one is here; else ``key``'s own with
    its kernel's name changed in its last digit (as long: another key's name)."""
    from _smoke import DEPLOYMENTS
    from dsv41_aot.elf import embedded_code_objects
    from dsv41_aot.room import Room

    entry = room.manifest().entries[key]
    for name, (arch, var, default, shipped) in sorted(DEPLOYMENTS.items()):
        d = Path(os.environ.get(var) or default)
        for release in shipped if arch == room.arch else ():
            r = Room(d, arch, release)
            if not r.libs_path.is_file():
                continue
            band_of = r.links().band_of
            for k, e in sorted(r.manifest().entries.items()):
                if e.code_object_bytes == entry.code_object_bytes and e.symbol != entry.symbol and k in band_of:
                    return embedded_code_objects(r.read_band(band_of[k]))[e.code_object_sha256]
    own = embedded_code_objects(room.read_band(room.links().band_of[key]))[entry.code_object_sha256]
    at = max(i for i, c in enumerate(entry.symbol) if c.isdigit())
    renamed = entry.symbol[:at] + str((int(entry.symbol[at]) + 1) % 10) + entry.symbol[at + 1:]
    return own.replace(entry.symbol.encode(), renamed.encode())


def garbled(code: bytes) -> bytes:
    """``code`` with its dynamic symbol table's offset past its end: found whole in its band, its kernels unreadable."""
    from dsv41_aot.elf import SHT_DYNSYM

    shoff, = struct.unpack_from("<Q", code, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", code, 0x3A)
    at = next(shoff + i * shentsize for i in range(shnum)
              if struct.unpack_from("<I", code, shoff + i * shentsize + 4)[0] == SHT_DYNSYM)
    return code[:at + 24] + struct.pack("<Q", len(code) + 4096) + code[at + 32:]  # its sh_offset


def codeswap(room, key: str, rename: bool, garble: bool = False) -> Tampering:
    """In ``key``'s band, its GPU code object replaced by another key's of the same size, every digest updated:
    the band's sha256s and size in libs.json, the key's code_object_sha256 in manifest.json and verified.json,
    and with ``rename`` the band's file name (its content hash). The stored object stays the key's own.

    With ``garble`` the replacement is the key's own code object, :func:`garbled`."""
    from dsv41_aot.aot.link import compress_band
    from dsv41_aot.elf import embedded_code_objects

    entry, band = room.manifest().entries[key], room.links().band_of[key]
    code = garbled(embedded_code_objects(room.read_band(band))[entry.code_object_sha256]) if garble \
        else donor(room, key)
    sha = hashlib.sha256(code).hexdigest()
    bpath, rel = f"{room.arch}/lib/{band.file}", room.name

    def apply(tree):
        raw = lzma.decompress(tree.read(bpath))
        old = embedded_code_objects(raw)[entry.code_object_sha256]
        raw = raw.replace(old, code)
        xz = compress_band(raw)
        digest = hashlib.sha256(xz).hexdigest()
        name = f"{band.chunk}.{digest[:16]}.so.xz" if rename else band.file
        if rename:
            tree.remove(bpath)
        tree.write(f"{room.arch}/lib/{name}", xz)

        def relink(doc):
            b = next(b for b in doc["libraries"] if b["file"] == band.file)
            b.update(file=name, sha256=digest, bytes=len(xz), raw_sha256=hashlib.sha256(raw).hexdigest())
        _edit(f"{rel}/libs.json", relink)(tree)
        _edit(f"{rel}/manifest.json", lambda doc: doc["entries"][key].update(code_object_sha256=sha))(tree)
        if tree.read(f"{rel}/verified.json") is not None:
            _edit(f"{rel}/verified.json", lambda doc: doc["keys"][key].update(code_object_sha256=sha))(tree)
    what = "every digest and the band's name updated" if rename else "every digest updated, the band's name kept"
    whose = "its own, symbol table past its end" if garble else "another key"
    return Tampering("codeswap", "band", bpath, apply, detail=f"code object of {whose}, {what}", key=key, room=rel)


def arch_tamperings(base: Path, arch: str, rooms: list) -> list[Tampering]:
    """What an arch folder can hold besides its rooms' records: strays, a foreign room, a stopped build's record."""
    from dsv41_aot import pending
    from dsv41_aot.facts.releases import version_order
    from dsv41_aot.manifest import folder_name

    newest = max(rooms, key=lambda r: version_order(r.release))
    key, _ = target_keys(newest.manifest())
    band = f"{arch}/lib/{newest.links().band_of[key].file}"
    obj = f"{arch}/{newest.manifest().entries[key].object}"
    raw = lambda rel: (base / rel).read_bytes()  # noqa: E731
    chunk = band.rsplit("/", 1)[1].split(".")[0]
    out = [
        Tampering("stray", "lib", f"{arch}/lib/notes.txt", _write(f"{arch}/lib/notes.txt", b"notes\n"),
                  detail="file", needs=f"{arch}/lib"),
        Tampering("stray", "lib", f"{arch}/lib/subdir", _write(f"{arch}/lib/subdir/x", b"x\n"), detail="folder",
                  needs=f"{arch}/lib"),
        Tampering("stray", "lib", f"{arch}/lib/.hidden", _write(f"{arch}/lib/.hidden", b"x\n"), detail="dot-file",
                  needs=f"{arch}/lib"),
        Tampering("stray", "lib", f"{arch}/lib/{chunk}.{'0' * 16}.so.xz",
                  _write(f"{arch}/lib/{chunk}.{'0' * 16}.so.xz", raw(band)), detail="band", needs=f"{arch}/lib"),
        Tampering("stray", "lib", f"{arch}/lib/{chunk}.so", _write(f"{arch}/lib/{chunk}.so",
                                                                     lzma.decompress(raw(band))),
                  detail="raw library", needs=f"{arch}/lib"),
        Tampering("stray", "objects", f"{arch}/objects/{'0' * 64}.o",
                  _write(f"{arch}/objects/{'0' * 64}.o", raw(obj)), detail="object", needs=f"{arch}/objects"),
        Tampering("add", "object", obj, _write(obj, raw(obj)), detail="shipped", needs=f"{arch}/lib",
                  forms=("wheel",)),
        Tampering("stray", "archfile", f"{arch}/notes.txt", _write(f"{arch}/notes.txt", b"notes\n"), needs=arch),
        Tampering("stray", "roomfile", f"{newest.name}/notes.txt", _write(f"{newest.name}/notes.txt", b"notes\n"),
                  needs=newest.name, room=newest.name),
        Tampering("stray", "roomfile", f"{newest.name}/.manifest.json.k2x9.tmp",
                  _write(f"{newest.name}/.manifest.json.k2x9.tmp", raw(f"{newest.name}/manifest.json")),
                  detail="a killed write's temporary file", needs=newest.name, room=newest.name),
    ]
    foreign = f"{arch}/{folder_name('9.9.9')}"
    copies = [_write(f"{foreign}/{p.name}", p.read_bytes()) for p in sorted(newest.dir.iterdir())
              if p.name != "timings.json"]
    out.append(Tampering("stray", "foreign", foreign, _all(*copies), detail="room of an unknown release (a copy)",
                         needs=arch))
    for r in rooms:  # what a build writes and a wheel never ships, shipped
        if (r.dir / "timings.json").is_file():
            t = f"{r.name}/timings.json"
            out.append(Tampering("add", "timings.json", t, _write(t, raw(t)), detail="shipped", needs=r.name,
                                 room=r.name, forms=("wheel", "installed")))
    # the record a stopped build leaves: as written, then damaged
    path = f"{arch}/{pending.PENDING}"
    doc = {"version": pending.VERSION, "options": ["--no-cache"],
           "keys": {r.release: sorted(r.manifest().entries) for r in rooms}}
    written = (json.dumps(doc, indent=1) + "\n").encode()
    out.append(Tampering("add", pending.PENDING, path, _write(path, written), detail="as a stopped build writes it",
                         needs=arch))
    for a, f in (("flip", _flip), ("truncate", _truncate)):
        out.append(Tampering(a, pending.PENDING, path, _all(_write(path, written), f(path)), needs=arch))
    versions = sorted({r.release for r in rooms}) + ["0.99.0"]
    pool: dict = {}
    for p, v in leaves(doc):
        pool.setdefault(generic(p), []).append(v)
    keys = [k for r in rooms for k in r.manifest().entries] + [k.replace(f"@{arch}:", "@gfx942:" if arch != "gfx942"
                                                                          else "@gfx950:") for k in [key]]
    pool[("keys", "<version>", 0)] = keys
    for p, v in leaves(doc):
        new = changed_value(v, pool.get(generic(p), []), versions)
        edited = json.loads(json.dumps(doc))
        put(edited, p, new)
        data = (json.dumps(edited, indent=1) + "\n").encode()
        out.append(Tampering("field", pending.PENDING, path, _write(path, data), detail=json_path(generic(p)),
                             needs=arch))
    return out


def _header_fields(text: str) -> list[tuple[str, int]]:
    """(name, line) of the first line of each header of an email-style file (METADATA, WHEEL)."""
    seen, out = set(), []
    for i, line in enumerate(text.split("\n")):
        if not line:
            break
        name = line.split(":", 1)[0]
        if ":" in line and name not in seen:
            seen.add(name)
            out.append((name, i))
    return out


def wheel_tamperings(members: dict) -> list[Tampering]:
    """The wheel's own records (RECORD, METADATA, WHEEL) and a module, damaged."""
    info = next(n for n in members if n.endswith(".dist-info/RECORD")).rsplit("/", 1)[0]
    rel = lambda name: os.path.relpath(name, KERNELS)  # noqa: E731
    out: list[Tampering] = []
    record = f"{info}/RECORD"
    out += damaged_bytes("RECORD", rel(record), stale_record=True)
    rows = [line.split(",") for line in members[record].decode().splitlines() if line]
    kernels = next(r for r in rows if r[0].startswith(KERNELS) and r[0].endswith("manifest.json"))
    module = next(r for r in rows if r[0].endswith("runtime/bands.py"))
    for row in (kernels, module):
        for col, what in ((1, "hash"), (2, "size")):
            alt = module[1] if col == 1 and row is kernels else kernels[1] if col == 1 else str(int(row[2]) + 1)
            line = ",".join(row)
            new = ",".join(row[:col] + [alt] + row[col + 1:])
            out.append(Tampering("field", "RECORD", rel(record), _replace(rel(record), line, new),
                                 detail=f"{'kernels' if row is kernels else 'module'} row {what}", stale_record=True))
        out.append(Tampering("field", "RECORD", rel(record), _replace(rel(record), ",".join(row) + "\n", ""),
                             detail=f"{'kernels' if row is kernels else 'module'} row removed", stale_record=True))
    for name in ("METADATA", "WHEEL"):
        path = rel(f"{info}/{name}")
        out += damaged_bytes(name, path)
        text = members[f"{info}/{name}"].decode()
        lines = text.split("\n")
        for header, i in _header_fields(text):
            value = lines[i].split(":", 1)[1].strip()
            others = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(header + ":")]
            new = changed_value(value, others, ["0.1.1"])
            out.append(Tampering("field", name, path, _replace(path, lines[i] + "\n", f"{header}: {new}\n"),
                                 detail=header))
    mod = rel(module[0])
    out += [Tampering("flip", "module", mod, _flip(mod), detail="RECORD rewritten"),
            Tampering("flip", "module", mod, _flip(mod), detail="RECORD stale", stale_record=True),
            Tampering("remove", "module", mod, _remove(mod), detail="RECORD rewritten"),
            Tampering("add", "module", rel("dsv41_aot/evil.py"), _write(rel("dsv41_aot/evil.py"), b"print(1)\n"),
                      detail="RECORD rewritten", needs=rel("dsv41_aot"))]
    return [replace(t, forms=("wheel",)) for t in out]


def _replace(path: str, old: str, new: str):
    def apply(tree):
        tree.write(path, tree.read(path).decode().replace(old, new, 1).encode())
    return apply


RECORDS = ("manifest.json", "libs.json", "verified.json", "timings.json")  # a room's records


def generate(base: Path, members: dict, field_rooms=None) -> list[Tampering]:
    """Every tampering of the built prebuilt dir ``base`` and of its wheel (``members``: name -> bytes).

    Fields are walked in ``field_rooms`` (room names; default every room)."""
    from dsv41_aot.listing import built_rooms

    rooms = built_rooms(base)
    field_rooms = {r.name for r in rooms} if field_rooms is None else set(field_rooms)
    docs = {(r.name, name): Doc(r, name, json.loads((r.dir / name).read_bytes()))
            for r in rooms for name in RECORDS if (r.dir / name).is_file()}
    out = [t for r in rooms for t in room_tamperings(docs, r, rooms, field_rooms)]
    for arch in sorted({r.arch for r in rooms}):
        out += arch_tamperings(base, arch, [r for r in rooms if r.arch == arch])
    out.append(Tampering("stray", "rootfile", "notes.txt", _write("notes.txt", b"notes\n"), needs="."))
    out += wheel_tamperings(members)
    unique = {t.name: t for t in reversed(out)}
    return sorted(unique.values(), key=lambda t: t.name)


# ---------------------------------------------------------------- one verdict per case, and its exceptions

# Each pattern (fnmatch) is matched against "<kind> @<form>". BY_DESIGN: the
# readers whose verdict on such a case is not counted, and why; the others
# must still agree. Only what a reader's purpose makes it read differently
# belongs here.
PROOFS_COUNTED = ("verify --dir, the gate and doctor count proofs (a stale or missing one is a warning, an "
                  "unreadable verified.json verify's and the gate's failure; the loader never reads it); only the "
                  "release gates (verify --wheel, check_wheel --require-proofs, merge --require-verified) require "
                  "a proof of every key")
NOT_SERVED = ("the loader launches each key through its band's own compiled-in entry and never reads objects/: an "
              "entry's descriptive fields (object, sizes, kind, fields, resources) are builder records, compared "
              "with the object by verify, build and link")
BY_DESIGN = {
    "* verified.json*": ({"verify --dir", "gate", "doctor"}, PROOFS_COUNTED),
    "stray foreign *": ({"verify --dir", "doctor", "loader"},
                        "a room of a release this dsv41-aot does not know is a newer version's: kept, never judged "
                        "or served (verify warns); only the wheel gates refuse to ship it"),
    "stray objects *": ({"verify --dir"}, "an object no manifest names is an interrupted build's: verify warns (the "
                                          "next build removes it), the gate refuses to ship it"),
    "stray lib file *": ({"link"}, "link removes only bands no room names; verify and the gate name other files"),
    "stray lib folder *": ({"link"}, "link removes only bands no room names; verify and the gate name other files"),
    "field libs.json hip *": ({"link"}, "libs.json's hip field is a note for people that no reader judges; link "
                                        "writes the record whole"),
    "field manifest.json entries.<key>.bytes *": ({"doctor", "loader"}, NOT_SERVED),
    "field manifest.json entries.<key>.object *": ({"doctor", "loader"}, NOT_SERVED),
    "field manifest.json entries.<key>.fields.* @*": ({"doctor", "loader"}, NOT_SERVED),
    "field manifest.json entries.<key>.kind *": ({"doctor", "loader"}, NOT_SERVED),
    "field manifest.json entries.<key>.resources.* @*": ({"doctor", "loader"}, NOT_SERVED),
    "field manifest.json entries.<key>.code_object_bytes *": ({"doctor", "loader"}, NOT_SERVED),
    "field manifest.json entries.<key>.source.flydsl_version @built": (
        {"doctor", "loader"}, NOT_SERVED + "; the FlyDSL that compiled it is not part of the identity they serve "
                                           "(SourceIdentity.served), but an export records it"),
    "field manifest.json entries.<key>.abi *": ({"link"}, "link refuses only entries that do not describe their "
                                                          "object; an ABI its kernargs disagree with stays verify's"),
    "field manifest.json entries.<key>.source.* @built": ({"build", "link"},
                                                          "a build rebuilds any key its own source identity did not "
                                                          "write; link links what the manifest names"),
    "remove manifest.json *": ({"link"}, "link links the rooms that hold a manifest; verify names the room"),
}

# Disagreements and unnamed refusals of defects still open, by defect id: the
# lead removes an entry once its fix has merged (bench/faults.py names the
# entries no case needs any more). "unnamed <reader> <kind> @<form>" patterns
# excuse only a refusal that does not name the file or key.
KNOWN_OPEN: dict = {}
DEFECTS = {  # the defects this matrix found (issue 47), beside the fault report's Q1-Q15; each fixed, as said
    "T1": "the gate and merge never compared a manifest entry with its object (fields, kind, symbol, resources, "
          "code object size, ABI, FlyDSL); fixed: both ask integrity.key_problems, verify's judgement of each key",
    "T2": "an entry naming another key's entry point passed the gate, doctor and verify of a shipped room; fixed: "
          "Manifest.parse requires each entry's own C entry point (manifest.entry_name)",
    "T3": "merge compared the full SourceIdentity, refusing entries that differ only in linker; fixed: it compares "
          "SourceIdentity.served, as every other reader",
    "T4": "the loader served a room whose entries mix source identities; fixed: RoomIndex asks verdict.problems "
          "(its bands aside) and refuses the keys it names",
    "T5": "a room whose manifest.json is gone was passed over by the gate and merge, and doctor, the loader and the "
          "wheel judge named no missing manifest; fixed: both list every known room folder, the loader raises the "
          "room's verdict, the wheel judge names the room folder without a manifest",
    "T6": "the loader never asked the verdict on the band it binds (each key's code object and kernel); fixed: "
          "bands.open_library runs verdict.band_problems on the bytes it loads, and Launcher.bind refuses its key's",
    "T7": "the fix build --key kept an entry whose FlyDSL was edited, a proof under this FlyDSL vouching for its code "
          "object; fixed: toolmove.moved requires the entry to describe its object (integrity.check_entry)",
}

# the printed fixes that, run word for word, still leave a tree some reader refuses (bench/faults.py --fixes), and why
FIX_OPEN = {
    "codeswap band *": "Q1, as it must: the rebuild restores the key's own code object, so the proof forged for "
                       "the swapped one no longer matches it and the release gate (merge --require-verified) waits "
                       "for a JIT proof (verify --against-jit --record --key K), which --fixes does not run",
}

NAMES = {"manifest.json": ("manifest",), "verified.json": ("proof", "proven"), "timings.json": ("timings",),
         "libs.json": ("libdsv41_",), "RECORD": ("RECORD",),
         "METADATA": ("METADATA", "Name", "Version", "file name", "extra"),
         "WHEEL": ("WHEEL", "tag")}


def named(t: Tampering, text: str) -> bool:
    """Whether a refusal names what ``t`` damaged: the key it is about (or the whole record), else its file."""
    if t.key is not None:
        return t.key in text or t.path in text
    name = posixpath.basename(t.path)
    words = {name, *NAMES.get(t.record, ()), *NAMES.get(name, ())}
    if t.record == "band":
        words.add(name.split(".")[0])  # its chunk
    return any(w in text for w in words)


def fixed(text: str) -> bool:
    """Whether a refusal names the command that fixes it: a ``fix:`` line, and no error printed without one.

    The loader's lines read ``Error: message (fix: command)``; each must carry a command."""
    lines = [line.strip() for line in text.splitlines()]
    return any(line.startswith("fix:") or "(fix: " in line for line in lines) \
        and not any(line.endswith("(fix: None)") for line in lines)


def matches(table: dict, *subjects: str):
    """The first value of ``table`` whose pattern matches one of ``subjects``, else None."""
    return next((v for pat, v in table.items() for s in subjects if fnmatch.fnmatchcase(s, pat)), None)


@dataclass
class Verdict:
    """What the readers said of one case and what the matrix makes of it.

    ``status``: agree, by design, known open, DISAGREE (readers that count
    differ), UNNAMED (a refusal names neither the file nor the key), NO FIX
    (a refusal prints no command that fixes it) or CRASH
    (a reader failed with a traceback: exit 70, a bug whatever the input)."""

    tampering: Tampering
    form: str
    results: dict  # reader -> (accepts, text)
    status: str
    why: str = ""

    @property
    def accepted(self) -> list:
        return sorted(r for r, (ok, _) in self.results.items() if ok)

    @property
    def refused(self) -> list:
        return sorted(r for r, (ok, _) in self.results.items() if not ok)

    @property
    def differ(self) -> bool:
        return bool(self.accepted and self.refused)

    def line(self) -> str:
        return (f"{self.status}: {self.tampering.name} [{self.form}]: accepted by {', '.join(self.accepted) or '-'}; "
                f"refused by {', '.join(self.refused) or '-'}" + (f" ({self.why})" if self.why else ""))


def judge(t: Tampering, form: str, results: dict, quiet=()) -> Verdict:
    """One case's verdict. ``quiet``: readers whose refusal is an act, not a message (build, link)."""
    where = f"{t.kind} @{form}"
    crashed = [r for r, (ok, text) in results.items() if "Traceback (most recent call last)" in text
               or text.startswith("crash:") or "\ncrash:" in text]
    if crashed:
        return Verdict(t, form, results, "CRASH", f"a traceback from {', '.join(crashed)}")
    excused = set().union(*(rs for pat, (rs, _) in BY_DESIGN.items() if fnmatch.fnmatchcase(where, pat)))
    counted = {r: ok for r, (ok, _) in results.items() if r not in excused}
    known = matches(KNOWN_OPEN, where)
    if len(set(counted.values())) > 1:
        return Verdict(t, form, results, "known open" if known else "DISAGREE", known or "")
    unnamed = [r for r, (ok, text) in results.items() if not ok and r not in quiet and not named(t, text)]
    why = [matches(KNOWN_OPEN, where, f"unnamed {r} {where}") for r in unnamed]
    if unnamed:
        if all(why):
            return Verdict(t, form, results, "known open", why[0])
        return Verdict(t, form, results, "UNNAMED", f"no file or key named by {', '.join(unnamed)}")
    unfixed = [r for r, (ok, text) in results.items() if not ok and r not in quiet and not fixed(text)]
    if unfixed:
        return Verdict(t, form, results, "NO FIX", f"no fix printed by {', '.join(unfixed)}")
    differ = len({ok for ok, _ in results.values()}) > 1
    return Verdict(t, form, results, "by design" if differ else "agree",
                   matches({p: f"BY_DESIGN {p!r}" for p in BY_DESIGN}, where) if differ else "")
