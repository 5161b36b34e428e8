"""``dsv41-aot verify``'s integrity level: a room's keys checked without vLLM.

Each manifest entry is compared with the entry ``compiler.describe_object``
derives from its stored object, and the object's ABI with its kernel's
kernarg layout. A shipped room has no stored objects: each key's GPU code
object is taken from its band by the manifest's sha256.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import commands, elf
from ..errors import AotError, CompileError, IntegrityError, ManifestError, ResidencyError
from ..keys import BuildKey
from ..linkrecord import kernel_problem
from ..manifest import Manifest
from ..proof import VERIFIED
from ..room import Room
from ..verdict import Problem
from .codeobject import code_object_resources
from .compiler import describe_object

# the entry fields describe_object derives, which the manifest must match (the ABI is compared apart)
ENTRY_FIELDS = ("kind", "arch", "fields", "symbol", "entry", "object", "sha256", "bytes", "code_object_sha256",
                "code_object_bytes", "resources")
# how a key's problem opens when its kernel cannot launch as a persistent kernel (fixed in the matrix, not rebuilt)
NOT_RESIDENT = "cannot be resident"
# how a key's problem opens when its manifest entry does not describe its own object (link refuses it too)
ENTRY_DIFFERS = "manifest entry differs from its object's"
# how a key's problem opens when the room's proof of it is not what a JIT run proves (verify --against-jit)
PROOF_DIFFERS = f"its proof in {VERIFIED} differs from this JIT run's"


@dataclass
class KeyReport:
    """What verify found for one key: problems fail it, notes do not."""

    key: str
    arch: str
    release: str
    checks: list = field(default_factory=list)  # names of the checks that ran
    problems: list = field(default_factory=list)
    jit_seconds: float | None = None
    jit_cached: bool = False  # the JIT's code object came from the build cache (aot/cache.py)

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        return f"{self.key} (vLLM {self.release})"

    def as_dict(self) -> dict:
        return {"key": self.key, "arch": self.arch, "release": self.release, "ok": self.ok, "checks": self.checks,
                "problems": self.problems, "jit_seconds": self.jit_seconds, "jit_cached": self.jit_cached}


class ShippedCode:
    """The GPU code objects of a shipped room (a wheel's, no objects/), read from its bands.

    Each band is read (and checked against its digests, ``Room.read_band``)
    once, when a key of it is first asked for."""

    def __init__(self, room: Room):
        self.room = room
        self._bands: dict = {}  # band file -> {code object sha256: bytes}, or the IntegrityError reading it

    def code(self, key: str, entry) -> bytes:
        """``key``'s GPU code object from its band; IntegrityError or ManifestError naming the key otherwise."""
        band = self.room.links().band_of.get(key)
        if band is None:
            raise ManifestError(f"{key} is in no band of {self.room.libs_path}", fix=self.room.fix_relink)
        if band.file not in self._bands:
            try:
                self._bands[band.file] = elf.embedded_code_objects(self.room.read_band(band))
            except (IntegrityError, ManifestError) as e:
                self._bands[band.file] = e
        found = self._bands[band.file]
        if isinstance(found, AotError):
            raise type(found)(f"its band cannot be read: {found.message}", fix=found.fix)
        if why := kernel_problem(found, entry, self.room.release):
            raise IntegrityError(f"band {band.file} {why}", fix=self.room.fix_relink)
        return found[entry.code_object_sha256]


def check_entry(man: Manifest, key: str, shipped: ShippedCode | None = None) -> tuple[KeyReport, bytes | None]:
    """Check one manifest entry: its report, and its GPU code object (None if unread).

    A built room's stored object is checked against its entry. For a
    shipped room, every reader passes ``shipped`` (the room's bands): the
    key's code object is taken from its band, and its kernargs are checked
    against the manifest's ABI."""
    e = man.entries[key]
    rep = KeyReport(key, man.arch, man.release)
    if shipped is not None:
        rep.checks.append("band")
        try:
            code = shipped.code(key, e)
        except (IntegrityError, ManifestError) as err:
            rep.problems.append(err.message)
            return rep, None
        rep.checks.append("resources")
        try:
            rep.problems += kernarg_problems(man.abi(key), code_object_resources(code))
        except (elf.ElfError, ValueError, KeyError) as err:
            rep.problems.append(f"its code object's metadata does not read: {err}")
        return rep, code
    rep.checks.append("sha256")
    try:
        man.check_object(key)
    except IntegrityError as err:
        rep.problems.append(err.message)
        return rep, None
    parsed = BuildKey.parse(key, man.release)  # Room.manifest refused a key that does not parse or is not canonical
    rep.checks.append("export")
    data = man.object_path(key).read_bytes()
    try:  # the entry the build would write for this object, made by the build's own function
        described, abi = describe_object(parsed, data, e.source)
    except (elf.ElfError, ValueError, KeyError) as err:
        rep.problems.append(f"object {e.object} is not an export of entry {e.entry}: {err}")
        return rep, None
    except ResidencyError as err:
        rep.problems.append(f"{NOT_RESIDENT}: {err}")
        return rep, None
    except CompileError as err:
        rep.problems.append(f"object {e.object} is not the key's export: {err}")
        return rep, None
    changed = [f for f in ENTRY_FIELDS if getattr(described, f) != getattr(e, f)]
    if changed:
        rep.problems.append(f"{ENTRY_DIFFERS}: {', '.join(changed)}")
    if abi != man.abi(key):
        rep.problems.append("export metadata's ABI slots differ from the manifest's ABI")
    rep.checks.append("resources")
    code = elf.exported_parts(data, described.entry)[1]
    rep.problems += kernarg_problems(abi, code_object_resources(code))  # describe_object does not compare these
    return rep, code


def key_problems(room: Room) -> list[Problem]:
    """Every key of ``room`` whose entry fails :func:`check_entry`, as a Problem naming the key and its fix.

    What verify finds of each key, for the other readers that judge a
    room as a whole (the wheel gate, merge)."""
    man = room.manifest()
    shipped = None if room.built_here else ShippedCode(room)
    reports = (check_entry(man, key, shipped)[0] for key in sorted(man.entries))
    return [key_problem(rep, room)[0] for rep in reports if not rep.ok]


def key_problem(rep: KeyReport, room: Room) -> tuple[Problem, bool]:
    """One key's failed checks as a Problem, and whether its fix is the key's rebuild.

    ``what`` is "object" when the stored object is missing or altered (the
    bands still serve), "proof" when only its proof disagrees with a JIT
    run, and "entry" when the entry does not describe its code. None of
    them is ``serving``: what the loader refuses is the room's verdict
    (``verdict.problems``), which verify reports beside it (an edited
    symbol is both; edited resource figures only this)."""
    what = ("object" if rep.checks == ["sha256"] else  # check_entry stops at a bad object
            "proof" if all(p.startswith(PROOF_DIFFERS) for p in rep.problems) else "entry")
    rebuild = False
    if all(p.startswith(NOT_RESIDENT) for p in rep.problems):
        fix = (f"{rep.describe()} cannot launch as a persistent kernel (see dsv41-aot inspect): remove it from "
               f"build_matrix.yaml")
    elif what == "proof":  # the code is vLLM's: the recorded proof is not this run's
        fix = room.fix_reprove(rep.key)
    elif not room.built_here:
        fix = room.fix_reinstall
    else:
        fix, rebuild = commands.build(room.root, release=rep.release, keys=[rep.key]), True
    return Problem(what, f"{rep.describe()}: {'; '.join(rep.problems)}", None, fix, key=rep.key,
                   serving=False), rebuild


def scalar_slots(abi: list) -> list:
    """The slots of an ABI that a launch passes by value: every slot but the stream."""
    return [s for s in abi if s["name"] != "stream"]


def kernarg_problems(abi: list, res: dict) -> list[str]:
    """Where the ABI's scalar slots differ from the kernel's by-value kernargs, in order."""
    scalars = scalar_slots(abi)
    args = res["args"]
    if len(scalars) != len(args):
        return [f"ABI has {len(scalars)} scalar slots, the kernel {len(args)} kernargs"]
    out = []
    for i, (s, a) in enumerate(zip(scalars, args)):
        if a["size"] != s["size"] or a["value_kind"] != "by_value":
            out.append(f"slot {i} {s['name']}: ABI {s['ctype']} ({s['size']} bytes), kernarg {a['value_kind']} {a['size']} bytes")
    last = args[-1]["offset"] + args[-1]["size"] if args else 0
    if last > res["kernarg_bytes"]:
        out.append(f"kernargs end at {last} bytes, kernarg segment is {res['kernarg_bytes']}")
    return out
