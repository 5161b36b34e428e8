"""The plugin's patch of vLLM's mono runner module: prebuilt Launchers.

vLLM's ``DSV41MonoLayer`` (``vllm/models/deepseek_v41/amd/mono/runner.py``)
gets its launchers from ``build_mono_k1/k2/ffn(MonoBuild(...))``, which
FlyDSL compiles just in time. :func:`install` wraps those functions, leaving
vLLM's files untouched, so each returns the bound Launcher of the key its
``MonoBuild`` names. A key the loader refuses raises in strict mode; in
fallback mode it is warned about once and gets vLLM's own function. The
runner module is patched when imported, never imported from here, and a
failed patch is rolled back: the plugin never breaks vLLM. See
docs/building.md ("In vLLM"); :mod:`.vllm_plugin` re-exports these names.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.abc  # binds importlib too (importlib.import_module)
import os
import sys
from pathlib import Path

from ..errors import AotError, ReleaseMismatchError
from ..facts.arches import arch_facts
from ..facts.kinds import KINDS
from ..facts.releases import RELEASES, release_facts
from ..keys import BuildKey
from . import state
from .state import log
from .decision import ENV_DISABLE, ENV_MODE, JIT, MODES, one_line

RUNNER = "vllm.models.deepseek_v41.amd.mono.runner"


class _Install:
    """What install() changed in this interpreter: its settings, hook and patched module.

    It is kept apart from ``state.Prebuilt`` because it records changes to
    objects outside it (``sys.meta_path``, vLLM's runner module), which a
    new Prebuilt (``state.fresh()``) must not forget. What the patch finds
    and hands out is on the Prebuilt (``runner_room``, ``served``, its
    warnings), and install() and uninstall() hold the Prebuilt's lock."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """Forget the installation."""
        self.mode: str | None = None  # None: not installed
        self.prebuilt: str | None = None
        self.arch: str | None = None  # None: the runner package's target arch
        self.hook: _RunnerHook | None = None
        self.patched = None  # the runner module whose build functions we wrapped
        self.originals: dict = {}  # build function name -> vLLM's function


_state = _Install()


# ------------------------------------------------------------------ the keys vLLM builds

BUILDERS = {name: k.builder for name, k in KINDS.items()}  # kind -> build_mono_<kind>


def check_arch_flag(module, release: str, arch: str) -> None:
    """Refuse a runner module whose arch flag does not match ``arch``.

    The flag is the attribute ``Release.arch_flag`` names (absent reads
    False). It must equal the ``runner_flag`` of the release's ``Deploy`` for
    ``arch``: a runner compiled for another arch would get kernels it does
    not run. A release whose runner has no flag has nothing to check."""
    rel = release_facts(release)
    if rel.arch_flag is None:
        return
    flag = bool(getattr(module, rel.arch_flag, False))
    if flag != rel.deploy(arch).runner_flag:
        raise AotError(f"vLLM {release}'s mono runner has {rel.arch_flag}={flag} but compiles for {arch}",
                       fix="set ARCH to the GPU's arch (or unset it) before vLLM starts")


def _running(module) -> tuple[str, str]:
    """The (arch, release) of the mono package holding ``module``, found once.

    The package's mono sources digest picks the release's room
    (``loader.release_of``). The arch is install()'s, else the package's
    target (``common/arch.py``, which releases before 0.33.0 lack)."""
    from . import loader

    st = state.current()
    if st.runner_room is not None:
        return st.runner_room
    pkg = module.__name__.rsplit(".", 1)[0]
    arch = _state.arch
    if not arch:
        try:
            arch = importlib.import_module(f"{pkg}.common.arch").target_arch()
        except ImportError:
            arch = loader.resolve_arch(None)  # DSV41_AOT_ARCH, else the device's
    arch_facts(arch)
    loader.running_vllm(Path(module.__file__).resolve().parent)
    root = loader.resolve_root(_state.prebuilt)  # the directory load_key reads
    release = loader.release_of(root, arch)
    release_facts(release).deploy(arch)  # UnknownArchError: the release's mono path does not run there
    check_arch_flag(module, release, arch)
    st.runner_room = (arch, release)
    return st.runner_room


def key_of(kind: str, build, module) -> BuildKey:
    """The key of ``build_mono_<kind>(build)``: the MonoBuild's fields are its own."""
    arch, release = _running(module)
    rel = release_facts(release)
    fields = {f.name: getattr(build, f.name) for f in dataclasses.fields(build)}
    unknown = sorted(set(fields) - set(rel.mono_fields))
    if unknown:
        raise AotError(f"vLLM {release}'s MonoBuild has fields dsv41-aot does not know for it: {', '.join(unknown)}",
                       fix=f"upgrade dsv41-aot, or run without the prebuilt kernels: {ENV_DISABLE}=1")
    return BuildKey(kind=kind, arch=arch, release=release, **fields)


def _launcher(what: str, derive):
    """The bound prebuilt Launcher of the key ``derive()`` gives, or None.

    None only in fallback mode, for a key that cannot be served (warned once
    per key; ``what``, the runner call, names a key that cannot be derived).
    Strict mode raises the loader's error at the same point."""
    from . import loader

    key = None
    try:
        key = derive()
        launcher = loader.load_key(key, prebuilt=_state.prebuilt)
        launcher.bind()  # sha256, dlopen, entry: refused here, not at the first launch
    except (AotError, OSError) as e:
        if _state.mode != "fallback":
            raise
        described = what if key is None else key.describe()
        # no room for this vLLM at all: one warning, not one per key
        text = "the running vLLM release" if isinstance(e, ReleaseMismatchError) else described
        state.current().count_served("jit")
        state.current().warn_once(("runner", text), f"dsv41-aot: {text} not served from the prebuilt kernels, "
                                  f"FlyDSL JIT-compiles it (fallback mode): {one_line(e)}")
        report_jit_compile(described)
        return None
    state.current().count_served("aot")
    return launcher


JIT_MONITOR = "vllm.utils.jit_monitor"  # vLLM's --jit-monitor-mode (0.33.0): Triton, CuTeDSL, TileLang


def report_jit_compile(what: str) -> None:
    """Tell vLLM's JIT monitor, if active, that FlyDSL JIT-compiles ``what``.

    The monitor (``--jit-monitor-mode``, active after warm-up) watches
    Triton, CuTeDSL and TileLang only. vLLM's runner asks for a launcher
    right before its first launch, where FlyDSL compiles it, so this is the
    moment. The report goes through vLLM's own handler (``_handle_jit_event``,
    the one its hooks call): ``warn`` logs it, ``error`` raises. The monitor
    is never imported here: an active one is already in ``sys.modules``."""
    monitor = sys.modules.get(JIT_MONITOR)
    if monitor is None or not monitor.is_active():
        return
    handle = getattr(monitor, "_handle_jit_event", None)
    if handle is None:  # a vLLM whose monitor reports otherwise: say it here, once
        state.current().warn_once(("runner", "jit_monitor", what),
                                  f"dsv41-aot: FlyDSL JIT compilation during inference: {what} (vLLM's JIT monitor "
                                  "has no _handle_jit_event to report it through)")
        return
    handle(backend="FlyDSL", event="JIT compilation", fn_name=what,
           detail="not served from the prebuilt dsv41-aot kernels (fallback mode)")


# ------------------------------------------------------------------ patching the runner


def _patch(module) -> None:
    """Wrap the runner module's ``build_mono_*`` functions to hand out Launchers.

    Every runner method of every release builds its launchers through them,
    and vLLM memoizes what they return. All or nothing: on any failure
    vLLM's functions are put back and the error raised."""
    with state.current().lock:
        if _state.patched is module:
            return
        missing = [fn for fn in BUILDERS.values() if not callable(getattr(module, fn, None))]
        if missing:
            raise AotError(f"{module.__name__} has no {' / '.join(missing)}: not a vLLM mono runner dsv41-aot "
                           f"serves (vLLM {', '.join(RELEASES)})",
                           fix=f"install a vLLM release dsv41-aot serves, or run without the prebuilt kernels: "
                               f"{ENV_DISABLE}=1")
        originals = {fn: getattr(module, fn) for fn in BUILDERS.values()}

        def wrap(kind: str, original):
            @functools.wraps(original)  # vLLM's name, docstring and __wrapped__
            def build(b):
                launcher = _launcher(f"{original.__name__}({b!r})", lambda: key_of(kind, b, module))
                return launcher if launcher is not None else original(b)  # fallback: vLLM's JIT

            build.__dsv41_aot__ = True
            return build

        try:
            for kind, fn in BUILDERS.items():
                setattr(module, fn, wrap(kind, originals[fn]))
        except BaseException:
            for fn, original in originals.items():
                setattr(module, fn, original)
            raise
        _state.originals = originals
        _state.patched = module
        log.debug("dsv41-aot: patched %s build functions (%s)", module.__name__, _state.mode)


def _give_up(why: BaseException) -> None:
    """Undo a patch that failed during vLLM's import (vLLM keeps its JIT); log once."""
    try:
        uninstall()
        log.warning("dsv41-aot vLLM plugin off: could not patch %s (%s); %s",
                    RUNNER, one_line(why), JIT)
    except Exception:  # noqa: BLE001 - never break vLLM's import
        pass


class _PatchingLoader(importlib.abc.Loader):
    """vLLM's own loader for the runner module, then the patch."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)  # vLLM's own errors are vLLM's
        if _state.mode is not None:
            try:
                _patch(module)
            except Exception as e:  # noqa: BLE001 - the plugin never breaks vLLM's import
                _give_up(e)

    def __getattr__(self, name):  # get_source, get_filename, ... as the inner loader
        return getattr(self._inner, name)


class _RunnerHook(importlib.abc.MetaPathFinder):
    """An import finder that makes the runner module patch itself on import.

    It finds nothing itself: for the runner module only, it asks the finders
    after it and wraps the loader of the spec they return. So installing
    costs nothing where vLLM never imports the mono runner."""

    def find_spec(self, fullname, path, target=None):
        if fullname != RUNNER:
            return None
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and not isinstance(spec.loader, _PatchingLoader):
                        spec.loader = _PatchingLoader(spec.loader)
                    return spec
        except Exception:  # noqa: BLE001 - step aside: the import system asks the finders itself
            return None
        return None


# ------------------------------------------------------------------ install / uninstall


def install(mode: str = "strict", *, prebuilt: str | os.PathLike | None = None, arch: str | None = None) -> None:
    """Make vLLM's mono runner take its launchers from the prebuilt kernels.

    ``prebuilt`` defaults to the loader's directory, ``arch`` to the runner
    package's target arch. Idempotent: a second call only updates the
    settings."""
    if mode not in MODES:
        raise AotError(f"unknown dsv41-aot vLLM mode {mode!r} (one of {', '.join(MODES)})",
                       fix=f"install(mode='strict') or {ENV_MODE}=fallback")
    if arch is not None:
        arch_facts(arch)  # UnknownArchError naming the known ones
    with state.current().lock:
        before = (_state.mode, _state.prebuilt, _state.arch)
        _state.mode = mode
        _state.prebuilt = str(Path(prebuilt).resolve()) if prebuilt is not None else None
        _state.arch = arch
        module = sys.modules.get(RUNNER)
        if module is not None and hasattr(module, "DSV41MonoLayer"):
            state.current().runner_room = None  # the settings may name another arch or directory
            try:
                _patch(module)
            except BaseException:
                if _state.patched is None:  # nothing was installed: back to nothing
                    uninstall()
                else:  # a runner patched earlier stays patched: the previous settings
                    _state.mode, _state.prebuilt, _state.arch = before
                raise
        elif _state.hook is None:
            _state.hook = _RunnerHook()
            sys.meta_path.insert(0, _state.hook)


def uninstall() -> None:
    """Undo install(); runners keep the launchers they memoized."""
    with state.current().lock:
        if _state.patched is not None:
            for name, fn in _state.originals.items():
                setattr(_state.patched, name, fn)
            from . import loader

            loader.running_vllm(None)
        if _state.hook in sys.meta_path:
            sys.meta_path.remove(_state.hook)
        _state.reset()
        state.current().forget_runner()


def installed() -> dict:
    """What install() set up, and the launchers served so far (``served_aot/jit``)."""
    return {"mode": _state.mode, "prebuilt": _state.prebuilt, "patched": _state.patched is not None,
            "hooked": _state.hook is not None, **{f"served_{k}": v for k, v in state.current().served.items()}}
