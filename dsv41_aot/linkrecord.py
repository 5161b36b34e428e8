"""A room's link record, ``libs.json``: which band links which key.

:class:`LinkRecord` is its one parser and serializer; :class:`Band` is one
band and the checks of its bytes.

Shared core: standard library only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .elf import ElfError, dynamic_info, kernel_names
from .errors import IntegrityError, ManifestError
from .manifest import BAND_RE, BAND_SUFFIX, LIBS_JSON, LIBS_SCHEMA, SHA256_RE, load_json


def soname(chunk: str, members: dict) -> str:
    """The SONAME of a band's library: its chunk and a digest of its members.

    ``members`` maps a key to the sha256 of the object it was linked from,
    so a band linked from other objects has another SONAME."""
    digest = hashlib.sha256(json.dumps(members, sort_keys=True).encode()).hexdigest()[:12]
    return f"{chunk}.{digest}.so"


def band_file(chunk: str, sha256: str) -> str:
    """A band's file name: its chunk and the head of its xz bytes' sha256, which ``Band.unpack`` checks."""
    return f"{chunk}.{sha256[:16]}{BAND_SUFFIX}"


def kernel_problem(codes: dict, entry, release: str) -> str | None:
    """Why a band holding GPU code objects ``codes`` (sha256 -> bytes) cannot launch vLLM ``release``'s ``entry``.

    The entry must name its key's own kernel (``BuildKey.kernel_symbol``,
    what the build writes), and the band must hold the entry's code object,
    defining that kernel: the one the launcher asks HIP for at the key's
    first call. None when it can."""
    from .keys import BuildKey  # at first use: the loader's import stays a few stdlib modules

    own = BuildKey.parse(entry.key, release).kernel_symbol  # Room.manifest refuses a key that does not parse
    if entry.symbol != own:
        return f"serves {entry.key} as kernel {entry.symbol}, not its own {own}: the manifest names another kernel"
    code = codes.get(entry.code_object_sha256)
    if code is None:
        return f"holds no GPU code object of sha256 {entry.code_object_sha256[:16]} (the manifest's for {entry.key})"
    try:
        kernels = kernel_names(code)
    except ValueError as e:  # ElfError too
        kernels = [f"unreadable ({e})"]
    if entry.symbol not in kernels:
        return (f"holds {entry.key}'s GPU code object {entry.code_object_sha256[:16]}, but it defines kernel "
                f"{', '.join(kernels) or 'none'}, not {entry.symbol}, the one its manifest names: its first launch "
                f"would fail")
    return None


@dataclass(frozen=True)
class Band:
    """One band as libs.json records it: a .so.xz in the arch's lib/ and the keys it links."""

    chunk: str
    file: str
    sha256: str
    bytes: int
    raw_sha256: str
    raw_bytes: int
    entries: dict = field(hash=False, compare=True)  # key -> object sha256

    def unpack(self, data: bytes, where: Path, fix: str) -> bytes:
        """The library inside the band's bytes, after checking every digest.

        The library must match raw_sha256 and raw_bytes, and carry the
        SONAME of the objects libs.json names for its keys."""
        import lzma  # only when a band is read: importing the room stays cheap

        if self.file != (named := band_file(self.chunk, self.sha256)):  # link names each band by its bytes
            raise IntegrityError(f"{where}: its name is not {named}, the one {LIBS_JSON}'s chunk and sha256 for it "
                                 f"make (a renamed band, or an edited record)", fix=fix)
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise IntegrityError(f"{where} does not match the sha256 in {LIBS_JSON} (corrupt or altered)", fix=fix)
        try:
            raw = lzma.decompress(data, format=lzma.FORMAT_XZ)
        except lzma.LZMAError as e:  # only a libs.json whose sha256 was forged with the file gets here
            raise IntegrityError(f"{where}: not an xz band ({e})", fix=fix) from None
        if len(raw) != self.raw_bytes or hashlib.sha256(raw).hexdigest() != self.raw_sha256:
            raise IntegrityError(f"{where} decompresses to a library whose sha256 is not the raw_sha256 in "
                                 f"{LIBS_JSON} (altered band or link record)", fix=fix)
        name = soname(self.chunk, self.entries)
        try:
            linked_as = dynamic_info(raw, symbols=False)["soname"]
        except ElfError:
            linked_as = None  # not a shared library at all
        if linked_as != name:
            raise IntegrityError(f"{where} was not linked from the objects {LIBS_JSON} names for its keys (its "
                                 f"library is not {name}): another room's or an older link's band", fix=fix)
        return raw


@dataclass(frozen=True)
class LinkRecord:
    """A room's libs.json: which band links which key."""

    arch: str
    release: str
    bands: tuple
    band_of: dict  # key -> Band

    HIP_NOTE = "undefined in every library; the loader opens the host's libamdhip64 first"

    @classmethod
    def of(cls, arch: str, release: str, bands) -> "LinkRecord":
        """The record of ``bands``, each key linked once."""
        bands = tuple(bands)
        return cls(arch, release, bands, {k: b for b in bands for k in b.entries})

    def to_bytes(self) -> bytes:
        """libs.json as written: the same bands give the same bytes."""
        doc = {"schema": LIBS_SCHEMA, "arch": self.arch, "release": self.release, "hip": self.HIP_NOTE,
               "libraries": [asdict(b) for b in self.bands]}
        return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def parse(cls, data: bytes, where: str, arch: str, release: str, fix: str) -> "LinkRecord":
        """Parse libs.json's bytes: the one parser, for a folder's file or a wheel's member.

        ManifestError naming ``where`` for anything but a schema-2 record of
        ``arch`` and ``release`` whose bands are plain file names with
        well-formed digests, each key linked once."""
        doc = load_json(data, where, fix)
        if not isinstance(doc, dict):
            raise ManifestError(f"{where}: not a dsv41-aot link record", fix=fix)
        if doc.get("arch") != arch or doc.get("release") != release:
            raise ManifestError(f"{where}: link record for {doc.get('arch')!r} vLLM {doc.get('release')!r} in the "
                                f"{arch} vLLM {release} folder", fix=fix)
        if doc.get("schema") != LIBS_SCHEMA:
            raise ManifestError(f"{where}: link record schema {doc.get('schema')!r}, this dsv41-aot reads "
                                f"{LIBS_SCHEMA} (compressed bands)", fix=fix)
        bands, band_of = [], {}
        try:
            for lib in doc["libraries"]:
                name = lib["file"]
                if not isinstance(name, str) or not BAND_RE.fullmatch(name):
                    raise ManifestError(f"{where}: library {lib.get('chunk')!r} names file {name!r}, not a band "
                                        f"file of lib/", fix=fix)
                if not all(isinstance(lib[f], str) and SHA256_RE.fullmatch(lib[f]) for f in ("sha256", "raw_sha256")) \
                        or not all(type(lib[f]) is int for f in ("bytes", "raw_bytes")) \
                        or not isinstance(lib["chunk"], str) or not isinstance(lib["entries"], dict):
                    raise ManifestError(f"{where}: library {name}: chunk / sha256 / raw_sha256 / bytes / raw_bytes / "
                                        f"entries malformed", fix=fix)
                band = Band(lib["chunk"], name, lib["sha256"], lib["bytes"], lib["raw_sha256"], lib["raw_bytes"],
                            dict(lib["entries"]))
                for key, sha in band.entries.items():
                    if key in band_of:
                        raise ManifestError(f"{where}: {key} is linked by {band_of[key].file} and {name}", fix=fix)
                    if not (isinstance(sha, str) and SHA256_RE.fullmatch(sha)):
                        raise ManifestError(f"{where}: {name} links {key} from object {sha!r}, not a sha256", fix=fix)
                    band_of[key] = band
                bands.append(band)
        except (KeyError, TypeError, AttributeError):
            raise ManifestError(f"{where}: not a dsv41-aot link record", fix=fix) from None
        return cls(arch, release, tuple(bands), band_of)
