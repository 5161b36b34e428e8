"""The checks of ``dsv41-aot doctor``: will this host get prebuilt kernels?

Each check asks the runtime's own judge and never loads a kernel:
``host.installed_vllm``, ``decision.decide``, ``rooms.release_of``,
``hip.Hip.check_version``, ``verdict.problems`` and, for a deployment,
``deployment`` (the rules ``dsv41-aot coverage`` uses).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import commands, verdict
from ..errors import AotError, HipUnavailableError, HipVersionError
from ..facts.arches import ARCHES
from ..deployment import CoverageInputError, compare, counts_text, deployment, held
from ..facts.releases import NEWEST, RELEASES
from ..manifest import ENV_PREBUILT
from ..room import Room
from . import decision, hip, host, loader, rooms, state

ENTRY_GROUP = "vllm.general_plugins"
ENTRY_VALUE = "dsv41_aot.vllm:register"
FIX_PLUGIN = "pip install --force-reinstall --no-deps dsv41-aot"
SHOWN = 8  # keys named in a failing coverage line (--json lists them all)


@dataclass
class Check:
    """One line of the report; only a "fail" (not "ok", "warn", "info") exits 1."""

    name: str
    status: str
    text: str
    fix: str | None = None

    def as_dict(self) -> dict:
        return {"check": self.name, "status": self.status, "text": self.text, "fix": self.fix}


@dataclass
class Report:
    checks: list = field(default_factory=list)
    facts: dict = field(default_factory=dict)  # what each check found, for --json
    coverage: dict | None = None

    def add(self, name: str, status: str, text: str, fix: str | None = None) -> None:
        self.checks.append(Check(name, status, text, fix))

    def fail(self, name: str, err: AotError | str, fix: str | None = None) -> None:
        text = err.message if isinstance(err, AotError) else err
        self.add(name, "fail", text, fix or getattr(err, "fix", None))

    @property
    def exit_code(self) -> int:
        """2 when a variable is bad input, 1 when a check failed, else 0."""
        if any(c.status == "bad" for c in self.checks):
            return 2
        return 1 if any(c.status == "fail" for c in self.checks) else 0


def diagnose(tp: int | None = None, max_rows: int | None = None, draft: tuple | None = None) -> Report:
    """Run every check in order; CoverageInputError (exit 2) for bad arguments."""
    runs = sorted({t for r in RELEASES.values() for d in r.arches.values() for t in d.tp_sizes})
    if tp is not None and tp not in runs:
        raise CoverageInputError(f"--tp {tp}: no vLLM release's mono path runs TP {tp} (they run TP "
                                 f"{' or '.join(map(str, runs))})", fix=f"dsv41-aot doctor --tp {runs[-1]}")
    if max_rows is not None and max_rows < 1:
        raise CoverageInputError(f"--max-rows {max_rows}: a step has at least one row", fix="pass --max-rows 1..48")
    root = loader.prebuilt_dir()
    if root.exists() and not root.is_dir():  # $DSV41_AOT_PREBUILT naming a file: bad input, before any check
        raise AotError(f"{ENV_PREBUILT}={root}: not a folder (a prebuilt directory holds <arch>/vllm-<release>/)",
                       fix=f"point {ENV_PREBUILT} at a prebuilt directory, or unset it to use the installed wheel's")
    rep = Report()
    src, digest = _vllm(rep)
    d = decision.decide(device=_device_arch)
    for bad in d.bad_env:  # a variable set to what the plugin cannot read: bad input (exit 2)
        rep.add("env", "bad", bad, "set it to one of the values named, or unset it")
    arch = _arch(rep, d)
    _hip(rep, arch)
    mode = _plugin(rep, d)
    rep.facts["prebuilt"] = str(root)
    room = _room(rep, root, arch, src, digest) if arch else None
    problems = _bands(rep, room) if room else None
    if room:
        _flydsl(rep, room)
    if tp is not None:
        _coverage(rep, root, arch, room, src, problems, mode, tp, max_rows, draft)
    return rep


# ---------------------------------------------------------------- the checks


def _vllm(rep: Report) -> tuple:
    """The installed vLLM's mono source and its digest, or (None, None)."""
    try:
        digest, src, _mono = host.installed_vllm()
    except AotError as e:
        rep.fail("vllm", e)
        return None, None
    if src is None:
        rep.fail("vllm", "no vLLM with the DeepSeek-V4.1 mono package is installed: nothing to serve",
                 fix='pip install "dsv41-aot[vllm]"')
        return None, None
    rep.facts["vllm"] = {"version": src.version, "root": str(src.root), "mono_sources": digest}
    known = "" if src.version in RELEASES else f" (a release dsv41-aot does not know: it knows {', '.join(RELEASES)})"
    rep.add("vllm", "ok", f"vLLM {src.version}{known} at {src.root}, mono sources {digest}")
    return src, digest


def _arch(rep: Report, d: decision.Decision) -> str | None:
    """The arch the plugin serves, if vLLM's runner compiles for the same one."""
    if d.arch is not None:
        rep.facts["arch"] = {"arch": d.arch, "from": d.arch_from}
    if d.arch_problem:
        rep.fail("arch", d.arch_problem if d.arch is None else f"{d.arch_problem}: {decision.JIT}", d.arch_fix)
        return None
    arch, where = d.arch, d.arch_from
    runner = host.arch_name(os.environ.get("ARCH", ""))  # vLLM's variable: what its runner compiles for
    if runner and runner != arch:
        rep.fail("arch", f"vLLM's runner compiles for ARCH={runner}, the plugin serves {arch} (from {where}): "
                         f"the plugin refuses that runner",
                 fix=f"unset ARCH, or set ARCH={arch}")
        return None
    rep.add("arch", "ok", f"{arch} ({ARCHES[arch].products}), from {where}")
    return arch


def _device_arch() -> str | None:
    try:
        return state.current().device_arch()
    except (AotError, OSError):
        return None


def _hip(rep: Report, arch: str | None) -> None:
    """The HIP runtime the bands bind against, and the loader's verdict on it."""
    try:
        h = hip.load()
    except HipUnavailableError as e:
        rep.fail("hip", e)
        return
    rep.facts["hip"] = {"library": h.path}
    try:
        major, minor = h.check_version()
    except (HipUnavailableError, HipVersionError) as e:
        rep.fail("hip", e)
    else:
        allowed = not hip.accepted((major, minor))
        how = f"accepted by {hip.ENV_ALLOW_VERSION}={major}.{minor}" if allowed else "accepted"
        rep.facts["hip"].update(version=f"{major}.{minor}", allowed_by_env=allowed)
        rep.add("hip", "ok", f"HIP {major}.{minor} ({h.path}): {how}")
    status, count = h.device_count()
    if status != hip.HIP_SUCCESS or count < 1:
        rep.facts["hip"]["devices"] = 0
        rep.add("device", "info", f"no GPU device visible to HIP ({h.error_name(status)}): nothing was checked on "
                                  f"a device; the arch is {arch or 'unknown'}")
    else:
        rep.facts["hip"]["devices"] = count
        current = state.current().device_arch() or "unknown"
        rep.add("device", "info", f"{count} GPU device(s) visible to HIP, the current one {current}")


def _plugin(rep: Report, d: decision.Decision) -> str | None:
    """The plugin's mode, or None when vLLM would not call it or it is off."""
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group=ENTRY_GROUP) if ep.value == ENTRY_VALUE]
    if not eps:
        rep.fail("plugin", f"no {ENTRY_GROUP} entry point {ENTRY_VALUE} is installed: vLLM never calls dsv41-aot",
                 fix=FIX_PLUGIN)
        return None
    ep = eps[0]
    dist = getattr(ep, "dist", None)
    named = f"{ep.name} = {ep.value}"
    shipped = f"{dist.name} {dist.version}" if dist else None  # the distribution that installed it
    rep.facts["plugin"] = {"entry_point": named, "distribution": shipped}
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and ep.name not in allowed.split(","):
        rep.fail("plugin", f"VLLM_PLUGINS={allowed} leaves out {ep.name}: vLLM does not call the plugin",
                 fix=f"VLLM_PLUGINS={allowed},{ep.name}  (or unset VLLM_PLUGINS)")
        return None
    if d.stopped_at == "disabled":
        rep.facts["plugin"]["mode"] = "disabled"
        rep.fail("plugin", f"{d.why}: vLLM JIT-compiles every launch", fix=d.fix)
        return None
    mode = d.mode
    rep.facts["plugin"]["mode"] = mode
    what = ("a launch not prebuilt stops vLLM with the loader's error" if mode == "strict"
            else "a launch not prebuilt is JIT-compiled by FlyDSL, one warning each")
    rep.add("plugin", "ok", f"entry point {named}{f' ({shipped})' if shipped else ''}; mode {mode}: {what}")
    return mode


def _room(rep: Report, root: Path, arch: str, src, digest: str | None) -> Room | None:
    """The room the loader picks for the installed vLLM (``rooms.release_of``)."""
    try:
        release = rooms.release_of(root, arch)
        room = rooms.room_of(root, arch, release)
        man = room.manifest()
    except AotError as e:
        rep.fail("room", e)
        return None
    rep.facts["room"] = {"dir": str(room.dir), "release": release, "keys": len(man.entries),
                         "mono_sources": man.mono_sources}
    text = f"vLLM {release}'s room {room.dir} ({len(man.entries)} keys, mono sources {man.mono_sources})"
    if src is None:
        rep.add("room", "info", f"{text}: the loader's pick with no vLLM installed (the newest room)")
    elif man.mono_sources != digest:
        rep.add("room", "warn", f"{text} serves vLLM {src.version} (mono sources {digest}) only because "
                                f"{host.ENV_ALLOW_SOURCE}=1: the kernels were built from other sources",
                fix=f"install the vLLM they were built from: pip install --no-deps vllm=={release}")
    else:
        rep.add("room", "ok", f"{text} serves it")
    return room


def _bands(rep: Report, room: Room) -> list:
    """The room's serving problems: every band read and checked, none bound."""
    problems = [p for p in verdict.problems(room, objects=False) if p.serving]
    try:
        bands = len(room.links().bands)
    except AotError:
        bands = 0
    rep.facts["bands"] = {"checked": bands, "problems": [p.as_dict() for p in problems]}
    for p in problems:
        rep.fail("bands", p.message, p.fix)
    if not problems:
        rep.add("bands", "ok", f"{bands} band(s) of {room.lib} sound (sha256, decompressed, raw sha256, every key's "
                               f"entry exported, its kernel in its code object); nothing bound")
    return problems


def _flydsl(rep: Report, room: Room) -> None:
    """The host's FlyDSL, and how many of the room's keys are proven under it."""
    from ..facts.flydsl import FLYDSL, fix_install, installed_version, supported
    from ..proof import flydsl_text

    have = installed_version()
    if have is None:
        rep.facts["flydsl"] = None
        rep.add("flydsl", "info", "no FlyDSL installed: nothing here JIT-compiles what the prebuilt kernels replace")
        return
    try:
        entries = room.manifest().entries
        by = room.proof().flydsl_counts(entries)
    except AotError as e:
        rep.facts["flydsl"] = {"version": have, "error": e.message}
        rep.add("flydsl", "warn", f"FlyDSL {have}: the room's proofs are unreadable: {rep.facts['flydsl']['error']}",
                getattr(e, "fix", None))
        return
    n = by.get(have, 0)
    rep.facts["flydsl"] = {"version": have, "proven": n, "keys": len(entries), "by_flydsl": by,
                           "proven_under": sorted(v for v in by if v)}
    text = (f"FlyDSL {have}: {n} of {len(entries)} keys of the room proven equal to its JIT's code objects"
            f"{flydsl_text(by) or '; the room carries no proof'}")
    if entries and n == len(entries):
        rep.add("flydsl", "ok", text)
    elif have not in FLYDSL:  # nothing proves under it: say so, and how to get one that does
        rep.add("flydsl", "warn", f"{text}; dsv41-aot proves only under FlyDSL {supported()}", fix_install())
    else:  # a wheel's room is proven where it is installed, from its bands (--record then prints the proofs)
        how = room.prove_cmd if room.built_here else (
            f"dsv41-aot verify --against-jit --sample 20 --dir {room.root} --release {room.release}")
        rep.add("flydsl", "warn", text, f"prove them under FlyDSL {have}: {how}")


def _coverage(rep: Report, root: Path, arch: str | None, room: Room | None, src, problems, mode,
              tp: int, max_rows: int | None, draft: tuple | None) -> None:
    """How many of the launches vLLM can ask for on the deployment the room serves."""
    if arch is None:
        rep.fail("coverage", f"TP {tp}: not counted, the arch is unknown (see the arch line)",
                 fix=f"{host.ENV_ARCH}=gfx950 dsv41-aot doctor --tp {tp}")
        return
    release = room.release if room else (src.version if src and src.version in RELEASES else NEWEST)
    dep = deployment(arch, tp, max_rows, draft, release=release)  # CoverageInputError: exit 2
    have, linked = set(), None
    if room is not None:
        try:
            have, linked = held(room)
        except AotError:  # libs.json is broken (its bands line says so): nothing is linked
            have = set(room.manifest().entries)
    report = compare(dep, have, linked, str(room.dir) if room else "no room")
    try:  # the keys the room's serving problems make the loader refuse
        refused = {k for p in problems or [] for k in verdict.problem_keys(room, p)} if room else set()
    except AotError:  # records it cannot read: its bands line says so, and every key is unlinked
        refused = set()
    bad = set(report["missing"]) | set(report["unlinked"])
    report["refused"] = [k for k in report["required"] if k not in bad and k in refused]
    report["served"] = len(report["required"]) - len(bad) - len(report["refused"])
    rep.coverage = report
    counts = counts_text(report["counts"])
    need = len(report["required"])
    if report["served"] == need:
        rep.add("coverage", "ok", f"{dep.describe()}: all {need} launches vLLM can ask for are prebuilt ({counts})")
        return
    parts = [f"{len(v)} {what}" for v, what in ((report["missing"], "not prebuilt"),
                                                (report["unlinked"], "not linked"),
                                                (report["refused"], "refused (see the bands lines)")) if v]
    then = ("vLLM stops at the first one it asks for (strict)" if mode == "strict" else
            "vLLM JIT-compiles them (fallback)" if mode == "fallback" else "vLLM JIT-compiles them")
    names = report["missing"] + report["unlinked"] + report["refused"]
    shown = ", ".join(names[:SHOWN]) + (f", ... ({len(names) - SHOWN} more: --json lists them)"
                                         if len(names) > SHOWN else "")
    rep.fail("coverage", f"{dep.describe()}: {report['served']} of {need} launches prebuilt ({counts}); "
                         f"{', '.join(parts)}: {then}: {shown}",
             fix=_fix_coverage(report, room, dep, root, mode))


def _fix_coverage(report: dict, room: Room | None, dep, root: Path, mode) -> str:
    """The command that makes the room serve every launch."""
    missing = report["missing"]
    if room is not None and room.built_here:
        which = dict(keys=missing) if len(missing) <= 3 else dict(profile="full", arch=dep.arch)
        fix = (commands.build(root, release=dep.release, **which) if missing
               else room.fix_relink if report["unlinked"] else "see the bands lines")
    elif missing or room is None:
        fix = (f"{commands.build('DIR', release=dep.release, profile='full', arch=dep.arch)}, then serve "
               f"with {ENV_PREBUILT}=DIR (or install a dsv41-aot wheel built for TP {dep.tp})")
    else:
        fix = room.fix_relink
    if mode == "strict":
        fix += f"; meanwhile {decision.ENV_MODE}=fallback lets vLLM JIT-compile them"
    return fix
