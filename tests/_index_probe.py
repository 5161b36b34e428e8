"""Run by tests/test_release.py with the python of a fresh venv into which
``dsv41-aot`` was pip-installed from a local package index (one arch a
process: vLLM's mono package fixes its target at import from ARCH). vLLM's
own plugin loader finds the plugin; then vLLM's mono runner, imported as
tests/_vllm_probe.py imports it (bare parent packages: the model package's
own ``__init__`` pulls vLLM's platform code), hands out a Launcher for each
key asked, and the report says whether each came bound from the installed
wheel.

    python tests/_index_probe.py KEYS_JSON

Prints one JSON report. Nothing of the repository is on sys.path.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import json
import sys
import warnings

warnings.simplefilter("ignore")


def where(dist: str) -> str | None:
    try:
        return str(md.distribution(dist).locate_file(""))
    except md.PackageNotFoundError:
        return None


def main(keys: list) -> dict:
    out: dict = {"sys_path": sys.path, "executable": sys.executable}
    out["versions"] = {d: md.version(d) for d in ("dsv41-aot", "vllm", "torch", "flydsl", "packaging",
                                                  "typing_extensions", "numpy")}
    out["dists"] = {d: where(d) for d in ("dsv41-aot", "vllm", "torch", "flydsl")}
    out["entry_points"] = [[e.name, e.value, str(e.dist.locate_file(""))]
                           for e in md.entry_points(group="vllm.general_plugins")]

    import vllm.plugins

    vllm.plugins.load_general_plugins()  # vLLM's own loader: reads the entry points, calls each plugin
    import dsv41_aot
    from dsv41_aot import vllm as plugin

    out["dsv41_aot"] = dsv41_aot.__file__
    out["plugin"] = plugin.__file__
    out["installed"] = plugin.installed()
    out["loaded_by_vllm"] = vllm.plugins.plugins_loaded

    from dsv41_aot import source
    from dsv41_aot.aot import compat
    from dsv41_aot.keys import BuildKey
    from dsv41_aot.runtime.loader import Launcher

    compat.install_aiter_shim()  # the project's aiter helpers, from the installed wheel
    src = source.find()
    mod = source.import_mono(src, "runner")
    out["runner"] = mod.__file__
    out["patched"] = bool(getattr(mod.build_mono_k1, "__dsv41_aot__", False))
    out["gfx942"] = bool(getattr(mod, "GFX942", False))

    def describe(x):
        if isinstance(x, Launcher):
            return {"origin": "aot", "key": x.key, "bound": x._lib is not None, "kernel_name": x.kernel_name}
        return {"origin": "jit", "type": type(x).__name__}

    # every key asked, through the build function vLLM's runner calls for it
    names = {f.name for f in dataclasses.fields(mod.MonoBuild)}
    got = {}
    for key in keys:
        k = BuildKey.parse(key, src.version)  # the installed vLLM's launches
        b = mod.MonoBuild(**{n: getattr(k, n) for n in names})
        try:
            got[key] = describe(getattr(mod, f"build_mono_{k.kind}")(b))
        except Exception as e:  # noqa: BLE001 - reported
            got[key] = {"error": f"{type(e).__name__}: {e}"}
    out["keys"] = got

    # and the runner's own methods, as vLLM's mono decode calls them (a runner made without a GPU)
    r = object.__new__(mod.DSV41MonoLayer)
    for name, value in {"tp": 4, "timeline": False, "experts": 384, "topk": 6, "ug_groups": 2,
                        "swa_width": 128}.items():
        setattr(r, name, value)
    r._kernels = {}
    k1, k2 = r.kernels(4, 1, True, False)
    out["runner_calls"] = {"kernels(4, 1, True, False)": [describe(k1), describe(k2)],
                           "ffn_kernel(4, 384, 6)": describe(r.ffn_kernel(4, 384, 6))}
    with open("/proc/self/maps") as f:
        maps = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    out["bands_mapped"] = sorted(p for p in maps if "libdsv41_" in p)
    out["installed_after"] = plugin.installed()
    return out


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
