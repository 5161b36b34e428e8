"""The vLLM plugin: the ``vllm.general_plugins`` entry point of dsv41-aot.

vLLM calls :func:`register`, with no arguments, in every process it starts
(``vllm.plugins.load_general_plugins``, which does not catch what a plugin
raises: this one never raises). :func:`enable` installs the runner patch
(:mod:`.runner_patch`) when :func:`.decision.decide` says this process
serves, and logs one line (logger ``dsv41_aot``) saying what it enabled or
why not. ``dsv41_aot.vllm`` is this module, so the runner patch's public
names are re-exported here.

Inside this package ``vllm`` is a module of ours; every import of the real
vLLM is absolute and deferred.
"""

from __future__ import annotations

import logging

from .decision import ENV_DISABLE, ENV_MODE, MODES, decide, kfd_arches, one_line  # noqa: F401 - the plugin's names too
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
    """Give our logger a stderr handler (vLLM configures only its own logger)."""
    if not log.handlers and not logging.getLogger().handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [dsv41_aot] %(message)s", "%m-%d %H:%M:%S"))
        log.addHandler(h)
        if log.level == logging.NOTSET:
            log.setLevel(logging.INFO)


def enable(*, environ=None) -> tuple[bool, str, int]:
    """Install if this process serves the prebuilt kernels; never raises.

    Returns (enabled, the one-line reason, its log level): INFO when nothing
    is wrong, WARNING when the host has a GPU the kernels cannot serve."""
    d = decide(environ)
    if d.serve:
        try:
            install(d.mode)  # keys take the arch vLLM's mono package compiles for
        except Exception as e:  # noqa: BLE001 - a plugin must never stop vLLM
            return False, one_line(e), logging.WARNING
    return d.serve, d.why, logging.WARNING if d.warning else logging.INFO


def register() -> None:
    """The ``vllm.general_plugins`` entry point: log one line, never raise."""
    try:
        _ensure_visible()
        ok, why, level = enable()
        log.log(level, "dsv41-aot vLLM plugin %s: %s", "on" if ok else "off", why)
    except Exception:  # noqa: BLE001
        pass
