"""The build cache: compiled objects and JIT results stored by build identity.

See docs/building.md ("Commands") for the options and the glossary of
docs/architecture.md for what the build identity covers. A key compiles to
the same bytes whenever its identity is the same (tests/test_build.py proves
it), so a hit is copied instead of compiled.

The cache only ever saves work: a folder that cannot be used, or a record
whose blob is damaged or is not the key's object, is a ``warning:`` and a
miss, never a failure and never a trusted hit. A hit's blob is checked by
sha256, and an object also as a fresh compile is (``buildroom.cache_hit``).

Layout (``<cache>/v1/``; ``id`` is the sha256 of the identity)::

    blobs/<sha256>                  bytes, named by their own sha256
    compile/<id[:2]>/<id>.json      {"key", "release", "sha256", "export_bytes", "seconds"}
    jit/<id[:2]>/<id>.json          {"key", "release", "sha256", "params", "identity", "evidence", "seconds"}

Every file is written atomically, a blob before the record naming it, so
builders sharing a cache see a whole record or none. Build side only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..keys import BuildKey
from ..manifest import SourceIdentity, atomic_write

ENV_BUILD_CACHE = "DSV41_AOT_BUILD_CACHE"  # the loader's DSV41_AOT_CACHE is where bands unpack: another thing
LAYOUT = "v1"
COMPILE, JIT = "compile", "jit"  # the two kinds of record: a compiled key's stripped object, a JIT proof's code object
PACKAGE = Path(__file__).resolve().parents[1]
# the project's files whose code decides a stored object's or a JIT proof's bytes
CODE = ("aot/compiler.py", "aot/flydsl_api.py", "aot/worker.py", "aot/jit.py", "keys.py", "source.py", "facts/*.py")


def code_digest() -> str:
    """sha256 over the project's own compile / export / strip / JIT code."""
    h = hashlib.sha256()
    for pattern in CODE:
        for path in sorted(PACKAGE.glob(pattern)):
            h.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def cache_dir(given: str | None, no_cache: bool = False) -> Path | None:
    """The cache folder a command uses, or None.

    ``--no-cache`` wins, then ``--cache DIR``, then ``$DSV41_AOT_BUILD_CACHE``
    (set empty: none)."""
    if no_cache:
        return None
    chosen = given or os.environ.get(ENV_BUILD_CACHE)
    return Path(chosen).resolve() if chosen else None


class BuildCache:
    """One cache folder, with the identity parts every key of a run shares.

    ``tools`` is a toolchain.Toolchain. Problems with the folder are collected
    in ``warnings`` (printed by :meth:`say`), never raised."""

    def __init__(self, root: Path, tools):
        self.given = Path(root)
        self.root = self.given / LAYOUT
        self.warnings: list[str] = []  # said once each, then cleared (say)
        self.writable = True  # False once a write failed: nothing more is tried
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self._cannot_write(e)
        self.common = self.parts(tools)

    def say(self, log=None) -> list[str]:
        """The warnings collected so far, forgotten here; each printed to ``log`` (``warning: ...``) when given."""
        said, self.warnings = self.warnings, []
        for why in said if log is not None else ():
            print(f"warning: {why}", file=log)
        return said

    def _cannot_write(self, e: OSError) -> None:
        if self.writable:
            self.writable = False
            why = "is not a folder" if self.given.is_file() else f"cannot be written ({e.strerror or e})"
            self.warnings.append(f"build cache {self.given} {why}: nothing is stored there this run; pass --cache "
                                 f"DIR (or set {ENV_BUILD_CACHE}) to a writable folder, or --no-cache")

    @staticmethod
    def parts(tools) -> dict:
        """The identity parts every key of a run shares (beside its release's)."""
        from .toolchain import tool_version

        return {"layout": LAYOUT, "code": code_digest(), "strip": tool_version(tools.strip),
                "linker": tools.lld_version, "flydsl_version": tools.flydsl_version}

    def _record(self, what: str, key: BuildKey, ident: SourceIdentity) -> Path:
        doc = {"what": what, "key": str(key), "release": key.release, "identity": ident.as_dict(), **self.common}
        cid = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
        return self.root / what / cid[:2] / f"{cid}.json"

    def get(self, what: str, key: BuildKey, ident: SourceIdentity) -> tuple[dict, bytes] | None:
        """(record, blob) of ``key`` under ``ident`` in kind ``what`` (COMPILE or JIT), or None on a miss."""
        path = self._record(what, key, ident)
        try:
            rec = json.loads(path.read_bytes())
            data = (self.root / "blobs" / rec["sha256"]).read_bytes()
        except (FileNotFoundError, NotADirectoryError):  # no record (or no cache folder: said once, above)
            return None
        except (ValueError, KeyError, TypeError, OSError):  # torn, foreign or unreadable: never trusted
            rec, data = {}, b""
        if rec.get("key") != str(key) or rec.get("release") != key.release \
                or hashlib.sha256(data).hexdigest() != rec.get("sha256"):
            self.drop(path, key, "does not match its blob")
            return None
        return rec, data

    def reject(self, what: str, key: BuildKey, ident: SourceIdentity, why: str) -> None:
        """Drop the record :meth:`get` gave that is not trusted, saying why."""
        self.drop(self._record(what, key, ident), key, why)

    def drop(self, path: Path, key: BuildKey, why: str) -> None:
        """Forget the record at ``path`` (a miss: the key is built again), saying why."""
        self.warnings.append(f"{key.describe()}: cache record {path} {why}; built again")
        if self.writable:
            try:
                path.unlink(missing_ok=True)
            except OSError as e:
                self._cannot_write(e)

    def put(self, what: str, key: BuildKey, ident: SourceIdentity, data: bytes, *, seconds, **fields) -> None:
        """Store ``data`` as ``key``'s blob in kind ``what``, its record holding ``seconds`` and ``fields``.

        COMPILE records give ``export_bytes``; JIT records ``params``,
        ``identity`` and ``evidence`` (see the layout above)."""
        if not self.writable:
            return
        sha = hashlib.sha256(data).hexdigest()
        rec = {"key": str(key), "release": key.release, "sha256": sha, "seconds": round(float(seconds or 0), 3),
               **fields}
        try:
            atomic_write(self.root / "blobs" / sha, data)  # always: a damaged blob of this name is replaced
            atomic_write(self._record(what, key, ident),
                         (json.dumps(rec, sort_keys=True) + "\n").encode())
        except OSError as e:
            self._cannot_write(e)


# ---------------------------------------------------------------- command


def identity_digest(tools, matrix_path=None) -> str:
    """A digest of the identity parts every build of the matrix's releases shares.

    A CI cache key names it: a changed part starts a new cache. Entries are
    keyed per key, so a stale one is only a miss."""
    from . import compat, matrix

    doc = {"releases": matrix.load(matrix_path).releases, "helpers": compat.install_aiter_shim(),
           **BuildCache.parts(tools)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def contents(folder: Path | None) -> tuple[dict, int]:
    """What a cache folder holds: records per kind ({COMPILE, JIT}) and the bytes of all its files."""
    counts, size = {COMPILE: 0, JIT: 0}, 0
    root = Path(folder) / LAYOUT if folder is not None else None
    if root is not None and root.is_dir():
        for what in counts:
            counts[what] = sum(1 for _ in (root / what).glob("*/*.json"))
        size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    return counts, size
