"""vLLM's JIT monitor (``--jit-monitor-mode warn|error``, vLLM 0.33.0's own
``vllm/utils/jit_monitor.py``) is told of a mono launch FlyDSL JIT-compiles
in fallback mode: the monitor watches Triton, CuTeDSL and TileLang, not
FlyDSL. Each case runs in a fresh process that imports vLLM's module
(``activate`` runs once per process), installs the plugin in fallback mode over
an empty prebuilt folder (no key is served) and asks for one key's launcher
twice through the plugin's own per-key decision (``runner_patch._launcher``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
KEY = "k1@gfx950:s=47,tp=4,r=1"

_CASE = """
import json, logging, sys
from dsv41_aot.keys import BuildKey
from dsv41_aot.runtime import runner_patch
import vllm.utils.jit_monitor as monitor  # vLLM's own module

class Seen(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        if record.levelno >= logging.WARNING:
            self.records.append((record.name, record.getMessage()))

seen = Seen()
for name in ("vllm", "dsv41_aot"):
    logging.getLogger(name).addHandler(seen)
mode, prebuilt = sys.argv[1], sys.argv[2]
runner_patch.install("fallback", prebuilt=prebuilt)
if mode != "inactive":
    monitor.activate(mode=mode)
key = BuildKey.parse("KEY", "0.33.0")
out = {"active": monitor.is_active(), "launchers": [], "error": None}
try:
    for _ in range(2):  # vLLM's runner asks once a layer: two layers of one key
        out["launchers"].append(runner_patch._launcher("build_mono_k1(...)", lambda: key))
except RuntimeError as e:
    out["error"] = str(e)
out["monitor"] = [m for n, m in seen.records if n.startswith("vllm")]
out["plugin"] = [m for n, m in seen.records if n.startswith("dsv41_aot")]
print(json.dumps(out))
""".replace("KEY", KEY)


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict:
    """mode -> the report of its process (the three run at once)."""
    empty = tmp_path_factory.mktemp("no-prebuilt-kernels")
    procs = {mode: subprocess.Popen([sys.executable, "-c", textwrap.dedent(_CASE), mode, str(empty)], cwd=REPO,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for mode in ("inactive", "warn", "error")}
    out = {}
    for mode, p in procs.items():
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr[-3000:]
        out[mode] = json.loads(stdout.strip().splitlines()[-1])
    return out


@pytest.mark.slow
def test_warn_mode_logs_one_report_naming_the_key(cases):
    got = cases["warn"]
    assert got["active"] and got["error"] is None and got["launchers"] == [None, None]  # vLLM's JIT serves it
    (report,) = got["monitor"]  # once, however many layers ask for the key
    assert KEY in report and "FlyDSL JIT compilation during inference" in report
    assert len(got["plugin"]) == 1 and KEY in got["plugin"][0]  # the plugin's own fallback line, once


@pytest.mark.slow
def test_error_mode_raises_naming_the_key(cases):
    got = cases["error"]
    assert got["active"] and got["launchers"] == []
    assert KEY in got["error"] and "FlyDSL JIT compilation during inference" in got["error"]


@pytest.mark.slow
def test_an_inactive_monitor_hears_nothing(cases):
    got = cases["inactive"]
    assert not got["active"] and got["error"] is None and got["launchers"] == [None, None]
    assert got["monitor"] == [] and len(got["plugin"]) == 1
