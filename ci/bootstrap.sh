#!/usr/bin/env bash
# Set up everything dsv41-aot builds and tests with, idempotently:
# Debian's LLVM linker and strip (FlyDSL links GPU code objects with ld.lld),
# libamdhip64 to link and dlopen against, a venv with the project and the
# pinned build toolchain, the newest vLLM release (--no-deps: only its kernel
# source is used), and every other release's kernel source in the tree cache
# (dsv41-aot fetch-vllm: its wheel, of which only the model folder is
# unpacked). Which releases those are is `dsv41-aot facts --json`'s
# (dsv41_aot/facts/releases.py), never written here.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
[ -x /usr/lib/llvm-19/bin/ld.lld ] || need_apt+=(lld-19)
[ -x /usr/lib/llvm-19/bin/llvm-strip ] || need_apt+=(llvm-19)
ls /usr/lib/x86_64-linux-gnu/libamdhip64.so* >/dev/null 2>&1 || need_apt+=(libamdhip64-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# the FlyDSL is the one pyproject.toml's build extra pins (why that one: its
# comment there), never named here. --no-compile: byte-compiling torch's,
# FlyDSL's and vLLM's every module took most of the install's time; Python
# compiles the few each process imports on first use instead.
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check --no-compile)
"${pip[@]}" -e ".[build,test]" 2>&1 | grep -v "^WARNING: Location" || true
# the releases, newest first: "newest other other ..." on one line
read -r newest others < <(.venv/bin/dsv41-aot facts --json | .venv/bin/python -c '
import json, sys
doc = json.load(sys.stdin)
print(doc["newest"], *[r["version"] for r in reversed(doc["releases"]) if r["version"] != doc["newest"]])') || true
[ -n "$newest" ] || { echo "bootstrap: dsv41-aot facts named no release" >&2; exit 1; }
"${pip[@]}" --no-deps "vllm==$newest" 2>&1 | grep -v "^WARNING: Location" || true
for v in $others; do
  .venv/bin/dsv41-aot fetch-vllm "$v" >/dev/null
done
# each is installed (found, not imported: importing torch and vLLM here took
# seconds, and the tests import them anyway)
.venv/bin/python - <<'EOF'
import importlib.metadata, importlib.util, sys
gone = [m for m in ("flydsl", "yaml", "tqdm", "pytest", "vllm") if importlib.util.find_spec(m) is None]
if gone:
    sys.exit(f"bootstrap: not importable: {', '.join(gone)} (rm -rf .venv && ci/bootstrap.sh)")
print("bootstrap: ok (flydsl", importlib.metadata.version("flydsl") + ")")
EOF
