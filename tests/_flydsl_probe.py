"""Run in a subprocess by test_flydsl_pin.py, under whichever FlyDSL the
Python running it imports: drives dsv41-aot's real FlyDSL path for one key
and prints one JSON report.

    python tests/_flydsl_probe.py compile|jit KEY OUT

``compile``: the build's compile (``compiler.ArchCompiler``: FlyDSL's JIT
compile without a launch, ``export_to_c``, strip, the object's checks) writes
the key's object under OUT. ``jit``: ``verify --against-jit``'s JIT
(``jit.VllmJit``) compiles the same key through vLLM's runner and finds the
artifact FlyDSL's JIT wrote to its disk cache (OUT/flydsl-cache). Each runs in
the environment its worker gets (``compiler.worker_env``; the disk cache on
for the JIT, off for the compile), re-executing itself to get it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def compile_key(key, out: Path) -> dict:
    """The build's compile of ``key`` into ``out``: what its object records."""
    from dsv41_aot import source
    from dsv41_aot import elf
    from dsv41_aot.aot import toolchain
    from dsv41_aot.aot.compiler import ArchCompiler

    tools = toolchain.find()
    arch_dir = out / key.arch
    comp = ArchCompiler(key.arch, str(source.find().root), str(arch_dir), str(tools.strip), tools.lld_version,
                        release=key.release)
    entry, _ = comp.compile(key)
    meta, code = elf.exported_parts((arch_dir / entry.object).read_bytes(), entry.entry)
    return {"toolchain_flydsl": tools.flydsl_version, "identity_flydsl": entry.source.flydsl_version,
            "export_meta_flydsl": json.loads(meta).get("flydsl_version"),
            "code_object_sha256": entry.code_object_sha256, "export_code_sha256": hashlib.sha256(code).hexdigest()}


def jit_key(key, out: Path) -> dict:
    """verify --against-jit's JIT build of ``key``: its code object and the disk artifact it came from."""
    from dsv41_aot import source
    from dsv41_aot.aot.jit import VllmJit

    jit = VllmJit(key.arch, key.release, str(source.find().root))
    code, params, evidence = jit.code_object(key)
    return {"identity_flydsl": jit.identity["flydsl_version"], "code_object_sha256": hashlib.sha256(code).hexdigest(),
            "params": params, "evidence": evidence,
            "artifacts": sorted(p.name for p in (out / "flydsl-cache").rglob("*.pkl"))}


if __name__ == "__main__":
    from dsv41_aot.aot import toolchain  # noqa: E402
    from dsv41_aot.aot.compiler import worker_env  # noqa: E402
    from dsv41_aot.facts.releases import NEWEST  # noqa: E402
    from dsv41_aot.keys import BuildKey  # noqa: E402

    what, key_arg, out_arg = sys.argv[1], BuildKey.parse(sys.argv[2], NEWEST), Path(sys.argv[3])
    if os.environ.get("ARCH") != key_arg.arch:  # re-run in the worker's environment (the mono package reads ARCH at import)
        import subprocess

        env = worker_env(key_arg.arch, str(toolchain.find().rocm_path), str(out_arg / "flydsl-cache"))
        env["FLYDSL_RUNTIME_ENABLE_CACHE"] = "1" if what == "jit" else "0"
        sys.exit(subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env).returncode)
    import flydsl  # noqa: E402

    report = (compile_key if what == "compile" else jit_key)(key_arg, out_arg)
    print(json.dumps(dict(report, flydsl=flydsl.__version__, flydsl_file=flydsl.__file__)))
