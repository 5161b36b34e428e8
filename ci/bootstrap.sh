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
# uv installs the same requirements from the sources pip is configured with
# (`pip config list`: its find-links, constraints and indexes) in seconds
# where pip takes a minute: it links from its cache where pip unpacks torch's
# wheel again (49 s against 7 s on a 2-core machine, both caches warm).
# Whatever uv cannot install, pip does.
"${pip[@]}" "uv==0.13.9" >/dev/null 2>&1 || echo "bootstrap: pip could not install uv; pip installs the rest" >&2
uv_from=()
[ -x .venv/bin/uv ] && mapfile -t uv_from < <(.venv/bin/python - <<'EOF'
import ast, os, subprocess, sys
from urllib.parse import urlparse
out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
opts = {}
for line in out.splitlines():  # global.find-links='/opt/wheels'; :env: lines (PIP_*) come last and win
    name, _, value = line.partition("=")
    opts[name.split(".", 1)[-1]] = ast.literal_eval(value).split()
for option in ("find-links", "constraint", "index-url", "extra-index-url"):
    for value in opts.get(option, []):
        url = urlparse(value)
        if url.scheme != "file" or os.path.exists(url.path):  # pip passes over a file:// index that is not there
            print(f"--{option}={value}")
if opts.get("cert"):  # a CA bundle of the machine's: uv reads the machine's store
    print("--system-certs")
EOF
)
install() {  # pip install "$@" into .venv: by uv with pip's sources when it can, else by pip
  # --index-strategy: pip's own, the best version across every index
  if [ -x .venv/bin/uv ] && VIRTUAL_ENV="$PWD/.venv" .venv/bin/uv pip install -q --index-strategy unsafe-best-match \
      "${uv_from[@]}" "$@"; then
    return
  fi
  [ -x .venv/bin/uv ] && echo "bootstrap: uv could not install $*; pip does" >&2
  "${pip[@]}" "$@" 2>&1 | grep -v "^WARNING: Location" || true
}
install -e ".[build,test]"
# the releases, newest first: "newest other other ..." on one line
read -r newest others < <(.venv/bin/dsv41-aot facts --json | .venv/bin/python -c '
import json, sys
doc = json.load(sys.stdin)
print(doc["newest"], *[r["version"] for r in reversed(doc["releases"]) if r["version"] != doc["newest"]])') || true
[ -n "$newest" ] || { echo "bootstrap: dsv41-aot facts named no release" >&2; exit 1; }
install --no-deps "vllm==$newest"
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
