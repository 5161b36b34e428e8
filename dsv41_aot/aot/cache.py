"""The build cache: compiled objects and JIT proofs stored by their full
build identity, shared by every ``--out`` (``build --cache DIR`` or
``$DSV41_AOT_BUILD_CACHE``; set empty, none). ``--no-cache`` compiles (or
JIT-builds) every key and never opens the cache, neither reading nor writing it.

The cache only ever saves work: a cache that cannot be created, read or
written, and a record whose blob is damaged or is not the key's object,
each become a ``warning:`` and a miss. The key is built for real, and the
build goes on as if there were no cache.

A key compiles to the same bytes whenever its identity is the same (the
pipeline is deterministic, and tests/test_build.py proves it). The identity
is everything those bytes depend on:

- the key (its string and its vLLM release);
- the release's tree: vLLM version and mono sources digest;
- the aiter helpers (upstream's or the project's own, by digest);
- FlyDSL's version, the ``ld.lld`` FlyDSL links with and the ``llvm-strip``
  that strips the export;
- the project's own code that shapes the bytes (``CODE``: the compile,
  export and strip path, the JIT path, the key's MonoBuild fields).

Layout (``<cache>/v1/``)::

    blobs/<sha256>                  bytes, named by their own sha256
    compile/<id[:2]>/<id>.json      {"key", "release", "sha256", "export_bytes", "seconds"}
    jit/<id[:2]>/<id>.json          {"key", "release", "sha256", "params", "identity", "evidence", "seconds"}

A JIT record keeps its run's evidence (``records.Evidence``: the sha256 of the
artifact FlyDSL's JIT produced and of its compiled module, and when), so a proof recorded from
the cache carries what the JIT run that built it produced.

``id`` is the sha256 of the identity. Every file is written atomically (a
blob before the record naming it), so concurrent builders sharing a cache
see a whole record or none. A record's blob is read back and checked by
sha256 on the way out, and a stored object is checked as a fresh compile is
(``buildroom.take_from_cache``); a mismatch is a miss (the record is
dropped and the key compiled again), never a trusted hit. Build side only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..keys import BuildKey
from ..manifest import atomic_write

ENV_BUILD_CACHE = "DSV41_AOT_BUILD_CACHE"  # the loader's DSV41_AOT_CACHE is where bands unpack: another thing
LAYOUT = "v1"
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
    """The cache folder a command uses: none with ``--no-cache``; else
    ``--cache DIR``, else ``$DSV41_AOT_BUILD_CACHE`` (set empty: none), else none."""
    if no_cache:
        return None
    chosen = given or os.environ.get(ENV_BUILD_CACHE)
    return Path(chosen).resolve() if chosen else None


class BuildCache:
    """One cache folder, and the identity parts that are the same for every
    key of a run (``tools``: toolchain.Toolchain). What goes wrong with the
    folder is collected in ``warnings`` (the command prints them: :meth:`say`),
    never raised."""

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

    def say(self, log) -> None:
        """Print the warnings collected so far (``warning: ...``) and forget them."""
        for why in self.warnings:
            print(f"warning: {why}", file=log)
        self.warnings.clear()

    def _cannot_write(self, e: OSError) -> None:
        if self.writable:
            self.writable = False
            self.warnings.append(f"build cache {self.given} cannot be written ({e.strerror or e}): nothing is stored "
                                 f"there this run; pass --cache DIR (or set {ENV_BUILD_CACHE}) to a writable folder, "
                                 f"or --no-cache")

    @staticmethod
    def parts(tools) -> dict:
        """The identity parts every key of a run shares (beside its release's)."""
        from .toolchain import tool_version

        return {"layout": LAYOUT, "code": code_digest(), "strip": tool_version(tools.strip),
                "linker": tools.lld_version, "flydsl_version": tools.flydsl_version}

    def _id(self, what: str, key: BuildKey, ident: dict) -> str:
        doc = {"what": what, "key": str(key), "release": key.release, "identity": ident, **self.common}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    def _record(self, what: str, cid: str) -> Path:
        return self.root / what / cid[:2] / f"{cid}.json"

    def _get(self, what: str, key: BuildKey, ident: dict) -> tuple[dict, bytes] | None:
        path = self._record(what, self._id(what, key, ident))
        try:
            rec = json.loads(path.read_bytes())
            data = (self.root / "blobs" / rec["sha256"]).read_bytes()
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, OSError):  # torn, foreign or unreadable: never trusted
            rec, data = {}, b""
        if rec.get("key") != str(key) or rec.get("release") != key.release \
                or hashlib.sha256(data).hexdigest() != rec.get("sha256"):
            self.drop(path, key, "does not match its blob")
            return None
        return rec, data

    def drop(self, path: Path, key: BuildKey, why: str) -> None:
        """Forget the record at ``path`` (a miss: the key is built again), saying why."""
        self.warnings.append(f"{key.describe()}: cache record {path} {why}; built again")
        if self.writable:
            try:
                path.unlink(missing_ok=True)
            except OSError as e:
                self._cannot_write(e)

    def _put(self, what: str, key: BuildKey, ident: dict, data: bytes, **fields) -> None:
        if not self.writable:
            return
        sha = hashlib.sha256(data).hexdigest()
        rec = {"key": str(key), "release": key.release, "sha256": sha, **fields}
        try:
            atomic_write(self.root / "blobs" / sha, data)  # always: a damaged blob of this name is replaced
            atomic_write(self._record(what, self._id(what, key, ident)),
                         (json.dumps(rec, sort_keys=True) + "\n").encode())
        except OSError as e:
            self._cannot_write(e)

    # a compiled key: its stripped export object

    def get_object(self, key: BuildKey, ident: dict) -> tuple[dict, bytes] | None:
        """(record, stripped object bytes) of ``key`` built under ``ident``
        (buildroom.identity), or None."""
        return self._get("compile", key, ident)

    def reject_object(self, key: BuildKey, ident: dict, why: str) -> None:
        """The object :meth:`get_object` gave is not ``key``'s (``why``): its record is dropped."""
        self.drop(self._record("compile", self._id("compile", key, ident)), key, why)

    def put_object(self, key: BuildKey, ident: dict, data: bytes, export_bytes: int, seconds: float) -> None:
        self._put("compile", key, ident, data, export_bytes=export_bytes, seconds=round(float(seconds), 3))

    # a JIT proof: the GPU code object vLLM's JIT built for the key

    def get_jit(self, key: BuildKey, ident: dict) -> tuple[dict, bytes] | None:
        """(record, JIT code object) of ``key``, or None; a record without
        its run's evidence is a miss (the key is JIT-built again)."""
        hit = self._get("jit", key, ident)
        if hit is not None and not isinstance(hit[0].get("evidence"), dict):
            return None
        return hit

    def reject_jit(self, key: BuildKey, ident: dict, why: str) -> None:
        """The JIT code object :meth:`get_jit` gave is not to be trusted (``why``): its record is dropped."""
        self.drop(self._record("jit", self._id("jit", key, ident)), key, why)

    def put_jit(self, key: BuildKey, ident: dict, code: bytes, params: list, identity: dict, evidence: dict,
                seconds: float) -> None:
        self._put("jit", key, ident, code, params=params, identity=identity, evidence=evidence,
                  seconds=round(float(seconds or 0), 3))


# ---------------------------------------------------------------- command


def identity_digest(tools, matrix_path=None) -> str:
    """One digest of every identity part a build of the matrix's releases
    shares: what a CI cache key names (a changed part starts a new cache;
    entries are keyed per key, so a stale one is only a miss)."""
    from . import compat, matrix

    releases = {v: e.mono_sources for v, e in sorted(matrix.load(matrix_path).releases.items())}
    doc = {"releases": releases, "helpers": compat.install_aiter_shim(),
           **BuildCache.parts(tools)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
