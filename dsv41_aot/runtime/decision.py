"""Whether this process serves the prebuilt kernels: one decision, two users.

The vLLM plugin acts on :func:`decide`'s answer and ``dsv41-aot doctor``
reports it. It reads the plugin's variables (``DSV41_AOT_DISABLE``,
``DSV41_AOT_MODE``, ``DSV41_AOT_ARCH``, ``DSV41_AOT_PREBUILT``), the GPU's
arch from the kernel driver's topology (no HIP call, so a process vLLM later
forks is not left with a HIP runtime) and the room of the installed vLLM.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import AotError, ReleaseMismatchError
from ..facts.arches import ARCHES
from ..manifest import ENV_PREBUILT
from .host import ENV_ALLOW_SOURCE, ENV_ARCH, arch_name, env_flag, mismatch_allowed

ENV_DISABLE = "DSV41_AOT_DISABLE"
ENV_MODE = "DSV41_AOT_MODE"
MODES = ("strict", "fallback")
KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")
JIT = "vLLM keeps FlyDSL JIT"


@dataclass(frozen=True)
class Decision:
    """What this process serves and why.

    ``mode`` is what the variables ask for: "strict", "fallback", or "off"
    (disabled). ``serve`` says whether there is
    something to serve in that mode. ``stopped_at`` names the step that said
    no ("disabled", "arch", "prebuilt", "vllm", "room", "error"),
    None when serving. ``arch_problem`` is why the arch cannot be served,
    told even when an earlier step said no."""

    serve: bool
    why: str
    mode: str
    arch: str | None = None
    arch_from: str | None = None
    arch_problem: str | None = None
    arch_fix: str | None = None
    stopped_at: str | None = None
    fix: str | None = None
    warning: bool = False  # the host has something the kernels cannot serve, not simply "off" (a WARNING line)
    bad_env: tuple = ()  # what is wrong with the plugin's variables (``bad_variables``): bad input


def one_line(e: BaseException) -> str:
    """An exception as one line: its type name and its message's first line."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def kfd_arches(nodes: Path = KFD_NODES) -> list[str]:
    """The GPU archs in the KFD topology's ``gfx_target_version`` (90402 -> gfx942)."""
    out = set()
    try:
        props = sorted(nodes.glob("*/properties"))
    except OSError:
        return []
    for p in props:
        try:
            fields = dict(line.split(None, 1) for line in p.read_text().splitlines() if " " in line)
            v = int(fields.get("gfx_target_version", "0"))
        except (OSError, ValueError):
            continue
        if v:  # CPU nodes have 0
            major, minor, step = v // 10000, v // 100 % 100, v % 100
            out.add(f"gfx{major}{minor:x}{step:x}")
    return sorted(out)


def _arch(env, device) -> tuple:
    """(arch, source, problem, fix, warning): the arch to serve, or why none.

    DSV41_AOT_ARCH, else the KFD topology's one GPU arch, else the HIP
    device's (``device``). ``warning`` tells a problem from simply no GPU."""
    named = arch_name(env.get(ENV_ARCH, ""))
    if named:
        arch, where = named, ENV_ARCH
    else:
        found = kfd_arches()
        if len(found) > 1:
            return (None, None, f"GPUs of several archs ({', '.join(found)}): the plugin serves none of them",
                    f"name the one vLLM runs on: {ENV_ARCH}={found[0]}", True)
        if found:
            arch, where = found[0], "the KFD topology"
        else:
            arch, where = (device() if device else None), "the HIP device"
        if arch is None:
            where = "no GPU node in the KFD topology" + (", no HIP device" if device else "")
            return (None, None, f"no ROCm device ({where}) and {ENV_ARCH} is not set",
                    f"run on the serving host, or name its arch: {ENV_ARCH}=gfx950", False)
    if arch not in ARCHES:
        return (arch, where, f"{arch} (from {where}) is not an arch dsv41-aot compiles for ({', '.join(ARCHES)})",
                f"run on {' or '.join(a.products for a in ARCHES.values())}, or correct {ENV_ARCH}", True)
    return arch, where, None, None, False


def decide(env=None, *, device=None) -> Decision:
    """Decide whether this process serves the prebuilt kernels; never raises.

    ``env`` defaults to ``os.environ``. ``device``, when given, is a function
    returning the HIP device's arch, asked only when the KFD topology has
    none: doctor passes it, the plugin never touches HIP."""
    env = os.environ if env is None else env
    try:
        bad = bad_variables(env)
        d = _decide(env, device)
    except Exception as e:  # noqa: BLE001 - the plugin must never stop vLLM
        return Decision(False, one_line(e), "off", stopped_at="error", warning=True)
    if not bad:
        return d
    return replace(d, why=f"{d.why}; {'; '.join(bad)}", warning=True, bad_env=tuple(bad))


def bad_variables(env) -> list[str]:
    """What is wrong with the plugin's variables as set: each read the way that keeps every check.

    A boolean that is not yes or no reads as unset (``host.env_flag``); a
    mode that is neither strict nor fallback serves strict, so a typo never
    turns the plugin off behind the operator's back."""
    bad = [p for p in (env_flag(env, ENV_DISABLE)[1], env_flag(env, ENV_ALLOW_SOURCE)[1]) if p]
    raw = env.get(ENV_MODE, "")
    if raw.strip().lower() not in ("", *MODES):
        bad.append(f"{ENV_MODE}={raw!r} is not one of {', '.join(MODES)}: served as strict")
    named = env.get(ENV_ARCH, "")
    if named and arch_name(named) not in ARCHES:
        bad.append(f"{ENV_ARCH}={named!r} is not an arch dsv41-aot compiles for ({', '.join(ARCHES)})")
    return bad


def _decide(env, device) -> Decision:
    from . import rooms

    arch, where, arch_problem, arch_fix, arch_warning = _arch(env, device)
    seen = dict(arch=arch, arch_from=where, arch_problem=arch_problem, arch_fix=arch_fix)

    def no(stage: str, why: str, fix: str | None = None, warning: bool = True, mode="off") -> Decision:
        return Decision(False, why, mode, stopped_at=stage, fix=fix, warning=warning, **seen)

    if env_flag(env, ENV_DISABLE)[0]:
        return no("disabled", f"disabled by {ENV_DISABLE}={env.get(ENV_DISABLE)}", f"unset {ENV_DISABLE}",
                  warning=False)
    mode = env.get(ENV_MODE, "").strip().lower()
    mode = mode if mode in MODES else "strict"  # bad_variables names a bad one
    if arch_problem:
        return no("arch", f"{arch_problem}; {JIT}", arch_fix, warning=arch_warning, mode=mode)
    root = rooms.resolve_root(env.get(ENV_PREBUILT) or None)  # None: DSV41_AOT_PREBUILT, else the package's
    from .. import source
    from ..listing import built_releases

    if not built_releases(root / arch):
        return no("prebuilt", f"no prebuilt kernels for {arch} at {root} (install the dsv41-aot wheel or set "
                              f"{ENV_PREBUILT}); {JIT}", f"pip install dsv41-aot, or {ENV_PREBUILT}=DIR", mode=mode)
    try:
        src = source.find()
    except AotError as e:
        return no("vllm", f"vLLM's mono package not found ({e.message})", e.fix, mode=mode)
    allowed = mismatch_allowed(env)
    try:
        release = rooms.release_of(root, arch)  # by the installed vLLM's mono sources digest
    except ReleaseMismatchError as e:
        if not allowed:
            return no("room", f"{e.message}; {JIT} (or {ENV_ALLOW_SOURCE}=1)", e.fix, mode=mode)
        # the loader serves the room of vLLM's version anyway, warning once
        return Decision(True, f"enabled ({mode}) for {arch} with {ENV_ALLOW_SOURCE}=1: {e.message}", mode,
                        warning=True, **seen)
    except AotError as e:
        return no("room", f"{e.message}; {JIT}", e.fix, mode=mode)
    man = rooms.room_of(root, arch, release).manifest()  # the manifest release_of parsed
    return Decision(True, f"enabled ({mode}) for {arch}: {len(man.entries)} prebuilt keys of vLLM {release} in "
                          f"{man.room}, vLLM {src.version} mono sources {man.mono_sources}", mode, **seen)
