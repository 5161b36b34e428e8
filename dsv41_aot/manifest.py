"""A room's manifest, ``manifest.json``: the keys of one vLLM release on one arch.

The prebuilt directory's layout is in docs/building.md ("vLLM releases").
Objects and bands are named by their content and shared by an arch's rooms.
manifest.json::

    {"schema": 2, "arch": "gfx950", "release": "0.33.0", "mono_sources": "<digest>",
     "abis": {"<abi id>": [{"name": "res_in", "ctype": "int64", "size": 8}, ...]},
     "entries": {"<key string>": {
         "key", "kind", "arch", "fields": {MonoBuild fields},
         "symbol": GPU kernel symbol, "entry": C entry point,
         "object": "objects/<sha256>.o", "sha256", "bytes",
         "code_object_sha256", "code_object_bytes", "abi": "<abi id>",
         "source": {"vllm_version", "mono_sources", "helpers", "flydsl_version", "linker"},
         "resources": {...} (GPU code object figures)}},
     "refused": {"<key string>": {"error", "source"}}}

``mono_sources`` is every entry's ``source.mono_sources``: the runtime picks
its vLLM's room by it. Same inputs give the same bytes, so compile seconds go
to ``timings.json`` (never shipped). ABI lists are shared by id (every K1 has
the same 41 slots), which keeps the manifest small.

Shared core: standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path

from . import commands
from .errors import IntegrityError, ManifestError

SCHEMA = 2  # 2: one manifest per (arch, release) room; 1 was one per arch
MANIFEST = "manifest.json"
OBJECTS = "objects"
LIB = "lib"  # <arch>/lib/: linked library bands, shared by the arch's releases (aot/link.py)
LIBS_JSON = "libs.json"  # <arch>/vllm-<release>/libs.json: which library band holds which key
# libs.json schema 2: compressed bands (per band: file, sha256 and bytes of the
# .so.xz; raw_sha256 and raw_bytes of the library inside it)
LIBS_SCHEMA = 2
BAND_SUFFIX = ".so.xz"
BAND_RE = re.compile(r"libdsv41_[A-Za-z0-9_.-]+\.so\.xz")  # a plain file name in lib/: no "/", no ".."
SHA256_RE = re.compile(r"[0-9a-f]{64}")  # a sha256 digest as the records write it
TIMINGS = "timings.json"  # <arch>/vllm-<release>/timings.json: {key: compile seconds}, never shipped
PREFIX = "vllm-"  # a room's folder is PREFIX + its release (folder_name): spelled here only
ENV_PREBUILT = "DSV41_AOT_PREBUILT"  # the one variable naming a prebuilt directory
PACKAGED = Path(__file__).resolve().parent / "kernels_prebuilt"  # the kernels an installed wheel carries


@dataclass(frozen=True)
class SourceIdentity:
    """What a key is built from: vLLM's mono sources, the aiter helpers, FlyDSL and the linker.

    The one owner of its fields. Same identity, same bytes: a manifest entry
    and a refused key carry it (``as_dict``), the build cache names a key's
    object by it, and a compile worker's ready line says it, which the build
    compares with its own. ``helpers`` is ``compat.install_aiter_shim()``'s
    label. An entry whose identity differs from the build's only in FlyDSL
    or linker (the same ``served``) serves the same vLLM sources
    (docs/building.md, "Moving to another FlyDSL")."""

    vllm_version: str
    mono_sources: str
    helpers: dict = field(hash=False)
    flydsl_version: str
    linker: str

    @classmethod
    def parse(cls, doc, where: str, fix: str) -> "SourceIdentity":
        """The identity of a JSON object; ManifestError naming ``where`` unless it has exactly the fields."""
        names = [f.name for f in fields(cls)]
        if not isinstance(doc, dict) or sorted(doc) != sorted(names) or not isinstance(doc["helpers"], dict) \
                or not all(isinstance(doc[n], str) for n in names if n != "helpers"):
            raise ManifestError(f"{where}: source must name {', '.join(names)} (helpers an object, the rest "
                                f"text), not {doc!r}", fix=fix)
        return cls(**doc)

    def as_dict(self) -> dict:
        return asdict(self)

    def differences(self, other: "SourceIdentity") -> list[str]:
        """The fields in which ``other`` differs, in field order."""
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]

    @property
    def served(self) -> tuple:
        """The parts that decide which vLLM sources the key serves: all but FlyDSL and linker."""
        return self.vllm_version, self.mono_sources, json.dumps(self.helpers, sort_keys=True)


@dataclass(frozen=True)
class Entry:
    """One key's manifest entry: what was built for it and from what.

    ``resources`` and ``export_bytes`` are None when absent (an entry
    recovered from objects/ lacks ``export_bytes``). ``extra`` keeps fields
    this version does not name, so a rewrite gives back the bytes it read."""

    key: str
    kind: str
    arch: str
    fields: dict
    symbol: str
    entry: str
    object: str
    sha256: str
    bytes: int
    code_object_sha256: str
    code_object_bytes: int
    abi: str
    source: SourceIdentity
    resources: dict | None = None
    export_bytes: int | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, doc: dict) -> "Entry":
        """The entry of a JSON object already checked by :meth:`Manifest.parse` or built by the compiler."""
        names = {f.name for f in fields(cls)} - {"extra", "source"}
        return cls(**{k: v for k, v in doc.items() if k in names}, source=SourceIdentity(**doc["source"]),
                   extra={k: v for k, v in doc.items() if k not in names | {"source"}})

    def to_dict(self) -> dict:
        """The entry as manifest.json holds it (absent optional fields left out)."""
        doc = asdict(self)
        extra = doc.pop("extra")
        for name in ("resources", "export_bytes"):
            if doc[name] is None:
                del doc[name]
        return dict(doc, **extra)

    def replace(self, **changes) -> "Entry":
        """A copy with ``changes`` (entries are never edited in place)."""
        return replace(self, **changes)


def entry_name(key: str) -> str:
    """The C entry point a key's exported object defines: unique, so an arch's keys link together."""
    return "dsv41_" + key.replace("@", "_").replace(":", "_").replace(",", "_").replace("=", "")


# the fields every entry must have: Entry's fields without a default
REQUIRED = tuple(f.name for f in fields(Entry) if f.default is MISSING and f.default_factory is MISSING)


def prebuilt_dir() -> Path:
    """The default prebuilt directory, absolute, for every command and the loader.

    ``$DSV41_AOT_PREBUILT``, else the installed package's ``kernels_prebuilt/``
    (what a wheel carries), else the repository's."""
    env = os.environ.get(ENV_PREBUILT)
    if env:
        return Path(env).resolve()
    return PACKAGED if PACKAGED.is_dir() else PACKAGED.parents[1] / "kernels_prebuilt"


def user_cache_dir(sub: str = "", env: str | None = None) -> Path:
    """The user's cache folder for dsv41-aot: ``$XDG_CACHE_HOME/dsv41-aot``, else ``~/.cache/dsv41-aot``.

    With ``sub``, that folder's sub-folder; with ``env``, the folder that
    environment variable names (made absolute) when it is set. An empty
    variable counts as unset. The band cache, the vLLM tree cache, the
    linker shim and the recording HIP keep their folders here."""
    if env and os.environ.get(env):
        return Path(os.environ[env]).resolve()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dsv41-aot" / sub


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader, or a kill, sees the old file or the new, never a torn one."""
    import tempfile  # not at import: the loader reads manifests, never writes them

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide an installed wheel's files from other users
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def abi_id(abi: list) -> str:
    return hashlib.sha256(json.dumps(abi, sort_keys=True).encode()).hexdigest()[:12]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_json(data: bytes, where, fix: str):
    """A record's JSON document; ManifestError naming ``where`` when it is malformed."""
    try:
        return json.loads(data)
    except ValueError as e:
        raise ManifestError(f"{where}: malformed JSON ({e})", fix=fix) from None


def folder_name(release: str) -> str:
    """The name of ``release``'s room folder in an arch folder."""
    return PREFIX + release


def room_name(arch: str, release: str) -> str:
    """``<arch>/vllm-<release>``: a room's path inside a prebuilt directory, and its name in messages."""
    return f"{arch}/{folder_name(release)}"


def room_dir(arch_dir: Path, release: str) -> Path:
    """The folder of ``release``'s keys in an arch folder (known release or not)."""
    return Path(arch_dir) / folder_name(release)


class Manifest:
    """One room's manifest: the keys of one vLLM release on one arch.

    ``dir`` is the arch folder (objects and bands are the arch's), ``room``
    the release's folder in it. ``room.Room.manifest`` reads one."""

    def __init__(self, arch_dir: Path, arch: str, entries: dict | None = None, abis: dict | None = None,
                 refused: dict | None = None, timings: dict | None = None, *, release: str):
        self.dir = Path(arch_dir)
        self.arch = arch
        self.release = release
        self.room = room_dir(self.dir, release)
        self.entries: dict = entries or {}  # key -> Entry
        self.abis: dict = abis or {}
        # keys the kernel source refused, with the error and source identity:
        # a rebuild from the same source reports them again without compiling
        self.refused: dict = refused or {}
        # key -> compile seconds (timings.json)
        self.timings: dict = timings or {}
        self.migrated = False  # read from a manifest that held compile seconds: the next write moves them
        for key, e in self.entries.items():
            if isinstance(e, Entry) and "compile_seconds" in e.extra:
                extra = dict(e.extra)
                self.timings.setdefault(key, extra.pop("compile_seconds"))
                self.entries[key] = e.replace(extra=extra)
                self.migrated = True

    @property
    def path(self) -> Path:
        return self.room / MANIFEST

    @property
    def mono_sources(self) -> str | None:
        """The mono sources digest the entries were built from (None when empty)."""
        digests = {e.source.mono_sources for e in self.entries.values()}
        return next(iter(digests)) if len(digests) == 1 else None

    def mono_sources_text(self) -> str:
        """The mono sources digest as a message names it; an empty or mixed room says so."""
        digests = sorted({e.source.mono_sources for e in self.entries.values()})
        if len(digests) == 1:
            return digests[0]
        return "no keys" if not digests else f"mixed: keys built from {' and '.join(digests)}"

    # ---------------------------------------------------------------- io
    @classmethod
    def parse(cls, raw: bytes, path, arch_dir: Path, arch: str, release: str, fix: str,
              timings: dict) -> "Manifest":
        """Parse manifest.json's bytes: the one parser, for a folder's file or a wheel's member.

        ManifestError naming ``path`` for anything but a schema-2 manifest of
        ``arch`` and ``release`` whose entries are whole, name their own key,
        an ABI that hashes to its id and an object inside objects/.
        ``timings`` is the room's timings.json, which its Room reads."""
        doc = load_json(raw, path, fix)
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise ManifestError(f"{path}: not a schema-{SCHEMA} dsv41-aot manifest", fix=fix)
        if doc.get("arch") != arch:
            raise ManifestError(f"{path}: manifest for {doc.get('arch')!r} in the {arch} folder", fix=fix)
        if doc.get("release") != release:
            raise ManifestError(f"{path}: manifest for vLLM {doc.get('release')!r} in the vLLM {release} folder",
                                fix=fix)
        entries, abis = doc.get("entries"), doc.get("abis")
        if not isinstance(entries, dict) or not isinstance(abis, dict):
            raise ManifestError(f"{path}: entries / abis missing", fix=fix)
        for aid, slots in abis.items():
            if not (isinstance(slots, list) and all(isinstance(s, dict) and set(s) == {"name", "ctype", "size"}
                                                    for s in slots)) or abi_id(slots) != aid:
                raise ManifestError(f"{path}: ABI {aid} is not the slot list its id names", fix=fix)
        for key, e in entries.items():
            missing = [f for f in REQUIRED if f not in e] if isinstance(e, dict) else list(REQUIRED)
            if missing:
                raise ManifestError(f"{path}: entry {key} lacks {', '.join(missing)}", fix=fix)
            if e["key"] != key or e["arch"] != arch:
                raise ManifestError(f"{path}: entry {key} names key {e['key']!r} / arch {e['arch']!r}", fix=fix)
            if e["abi"] not in abis:
                raise ManifestError(f"{path}: entry {key} names unknown ABI {e['abi']}", fix=fix)
            if e["entry"] != entry_name(key):  # the launcher binds the key by this name: never another key's
                raise ManifestError(f"{path}: entry {key} names C entry point {e['entry']!r}, not its own "
                                    f"{entry_name(key)!r}", fix=fix)
            SourceIdentity.parse(e["source"], f"{path}: entry {key}", fix)
            obj = e["object"]  # joined to the arch folder by link and verify: never outside objects/
            if not isinstance(obj, str) or obj.count("/") != 1 or obj.split("/")[0] != OBJECTS \
                    or obj.split("/")[1] in ("", ".", "..") or "\\" in obj:
                raise ManifestError(f"{path}: entry {key} names object {obj!r} outside {arch}/{OBJECTS}/", fix=fix)
        refused = doc.get("refused", {})
        if not isinstance(refused, dict):
            raise ManifestError(f"{path}: refused must be a mapping", fix=fix)
        m = cls(arch_dir, arch, {k: Entry.from_dict(e) for k, e in entries.items()}, abis, refused, timings,
                release=release)
        if entries and doc.get("mono_sources") != m.mono_sources:
            raise ManifestError(f"{path}: mono_sources {doc.get('mono_sources')!r} is not its entries' "
                                f"({m.mono_sources_text()})", fix=fix)
        return m

    def write(self) -> None:
        """Atomically replace manifest.json (entries sorted: same inputs, same bytes)."""
        used = {e.abi for e in self.entries.values()}
        doc = {
            "schema": SCHEMA,
            "arch": self.arch,
            "release": self.release,
            "mono_sources": self.mono_sources,
            "abis": {k: self.abis[k] for k in sorted(used)},
            "entries": {k: self.entries[k].to_dict() for k in sorted(self.entries)},
            "refused": {k: self.refused[k] for k in sorted(self.refused)},
        }
        atomic_write(self.path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
        timings = {k: self.timings[k] for k in sorted(self.timings) if k in self.entries}
        if timings:
            atomic_write(self.room / TIMINGS, (json.dumps(timings, indent=1) + "\n").encode())

    # ---------------------------------------------------------------- entries
    def put(self, entry: "Entry | dict", abi: list, seconds: float | None = None) -> Entry:
        """Add or replace an entry (an Entry, or a worker's JSON of one) and return it.

        ``seconds``, or a ``compile_seconds`` the entry carries, goes to timings.json."""
        aid = abi_id(abi)
        self.abis[aid] = abi
        doc = dict(entry.to_dict() if isinstance(entry, Entry) else entry, abi=aid)
        measured = doc.pop("compile_seconds", None)
        seconds = measured if seconds is None else seconds
        entry = Entry.from_dict(doc)
        if seconds is not None:
            self.timings[entry.key] = round(float(seconds), 3)
        self.entries[entry.key] = entry
        return entry

    def abi(self, key: str) -> list:
        return self.abis[self.entries[key].abi]

    def object_path(self, key: str) -> Path:
        return self.dir / self.entries[key].object

    def check_object(self, key: str) -> None:
        """Raise IntegrityError unless the key's stored object has the manifest's sha256 and size."""
        e = self.entries[key]
        path = self.object_path(key)
        fix = commands.build(self.dir.parent, release=self.release, keys=[key])
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise IntegrityError(f"{key}: object {path} is missing", fix=fix) from None
        if size != e.bytes or sha256_file(path) != e.sha256:
            raise IntegrityError(f"{key}: object {path} does not match its manifest sha256 (corrupt or altered)", fix=fix)


def read_timings(room: Path) -> dict:
    """Key -> compile seconds from a room's ``timings.json``.

    {} when absent or unreadable: timings only balance shards, never decide a build."""
    try:
        doc = json.loads((Path(room) / TIMINGS).read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: float(v) for k, v in doc.items() if isinstance(v, (int, float))}
