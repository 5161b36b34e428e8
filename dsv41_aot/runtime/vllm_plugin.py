"""vLLM integration: the ``vllm.general_plugins`` entry point that serves
vLLM's mono decode runner prebuilt Launchers.

:func:`register` is the entry point: vLLM calls it, with no arguments, in
every process it starts (``vllm.plugins.load_general_plugins``, which does
not catch what a plugin raises: this one never raises). :func:`enable`
decides whether this process serves the prebuilt kernels -- ``DSV41_AOT_DISABLE=1``
turns it off; ``DSV41_AOT_MODE`` picks strict / fallback; the GPU's arch is
read from the kernel driver's topology (no HIP call); a release the install
does not hold is one log line and vLLM's JIT -- and installs if so. It logs
one line (logger ``dsv41_aot``) saying what it enabled or why it did not.

What installing does -- wrapping the runner module's ``build_mono_k1/k2/ffn``
so each hands out the Launcher of the ``MonoBuild`` vLLM passes, strict or
fallback per key, never breaking vLLM's import -- is :mod:`.runner_patch`;
its public names (``install``, ``uninstall``, ``installed``, ``key_of``,
``RUNNER``, the modes) are this module's too, as ``dsv41_aot.vllm`` is this
very module.

Inside this package ``vllm`` is a module of ours; every import of the real
vLLM is absolute and deferred.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..errors import AotError, ReleaseMismatchError
from ..facts.arches import ARCHES
from .runner_patch import (  # noqa: F401 - the plugin's public names (dsv41_aot.vllm), and what tests reach
    BUILDERS,
    ENV_DISABLE,
    ENV_MODE,
    MODES,
    RUNNER,
    _RunnerHook,
    _state,
    check_arch_flag,
    install,
    installed,
    key_of,
    log,
    uninstall,
)

KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")


# ------------------------------------------------------------------ the vLLM plugin


def kfd_arches(nodes: Path = KFD_NODES) -> list[str]:
    """The GPU architectures the kernel driver lists (KFD topology
    ``gfx_target_version``, e.g. 90402 -> gfx942), read from sysfs: no HIP
    call, so a process vLLM later forks is not left with a HIP runtime."""
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


def _ensure_visible() -> None:
    """vLLM configures its own ``vllm`` logger only; give ours a stderr
    handler when nothing would print an INFO line."""
    if not log.handlers and not logging.getLogger().handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [dsv41_aot] %(message)s", "%m-%d %H:%M:%S"))
        log.addHandler(h)
        if log.level == logging.NOTSET:
            log.setLevel(logging.INFO)


def enable(*, environ=None) -> tuple[bool, str, int]:
    """Decide whether this process serves the prebuilt kernels, install if
    so: (enabled, the one-line reason, its log level: INFO when nothing is
    wrong, WARNING when the host has a GPU the kernels cannot serve). Never
    raises."""
    env = os.environ if environ is None else environ
    if env.get(ENV_DISABLE, "") not in ("", "0"):
        return False, f"disabled by {ENV_DISABLE}={env[ENV_DISABLE]}", logging.INFO
    try:
        from .. import source
        from . import loader
        from ..manifest import Manifest
        from ..listing import built_releases

        mode = env.get(ENV_MODE) or "strict"
        if mode not in MODES:
            return False, f"{ENV_MODE}={mode!r} is not one of {', '.join(MODES)}", logging.WARNING
        arch = env.get(loader.ENV_ARCH)
        if not arch:
            found = kfd_arches()
            if not found:
                return False, "no ROCm device (no GPU node in the KFD topology); vLLM keeps FlyDSL JIT", logging.INFO
            if len(found) > 1:
                return False, f"GPUs of several archs ({', '.join(found)}); name one with {loader.ENV_ARCH}", logging.WARNING
            arch = found[0]
        if arch not in ARCHES:
            return False, f"{arch} is not an arch dsv41-aot builds ({', '.join(ARCHES)}); vLLM keeps FlyDSL JIT", logging.WARNING
        root = loader.prebuilt_dir()
        held = built_releases(root / arch)
        if not held:
            return False, (f"no prebuilt kernels for {arch} at {root} (install the dsv41-aot wheel or set "
                           f"{loader.ENV_PREBUILT}); vLLM keeps FlyDSL JIT"), logging.WARNING
        try:
            src = source.find()
        except AotError as e:
            return False, f"vLLM's mono package not found ({str(e).splitlines()[0]})", logging.WARNING
        try:
            release = loader.release_of(root, arch)  # by the installed vLLM's mono sources digest
        except ReleaseMismatchError as e:
            if env.get(loader.ENV_ALLOW_SOURCE) != "1":
                return False, f"{str(e).splitlines()[0]}; vLLM keeps FlyDSL JIT (or {loader.ENV_ALLOW_SOURCE}=1)", \
                    logging.WARNING
            install(mode)  # the loader serves the room of vLLM's version anyway, warning once
            return True, (f"enabled ({mode}) for {arch} with {loader.ENV_ALLOW_SOURCE}=1: "
                          f"{str(e).splitlines()[0]}"), logging.WARNING
        except AotError as e:
            return False, f"{str(e).splitlines()[0]}; vLLM keeps FlyDSL JIT", logging.WARNING
        man = Manifest.read(root / arch, arch, release=release)
        install(mode)  # keys take the arch vLLM's mono package compiles for
        return True, (f"enabled ({mode}) for {arch}: {len(man.entries)} prebuilt keys of vLLM {release} in "
                      f"{man.room}, vLLM {src.version} mono sources {man.mono_sources}"), logging.INFO
    except Exception as e:  # noqa: BLE001 - a plugin must never stop vLLM
        return False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", logging.WARNING


def register() -> None:
    """The ``vllm.general_plugins`` entry point (vLLM calls it in every
    process it starts, with no arguments). Logs one line; never raises."""
    try:
        _ensure_visible()
        ok, why, level = enable()
        log.log(level, "dsv41-aot vLLM plugin %s: %s", "on" if ok else "off", why)
    except Exception:  # noqa: BLE001
        pass
