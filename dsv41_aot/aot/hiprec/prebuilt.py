"""The prebuilt side of ``verify --against-jit``'s launch comparison.

Each key's prebuilt Launcher (``load_key``, the public path) is launched once
through the recording HIP, the stand-in for the AMD GPU (MOCK-GPU), in a
fresh process whose only HIP it is. That process reads a JSON job on stdin,
imports only the runtime, names the release's mono tree as the running vLLM
(so the loader's source check is the serving one), and answers per key None
(it launched) or the loader's error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from . import Stream, env, kernel_metadata, launch_values, recorded_launch, write_layout_file


def launch_argv() -> list[str]:
    """The command of the prebuilt launch process."""
    return [sys.executable, "-m", "dsv41_aot.aot.hiprec.prebuilt"]


def prebuilt_launches(man, mono_dir: Path, codes: dict, lib: Path, folder: Path) -> dict:
    """key -> its prebuilt launch (``recorded_launch``'s dict) or what went wrong.

    ``codes`` maps each key (a BuildKey) of manifest ``man``'s room to its GPU code object;
    the launches go through the recording HIP ``lib`` and log into ``folder``."""
    from ..integrity import scalar_slots  # here: the launch process below imports only the runtime

    folder.mkdir(parents=True, exist_ok=True)
    layouts = folder / "layouts.tsv"
    write_layout_file(layouts, [kernel_metadata(code) for code in codes.values()])
    order = sorted(codes, key=str)
    job = {"root": str(man.dir.parent), "release": man.release, "mono_dir": str(mono_dir), "layouts": str(layouts),
           "keys": [{"key": str(k), "log": str(folder / f"{i}.hip.log"),
                     "values": launch_values([s["ctype"] for s in scalar_slots(man.abi(str(k)))])}
                    for i, k in enumerate(order)]}
    run_env = {k: v for k, v in os.environ.items() if not k.startswith(("DSV41_AOT_", "RECORDING_HIP_"))}
    run_env.update(env(lib, None, arch=man.arch))
    run_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[3]),
                                                          run_env.get("PYTHONPATH")]))
    proc = subprocess.run(launch_argv(), input=json.dumps(job), capture_output=True, text=True, env=run_env,
                          timeout=600)
    try:
        answers = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:]) or "(no output)"
        return {k: f"the prebuilt launch process failed (exit {proc.returncode}): {tail}" for k in codes}
    out = {k: answers.get(str(k), "no answer") for k in order}  # None: it launched
    for k, asked in zip(order, job["keys"]):
        if out[k] is None:
            try:
                out[k] = recorded_launch(Path(asked["log"]), f"{k}: the prebuilt launch")
            except Exception as e:  # noqa: BLE001 - its text is the key's problem
                out[k] = str(e)
    return out


def _main() -> int:
    """The prebuilt launch process: one launch per key of the job on stdin."""
    job = json.loads(sys.stdin.read())
    from ...errors import AotError
    from ...runtime import loader

    loader.running_vllm(Path(job["mono_dir"]))
    os.environ["RECORDING_HIP_KERNELS"] = job["layouts"]
    answers = {}
    for k in job["keys"]:
        os.environ["RECORDING_HIP_LOG"] = k["log"]  # read by the recording HIP at each call
        try:
            launcher = loader.load_key(k["key"], release=job["release"], prebuilt=job["root"])
            launcher(*k["values"], stream=Stream())
            answers[k["key"]] = None
        except AotError as e:
            answers[k["key"]] = e.message
        finally:
            os.environ.pop("RECORDING_HIP_LOG", None)
    print(json.dumps(answers))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
