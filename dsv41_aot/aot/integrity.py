"""A room's keys checked one by one without vLLM (``dsv41-aot verify``'s
integrity level, ``aot/verify.py``): each manifest entry against its stored
object, the GPU code object inside it, that object's export ABI and kernarg
layout, and whether its CTA can be resident."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from .. import elf
from ..errors import AotError, IntegrityError
from ..keys import BuildKey
from ..manifest import OBJECTS, Manifest
from .codeobject import code_object_resources, manifest_figures
from .residency import residency_problems


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


def check_entry(man: Manifest, key: str) -> tuple[KeyReport, bytes | None]:
    """Integrity of one manifest entry; returns the report and the stored
    GPU code object (None when it could not be read)."""
    e = man.entries[key]
    rep = KeyReport(key, man.arch, man.release)
    if not (man.dir / OBJECTS).is_dir():  # a shipped room (a wheel's): its bands are what is checked
        rep.checks.append("shipped")
        return rep, None
    rep.checks.append("sha256")
    try:
        man.check_object(key)
    except IntegrityError as err:
        rep.problems.append(str(err).split("\n")[0])
        return rep, None
    try:
        parsed = BuildKey.parse(key, man.release)
    except AotError as err:
        rep.problems.append(f"manifest key does not parse: {err}")
        return rep, None
    if str(parsed) != key:
        rep.problems.append(f"manifest key is not canonical (canonical: {parsed})")
    if e.resources is None:
        rep.problems.append("manifest entry lacks resources")
    if (e.kind, e.arch, e.fields) != (parsed.kind, parsed.arch, parsed.build_fields()):
        rep.problems.append(f"manifest kind / arch / fields differ from the key's ({parsed.kind}, {parsed.arch}, "
                            f"{parsed.build_fields()})")
    if e.symbol != parsed.kernel_symbol or e.entry != parsed.entry:
        rep.problems.append(f"manifest names symbol {e.symbol} / entry {e.entry}, the key's are {parsed.kernel_symbol} / {parsed.entry}")
    rep.checks.append("export")
    try:
        meta_raw, code = elf.exported_parts(man.object_path(key).read_bytes(), e.entry)
        meta = json.loads(meta_raw)
    except (elf.ElfError, ValueError) as err:
        rep.problems.append(f"object {e.object} is not an export of entry {e.entry}: {err}")
        return rep, None
    if hashlib.sha256(code).hexdigest() != e.code_object_sha256 or len(code) != e.code_object_bytes:
        rep.problems.append("GPU code object inside the object differs from the manifest's code_object_sha256 / bytes")
    if meta.get("arch") != man.arch:
        rep.problems.append(f"export metadata says arch {meta.get('arch')!r}, the manifest {man.arch}")
    slots = [{"name": a["arg_name"], "ctype": a["ctype"], "size": a["size"]} for a in meta.get("abi", [])]
    if slots != man.abi(key):
        rep.problems.append("export metadata's ABI slots differ from the manifest's ABI")
    rep.checks.append("resources")
    try:
        res = code_object_resources(code)
    except (elf.ElfError, ValueError) as err:
        rep.problems.append(f"GPU code object metadata unreadable: {err}")
        return rep, code
    if res["name"] != e.symbol:
        rep.problems.append(f"GPU kernel is named {res['name']}, the manifest says {e.symbol}")
    figures = manifest_figures(res)
    if e.resources is not None and e.resources != figures:
        changed = sorted(k for k in set(figures) | set(e.resources) if figures.get(k) != e.resources.get(k))
        rep.problems.append(f"manifest resources differ from the code object's: {', '.join(changed)}")
    rep.problems += kernarg_problems(slots, res)  # the object's own ABI (the manifest's was compared above)
    rep.problems += [f"cannot be resident: {p}" for p in residency_problems(res, man.arch, man.release)]
    return rep, code


def kernarg_problems(abi: list, res: dict) -> list[str]:
    """The export ABI (stream last) against the kernel's kernarg layout: one
    by-value kernarg per scalar slot, same size, in order."""
    scalars = [s for s in abi if s["name"] != "stream"]
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
