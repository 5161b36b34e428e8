"""vLLM's mono package, the kernel source: where it is, its digest, its import.

:func:`import_mono` registers the package's parents as bare packages, so
importing it does not import all of vLLM. :func:`mono_digest` recomputes
vLLM's own ``SOURCES`` (``common/plan.source_digest``) without importing
anything. A build takes one vLLM tree per release (:func:`find_release`).

Shared core: standard library only.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path

from .errors import ToolchainError
from .manifest import user_cache_dir

MONO_REL = Path("vllm/models/deepseek_v41/amd/mono")
MODEL_REL = "vllm/models/deepseek_v41/"  # what a fetched tree keeps of the wheel
PARENTS = ("vllm", "vllm.models", "vllm.models.deepseek_v41", "vllm.models.deepseek_v41.amd")
MONO = "vllm.models.deepseek_v41.amd.mono"
ENV_TREES = "DSV41_AOT_VLLM_TREES"  # the tree cache (default: manifest.user_cache_dir("vllm"))


def fix_vllm(release: str | None = None) -> str:
    """How to get vLLM ``release``'s kernel source (None: any release
    ``dsv41-aot facts`` lists)."""
    v = release or "VERSION"
    where = "" if release else " (a release `dsv41-aot facts` lists)"
    return (f"dsv41-aot fetch-vllm {v}{where}  (or pip install --no-deps vllm=={v}, "
            f"or pass --vllm-src PATH to a vLLM {v} tree)")


FIX_VLLM = fix_vllm()


def _installed_root() -> Path | None:
    """The folder holding the installed ``vllm`` package, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve().parent


@dataclass(frozen=True)
class MonoSource:
    """One vLLM tree holding the mono package."""

    root: Path  # the folder holding the ``vllm`` package

    @functools.cached_property
    def version(self) -> str:
        """vLLM's version ("unknown" for a checkout without one), read only when asked.

        From its dist-info beside the package, else ``vllm/_version.py``."""
        for info in sorted(self.root.glob("vllm-*.dist-info")):
            meta = info / "METADATA"
            if meta.is_file():
                for line in meta.read_text(errors="replace").splitlines():
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
        return assigned(self.root / "vllm" / "_version.py", "__version__") or "unknown"

    @property
    def mono_dir(self) -> Path:
        """The mono package's folder."""
        return self.root / MONO_REL

    @property
    def digest(self) -> str:
        return mono_digest(self.mono_dir)


def assigned(path: Path, name: str) -> str | None:
    """The string a Python file last assigns to ``name`` at its top level (read, never run); None if none.

    ``__version__ = version = '0.33.0'``, as setuptools-scm writes ``_version.py``, reads as 0.33.0."""
    try:
        body = ast.parse(path.read_bytes()).body
    except (OSError, SyntaxError, ValueError):
        return None
    return next((n.value.value for n in reversed(body) if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                 and any(getattr(t, "id", None) == name for t in n.targets)), None)


def mono_digest(mono_dir: Path) -> str:
    """vLLM's ``mono.sources.SOURCES`` for the package in ``mono_dir``.

    The sha256 of each ``.py`` file's relative path, then its bytes, files
    sorted; the first 16 hex digits."""
    files = sorted(mono_dir.rglob("*.py"))
    if not files:
        raise ToolchainError(f"no mono kernel sources under {mono_dir}", fix=FIX_VLLM)
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(mono_dir)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def find(vllm_src: str | os.PathLike | None = None) -> MonoSource:
    """The vLLM tree at ``vllm_src``, else the installed vLLM, of any release."""
    if vllm_src is not None:
        root = Path(vllm_src).resolve()
        if not (root / "vllm").is_dir():
            raise ToolchainError(f"--vllm-src {root}: no vllm/ package folder there", fix=FIX_VLLM)
    else:
        root = _installed_root()
        if root is None:
            raise ToolchainError("vLLM is not installed: it is the kernel source dsv41-aot compiles", fix=FIX_VLLM)
    src = MonoSource(root=root)
    if not src.mono_dir.is_dir():
        raise ToolchainError(f"vLLM at {root} ({src.version}) has no mono package at {MONO_REL}", fix=FIX_VLLM)
    return src


def trees_dir() -> Path:
    """The tree cache that ``fetch`` fills: ``$DSV41_AOT_VLLM_TREES``, else the user's cache folder's ``vllm/``."""
    return user_cache_dir("vllm", ENV_TREES)


def release_trees(releases, digests: dict, trees=()) -> dict:
    """Map each of ``releases`` to the vLLM tree its keys are built from (``find_release``).

    ``digests`` maps a release to its mono sources digest. A tree of
    ``trees`` (--vllm-src folders) that is none of their releases is refused
    first: it would be passed over silently for another."""
    for t in trees:
        given = MonoSource(root=Path(t).resolve())
        if given.mono_dir.is_dir() and given.version not in digests and given.digest not in digests.values():
            known = ", ".join(f"vLLM {v} {d}" for v, d in digests.items())
            raise ToolchainError(
                f"--vllm-src {t}: vLLM {given.version} with mono sources digest {given.digest} is no release the "
                f"matrix builds ({known})",
                fix="pass a vLLM tree of one of those releases; or, if a release really is this tree, update its "
                    "mono_sources in build_matrix.yaml")
    return {release: find_release(release, digests.get(release), tuple(trees)) for release in sorted(set(releases))}


def find_release(release: str, digest: str | None, trees=()) -> MonoSource:
    """The vLLM tree to build ``release`` from.

    The first of ``trees`` (--vllm-src folders), the installed vLLM and the
    tree cache whose version is ``release`` (for a checkout without one:
    whose digest is ``digest``). A tree of that version with another digest
    is refused, naming both."""
    # (how messages name it, its root, whether the command line named it: then it must hold the package)
    candidates: list[tuple[str, Path, bool]] = [(f"--vllm-src {t}", Path(t), True) for t in trees]
    if (installed := _installed_root()) is not None:
        candidates.append(("installed vLLM", installed, False))
    candidates.append((f"tree cache {trees_dir() / release}", trees_dir() / release, False))
    seen = []
    for where, root, named in candidates:
        src = MonoSource(root=root.resolve())
        if not src.mono_dir.is_dir():
            if named:
                raise ToolchainError(f"{where}: no vLLM mono package at {src.mono_dir}", fix=fix_vllm(release))
            continue
        version = src.version
        if version == release or (version == "unknown" and digest and src.digest == digest):
            if digest and src.digest != digest:
                raise ToolchainError(
                    f"{where} ({root}) is vLLM {release}, but its mono sources digest is {src.digest}, not the "
                    f"{digest} build_matrix.yaml records for vLLM {release}: a patched or different tree",
                    fix=f"{fix_vllm(release)}; or, if vLLM {release} really is this, update its mono_sources "
                        f"in build_matrix.yaml")
            return src
        seen.append(f"{where}: {version}")
    raise ToolchainError(f"no vLLM {release} tree to build its keys from ({'; '.join(seen) or 'none found'})",
                         fix=fix_vllm(release))


def fetch(release: str, dest: Path | None = None, *, log=None) -> MonoSource:
    """Fetch vLLM ``release``'s kernel source into the tree cache, or ``dest``.

    Only the model folder and dist-info of its wheel (``pip download
    --no-deps``) are unpacked. Build side; a tree is there whole or not at all."""
    import shutil
    import subprocess
    import tempfile
    import zipfile

    dest = Path(dest) if dest else trees_dir() / release
    if (dest / MONO_REL).is_dir() and MonoSource(dest).version == release:
        return MonoSource(dest.resolve())
    try:  # a folder that cannot be written: bad input, before anything is fetched
        dest.parent.mkdir(parents=True, exist_ok=True)
        scratch = tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.")
    except OSError as e:
        raise ToolchainError(f"cannot unpack vLLM {release} into {dest} ({e.strerror or e})",
                             fix=f"pass --dest DIR in a folder you can write (or set {ENV_TREES} to one)") from None
    with scratch as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", tmp, f"vllm=={release}"]
        if log:
            log(f"fetching vLLM {release}'s wheel (pip download --no-deps)")
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wheels = sorted(Path(tmp).glob(f"vllm-{release}-*.whl"))
        if r.returncode or not wheels:
            raise ToolchainError(f"pip download vllm=={release} failed: {(r.stderr or r.stdout).strip()[-1500:]}",
                                 fix=f"check the package index is reachable, or unpack vllm=={release} yourself "
                                     f"and pass --vllm-src PATH")
        tree = Path(tmp) / "tree"
        info = f"vllm-{release}.dist-info/"
        with zipfile.ZipFile(wheels[0]) as z:
            for name in z.namelist():
                if (name.startswith(MODEL_REL) and name.endswith(".py")) or name == info + "METADATA":
                    target = (tree / name).resolve()
                    if not target.is_relative_to(tree.resolve()):
                        raise ToolchainError(f"{wheels[0].name}: member {name!r} escapes the tree", fix="report it")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(z.read(name))
        if not (tree / MONO_REL).is_dir():
            raise ToolchainError(f"vLLM {release}'s wheel has no mono package at {MONO_REL}",
                                 fix="pick a vLLM release that ships the DeepSeek-V4.1 mono decode layer")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tree, dest)
    return MonoSource(dest.resolve())


def import_mono(src: MonoSource, module: str = "layer") -> types.ModuleType:
    """Import one module of the mono package from ``src``, its parents as bare packages.

    Set ``ARCH`` first: the package fixes its target at import
    (``common/arch.py``). Build side only: this imports flydsl (and torch)."""
    for i, name in enumerate(PARENTS):
        if sys.modules.get(name) is not None:
            continue
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(src.root.joinpath(*name.split(".")))]
        pkg.__package__ = name
        sys.modules[name] = pkg
        if i:
            setattr(sys.modules[PARENTS[i - 1]], name.rsplit(".", 1)[1], pkg)
    return importlib.import_module(f"{MONO}.{module}")
