"""Run in a subprocess by test_vllm_plugin.py (one arch per process: vLLM's mono
package fixes its target at import from ARCH). Imports vLLM's runner module in
isolation, applies dsv41_aot.vllm.install(), calls kernels() / ffn_kernel() on
a runner made without a GPU and prints one JSON report.

    python tests/_vllm_probe.py PREBUILT MODE ORDER CALLS_JSON

ORDER: ``hook`` installs before the runner is imported (the meta_path hook
patches it), ``now`` after (patched at once). CALLS: a list of
["kernels", tokens, ratio, fold, index] / ["ffn", tokens, experts, topk].
"""

from __future__ import annotations

import json
import logging
import sys
import warnings

warnings.simplefilter("ignore")


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
        return {"origin": "aot", "key": x.key, "kernel_name": x.kernel_name, "entry": x.entry, "library": x.library}
    return {"origin": "jit", "type": type(x).__name__, "kernel_name": jit_kernel_name(x)}


def runner(mod, tp=4, experts=384, topk=6, ug_groups=2, swa_width=128):
    r = object.__new__(mod.DSV41MonoLayer)
    r.tp, r.timeline = tp, False
    r.experts, r.topk, r.ug_groups, r.swa_width = experts, topk, ug_groups, swa_width
    r._kernels = {}
    return r


class _Records(logging.Handler):
    seen: list = []

    def emit(self, record):
        _Records.seen.append(record)


def main(prebuilt: str, mode: str, order: str, calls: list) -> dict:
    logging.getLogger("dsv41_aot").addHandler(_Records(logging.WARNING))
    from dsv41_aot import source
    from dsv41_aot.build import compat
    from dsv41_aot import vllm as plugin
    from dsv41_aot.errors import KeyNotPrebuiltError

    compat.install_aiter_shim()
    src = source.find()
    out: dict = {"order": order}
    if order == "hook":
        plugin.install(mode, prebuilt=prebuilt)
        out["before_import"] = plugin.installed()
        mod = source.import_mono(src, "runner")
    else:
        mod = source.import_mono(src, "runner")
        out["before_install"] = {"patched": getattr(mod.DSV41MonoLayer.kernels, "__dsv41_aot__", False)}
        plugin.install(mode, prebuilt=prebuilt)
        plugin.install(mode, prebuilt=prebuilt)  # idempotent
    out["gfx942"] = bool(mod.GFX942)
    out["patched"] = bool(getattr(mod.DSV41MonoLayer.kernels, "__dsv41_aot__", False))
    r = runner(mod)
    results = []
    for call in calls:
        try:
            if call[0] == "kernels":
                got = r.kernels(*call[1:])
                again = r.kernels(*call[1:])
                res = {"call": call, "k1": describe(got[0]), "k2": describe(got[1]), "memo": got is again}
            else:
                got = r.ffn_kernel(*call[1:])
                res = {"call": call, "ffn": describe(got), "memo": got is r.ffn_kernel(*call[1:])}
        except KeyNotPrebuiltError as e:
            res = {"call": call, "error": "KeyNotPrebuiltError", "message": str(e)}
        results.append(res)
    out["results"] = results
    # a second runner (vLLM's draft runner is one): launchers from the loader's
    # cache again, no second warning for a key already warned about
    r_again = runner(mod)
    for call in calls:
        try:
            r_again.kernels(*call[1:]) if call[0] == "kernels" else r_again.ffn_kernel(*call[1:])
        except KeyNotPrebuiltError:
            pass
    out["warnings"] = [rec.getMessage() for rec in _Records.seen]
    out["memo_keys"] = sorted(map(str, r._kernels))
    out["installed"] = plugin.installed()
    # vLLM's own launchers for the same calls: the original methods on a fresh runner
    plugin.uninstall()
    out["uninstalled"] = not getattr(mod.DSV41MonoLayer.kernels, "__dsv41_aot__", False)
    r2 = runner(mod)
    jit = []
    for call in calls:
        if call[0] == "kernels":
            k1, k2 = r2.kernels(*call[1:])
            jit.append({"k1": jit_kernel_name(k1), "k2": jit_kernel_name(k2)})
        else:
            jit.append({"ffn": jit_kernel_name(r2.ffn_kernel(*call[1:]))})
    out["vllm"] = jit
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))))
