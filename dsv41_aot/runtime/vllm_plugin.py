"""vLLM integration: the ``vllm.general_plugins`` entry point that serves
vLLM's mono decode runner prebuilt Launchers.

:func:`register` is the entry point: vLLM calls it, with no arguments, in
every process it starts (``vllm.plugins.load_general_plugins``, which does
not catch what a plugin raises: this one never raises). :func:`enable`
installs when :func:`.decision.decide` says this process serves the
prebuilt kernels (the variables, the GPU's arch, the room of the installed
vLLM). It logs one line (logger ``dsv41_aot``) saying what it enabled or
why it did not.

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

from .decision import ENV_DISABLE, ENV_MODE, MODES, decide, kfd_arches  # noqa: F401 - the plugin's names too
from .runner_patch import (  # noqa: F401 - the plugin's public names (dsv41_aot.vllm), and what tests reach
    BUILDERS,
    RUNNER,
    check_arch_flag,
    install,
    installed,
    key_of,
    log,
    uninstall,
)

# ------------------------------------------------------------------ the vLLM plugin


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
    """Install if this process serves the prebuilt kernels (``decision.decide``):
    (enabled, the one-line reason, its log level: INFO when nothing is
    wrong, WARNING when the host has a GPU the kernels cannot serve). Never
    raises."""
    d = decide(environ)
    if d.serve:
        try:
            install(d.mode)  # keys take the arch vLLM's mono package compiles for
        except Exception as e:  # noqa: BLE001 - a plugin must never stop vLLM
            return False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", logging.WARNING
    return d.serve, d.why, d.level


def register() -> None:
    """The ``vllm.general_plugins`` entry point (vLLM calls it in every
    process it starts, with no arguments). Logs one line; never raises."""
    try:
        _ensure_visible()
        ok, why, level = enable()
        log.log(level, "dsv41-aot vLLM plugin %s: %s", "on" if ok else "off", why)
    except Exception:  # noqa: BLE001
        pass
