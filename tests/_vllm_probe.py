"""Run in a subprocess by test_vllm_plugin.py (one arch per process: vLLM's mono
package fixes its target at import from ARCH). Imports vLLM's runner module in
isolation, applies dsv41_aot.vllm.install(), calls kernels() / ffn_kernel() on
runners made without a GPU and prints one JSON report.

    python tests/_vllm_probe.py PREBUILT MODE ORDER CALLS_JSON [OPTIONS_JSON]

ORDER: ``hook`` installs before the runner is imported (the meta_path hook
patches it), ``now`` after (patched at once). CALLS: a list of
["kernels", tokens, ratio, fold, index] / ["ffn", tokens, experts, topk], each
optionally ending with a dict of runner fields (tp, timeline, experts, topk,
ug_groups, swa_width; vLLM's main-model runner at TP 4 by default, a DSpark
draft runner is ``{"experts": .., "topk": .., "ug_groups": 1, "swa_width": ..}``).
OPTIONS: ``install_arch`` passed to install() as arch=; ``entry: "register"`` enables through
the vLLM entry point (DSV41_AOT_* environment) instead of install();
``runner_without: NAME`` loads a vLLM runner module that lacks that build
function (a vLLM the plugin does not fit), so the plugin's patch fails;
``vllm_src: DIR`` imports the runner of the vLLM tree at DIR (another
release, e.g. 0.32.0's from the tree cache: its calls are that release's,
["kernels", tokens, ratio] / ["ffn", tokens]).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import logging
import os
import sys
import warnings
from pathlib import Path

warnings.simplefilter("ignore")

RUNNER_FIELDS = {"tp": 4, "timeline": False, "experts": 384, "topk": 6, "ug_groups": 2, "swa_width": 128}


def jit_kernel_name(launcher) -> str | None:
    """The kernel name of a vLLM FlyDSL launcher: its ``@flyc.jit`` function
    closes over the ``@flyc.kernel(name=...)`` KernelFunction."""
    fn = getattr(launcher, "func", None)
    for cell in getattr(fn, "__closure__", None) or ():
        v = cell.cell_contents
        if type(v).__name__ == "KernelFunction":
            return v._name
    return None


def describe(x) -> dict:
    from dsv41_aot.runtime.loader import Launcher

    if isinstance(x, Launcher):
        return {"origin": "aot", "key": x.key, "kernel_name": x.kernel_name, "entry": x.entry, "library": x.library,
                "bound": x._lib is not None}
    return {"origin": "jit", "type": type(x).__name__, "kernel_name": jit_kernel_name(x)}


def split(call: list) -> tuple[list, dict]:
    """(the call without its runner fields, the runner's fields)."""
    if call and isinstance(call[-1], dict):
        return call[:-1], dict(RUNNER_FIELDS, **call[-1])
    return call, dict(RUNNER_FIELDS)


def runner(mod, fields: dict):
    """A DSV41MonoLayer made without a GPU, holding only what its
    ``kernels`` / ``ffn_kernel`` read."""
    r = object.__new__(mod.DSV41MonoLayer)
    for name, value in fields.items():
        setattr(r, name, value)
    r._kernels = {}
    return r


class Runners(dict):
    """One runner per distinct set of fields, as vLLM has one per layer kind."""

    def __init__(self, mod):
        super().__init__()
        self.mod = mod

    def of(self, fields: dict):
        k = json.dumps(fields, sort_keys=True)
        if k not in self:
            self[k] = runner(self.mod, fields)
        return self[k]


def ask(runners: Runners, call: list):
    call, fields = split(call)
    r = runners.of(fields)
    return r.kernels(*call[1:]) if call[0] == "kernels" else r.ffn_kernel(*call[1:])


class _Records(logging.Handler):
    seen: list = []

    def emit(self, record):
        _Records.seen.append(record)


class _WithoutMethod(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Loads vLLM's real runner.py, then takes one build function off it:
    the runner of a vLLM the plugin was not written for."""

    def __init__(self, fullname: str, method: str):
        self.fullname, self.method = fullname, method

    def find_spec(self, fullname, path, target=None):
        if fullname != self.fullname:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        self.inner = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        self.inner.exec_module(module)
        delattr(module, self.method)


def mapped(prefix: str) -> list[str]:
    """The files under ``prefix`` this process has mapped, and the kernel
    library bands it dlopened from memory (``memfd:<band without .xz>``)."""
    with open("/proc/self/maps") as f:
        paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    memfds = {p.split(" ")[0][1:] for p in paths if p.startswith("/memfd:libdsv41_")}
    return sorted(p for p in paths if p.startswith(prefix)) + sorted(memfds)


def main(prebuilt: str, mode: str, order: str, calls: list, options: dict) -> dict:
    logging.getLogger("dsv41_aot").addHandler(_Records(logging.WARNING))
    from dsv41_aot import source
    from dsv41_aot.aot import compat
    from dsv41_aot import vllm as plugin
    from dsv41_aot.errors import AotError

    compat.install_aiter_shim()
    src = source.MonoSource(Path(options["vllm_src"]).resolve()) if options.get("vllm_src") else source.find()
    out: dict = {"order": order}

    def install():
        if options.get("entry") == "register":
            os.environ.update(DSV41_AOT_ARCH=os.environ["ARCH"], DSV41_AOT_PREBUILT=prebuilt, DSV41_AOT_MODE=mode)
            plugin.register()
        else:
            plugin.install(mode, prebuilt=prebuilt, arch=options.get("install_arch"))

    def import_runner():
        try:
            return source.import_mono(src, "runner")
        except Exception as e:  # noqa: BLE001 - reported: the plugin must never break this import
            out["import_error"] = f"{type(e).__name__}: {e}"
            return sys.modules.get(plugin.RUNNER)
        finally:
            # the bare parent packages get the spec a real vLLM import gives
            # them, so importlib.util.find_spec("vllm") (the plugin's source
            # check) works as in a vLLM process
            for name in source.PARENTS:
                pkg = sys.modules.get(name)
                if pkg is not None and getattr(pkg, "__spec__", None) is None:
                    pkg.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
                    pkg.__spec__.submodule_search_locations = list(pkg.__path__)

    if options.get("runner_without"):
        sys.meta_path.insert(0, _WithoutMethod(plugin.RUNNER, options["runner_without"]))
    if order == "hook":
        install()
        out["before_import"] = plugin.installed()
        mod = import_runner()
    else:
        mod = import_runner()
        out["before_install"] = {"patched": getattr(getattr(mod, "build_mono_k1", None), "__dsv41_aot__", False)}
        try:
            install()
            if options.get("entry") != "register":
                install()  # idempotent
        except AotError as e:
            out["install_error"] = f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001
            out["install_error"] = f"{type(e).__name__}: {e}"
    out["runner_imported"] = mod is not None and hasattr(mod, "DSV41MonoLayer")
    if not out["runner_imported"]:
        out["installed"] = plugin.installed()
        return out
    out["gfx942"] = bool(getattr(mod, "GFX942", False))
    out["patched"] = bool(getattr(getattr(mod, "build_mono_k1", None), "__dsv41_aot__", False))
    runners = Runners(mod)
    results = []
    for call in calls:
        try:
            got = ask(runners, call)
            again = ask(runners, call)
            if split(call)[0][0] == "kernels":
                res = {"call": call, "k1": describe(got[0]), "k2": describe(got[1]), "memo": got is again}
            else:
                res = {"call": call, "ffn": describe(got), "memo": got is again}
        except AotError as e:
            res = {"call": call, "error": type(e).__name__, "message": str(e)}
        results.append(res)
    out["results"] = results
    # the prebuilt libraries this process mapped, before anything was launched
    out["mapped"] = mapped(os.path.realpath(prebuilt))
    # a second set of runners (vLLM's draft runner is one): launchers from the
    # loader's cache again, no second warning for a key already warned about
    again = Runners(mod)
    for call in calls:
        try:
            ask(again, call)
        except AotError:
            pass
    out["warnings"] = [rec.getMessage() for rec in _Records.seen]
    out["memo_keys"] = sorted(map(str, runners.of(dict(RUNNER_FIELDS))._kernels))
    out["installed"] = plugin.installed()
    # vLLM's own launchers for the same calls: the original methods on fresh runners
    plugin.uninstall()
    out["uninstalled"] = not getattr(getattr(mod, "build_mono_k1", None), "__dsv41_aot__", False)
    fresh = Runners(mod)
    jit = []
    for call in calls:
        try:
            got = ask(fresh, call)
            kernels = split(call)[0][0] == "kernels"
            jit.append({"k1": jit_kernel_name(got[0]), "k2": jit_kernel_name(got[1])} if kernels
                       else {"ffn": jit_kernel_name(got)})
        except Exception as e:  # noqa: BLE001 - a call vLLM itself refuses
            jit.append({"error": f"{type(e).__name__}: {e}"})
    out["vllm"] = jit
    return out


if __name__ == "__main__":
    opts = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), opts)))
