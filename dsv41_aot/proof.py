"""A room's proof record, ``verified.json``: each key's proof against vLLM's JIT.

:class:`Proof` is its one parser and serializer. ``dsv41-aot verify
--against-jit --record`` writes it, ``ci/merge.py`` carries it and the
loader never reads it. See docs/architecture.md for proof and evidence.

Shared core: standard library only.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from .errors import ManifestError
from .manifest import SHA256_RE, load_json

VERIFIED = "verified.json"


# Versions, all still readable. 4: evidence names the JIT run's compiled module
# (module_sha256). 3: a key's proofs under other FlyDSL releases ("flydsl"), and
# evidence naming FlyDSL's cache key (cache_key_sha256, shared by every key of one
# arch and kind). 2: that evidence, no "flydsl". 1: no evidence.
PROOF_VERSION = 4
# the evidence digests a proof of each version may carry (version 4 keeps an older proof's as it was)
_OLD_EVIDENCE = (("artifact_sha256", "cache_key_sha256"),)
EVIDENCE_FIELDS = {2: _OLD_EVIDENCE, 3: _OLD_EVIDENCE, 4: (("artifact_sha256", "module_sha256"), *_OLD_EVIDENCE)}
# the digests an evidence may carry, each a deterministic function of the JIT run's inputs
EVIDENCE_DIGESTS = ("artifact_sha256", "module_sha256", "cache_key_sha256", "launch_sha256")
HOST_FIELDS = ("mono_dir",)  # a JIT identity's build-host paths: never written into a proof
# what a key's proof says of its current manifest entry (Proof.verdict)
PROVEN = "proven"  # same code object and vLLM sources, and evidence only a JIT run produced
NO_EVIDENCE = "no_evidence"  # same code object, but nothing a JIT run alone produced (version 1, or copied)
STALE = "stale"  # a proof of another code object (rebuilt since) or of other vLLM sources (KeyProof.change)
PROOF_STATES = (PROVEN, NO_EVIDENCE, STALE)


@dataclass(frozen=True)
class Evidence:
    """What only the JIT run behind a proof produced, so a copied proof cannot carry it.

    The digests of the artifact FlyDSL's JIT cached and of the module in it
    (versions 2 and 3: of FlyDSL's cache key), and when it ran. Nothing
    signs them (docs/releases.md). ``launch_sha256``: the launch both vLLM's
    JIT and the Launcher handed the recording HIP (the stand-in for the AMD
    GPU, ``aot/hiprec``); None in an older proof."""

    artifact_sha256: str
    module_sha256: str | None
    at: str  # UTC, ISO 8601 ("2026-03-01T12:00:00Z")
    cache_key_sha256: str | None = None  # a version-2 or 3 proof's, kept as it was
    launch_sha256: str | None = None

    @property
    def digests(self) -> set:
        return {d for d in (self.artifact_sha256, self.module_sha256, self.cache_key_sha256) if d}

    def as_dict(self) -> dict:
        second = "module_sha256" if self.module_sha256 else "cache_key_sha256"
        out = {"artifact_sha256": self.artifact_sha256, second: getattr(self, second), "at": self.at}
        if self.launch_sha256 is not None:
            out["launch_sha256"] = self.launch_sha256
        return out


@dataclass(frozen=True)
class KeyProof:
    """One key's proof: vLLM's JIT, run as ``jit`` says, built ``code_object_sha256``.

    ``jit`` never holds a build-host path; ``evidence`` is None in a proof older than evidence."""

    key: str
    code_object_sha256: str
    jit: dict = field(hash=False)
    evidence: Evidence | None = None

    def as_dict(self) -> dict:
        return {"code_object_sha256": self.code_object_sha256,
                "jit": {k: v for k, v in self.jit.items() if k not in HOST_FIELDS},
                "evidence": self.evidence.as_dict() if self.evidence else None}

    @property
    def flydsl(self) -> str:
        """The FlyDSL release the JIT run compared under ("" when the proof does not say)."""
        return self.jit.get("flydsl_version") or ""

    def change(self, entry) -> tuple[str, str] | None:
        """What in ``entry`` made the proof stale and how, as (what, detail); else None.

        What is its code object or its vLLM source. Another FlyDSL alone is no
        change: the proof still holds for its own FlyDSL."""
        source = entry.source
        if self.code_object_sha256 != entry.code_object_sha256:
            built = source.flydsl_version
            under = f" by FlyDSL {built}, proven under {self.flydsl or 'an unnamed FlyDSL'}" \
                if built and built != self.flydsl else ""
            return "the code object", f"rebuilt since{under}"
        if "mono_sources" in self.jit and self.jit["mono_sources"] != source.mono_sources:
            return ("the vLLM source", f"mono sources {source.mono_sources}, proven against {self.jit['mono_sources']}")
        return None

    def differences(self, other: "KeyProof") -> list[str]:
        """The fields in which ``other``, a proof of the same key, differs from this one.

        Each is named with both values; a field only one of them carries (an
        older proof's) is not compared, nor the run's time, nor the FlyDSL:
        a key's evidence digests are the same under every FlyDSL that builds
        the same code object (docs/releases.md), so a proof under another
        FlyDSL is compared too."""
        out = []
        if other.code_object_sha256 != self.code_object_sha256:
            out.append(f"code_object_sha256 ({self.code_object_sha256[:16]}, {other.code_object_sha256[:16]})")
        for f in ("release", "vllm_version", "mono_sources"):
            a, b = self.jit.get(f), other.jit.get(f)
            if a is not None and b is not None and a != b:
                out.append(f"jit.{f} ({a}, {b})")
        mine, theirs = self.evidence, other.evidence
        for f in EVIDENCE_DIGESTS if mine and theirs else ():
            a, b = getattr(mine, f), getattr(theirs, f)
            if a is not None and b is not None and a != b:
                out.append(f"evidence.{f} ({a[:16]}, {b[:16]})")
        return out

    def verdict(self, entry) -> str:
        """PROVEN, NO_EVIDENCE or STALE against a manifest entry of its key."""
        if self.change(entry) is not None:
            return STALE
        ev = self.evidence
        if ev is None or ev.digests & {entry.sha256, self.code_object_sha256}:
            return NO_EVIDENCE  # nothing, or the manifest's own digests passed off as the JIT's
        return PROVEN


@dataclass(frozen=True)
class Proof:
    """A room's verified.json: each key's proof against vLLM's JIT."""

    arch: str
    release: str
    keys: dict  # key -> KeyProof under the FlyDSL its object was built with, else its latest
    version: int = PROOF_VERSION
    others: tuple = ()  # KeyProofs of keys under other FlyDSL releases than their ``keys`` proof's

    @classmethod
    def of(cls, arch: str, release: str, proofs, entries: dict) -> "Proof":
        """A room's record of ``proofs`` that prove the code objects of ``entries``.

        The last proof of a key and FlyDSL wins."""
        by_key: dict = {}
        for p in proofs:
            if p.key in entries and entries[p.key].code_object_sha256 == p.code_object_sha256:
                by_key.setdefault(p.key, {})[p.flydsl] = p
        keys, others = {}, []
        for k, ps in by_key.items():
            built = entries[k].source.flydsl_version
            main = ps.get(built) or max(ps.values(), key=lambda p: p.evidence.at if p.evidence else "")
            keys[k] = main
            others += [p for p in ps.values() if p is not main]
        return cls(arch, release, keys, PROOF_VERSION, tuple(sorted(others, key=lambda p: (p.key, p.flydsl))))

    def all(self) -> list:
        """Every proof the record holds: each key's, then those under other FlyDSL releases."""
        return [*self.keys.values(), *self.others]

    def flydsl_counts(self, entries: dict) -> dict:
        """FlyDSL release -> how many of ``entries`` have a PROVEN proof under it."""
        proven = Counter(p.flydsl for p in self.all() if p.key in entries and p.verdict(entries[p.key]) == PROVEN)
        return dict(sorted(proven.items()))

    def changes(self, entries: dict) -> dict:
        """What changed (KeyProof.change) -> how many of the entries' proofs it made stale."""
        found = (self.keys[k].change(e) for k, e in entries.items() if k in self.keys)
        return dict(Counter(change[0] for change in found if change))

    @classmethod
    def parse(cls, data: bytes, where: str, arch: str, release: str, fix: str) -> "Proof":
        """Parse verified.json's bytes: the one parser, for a folder's file or a wheel's member.

        ManifestError naming ``where`` for anything but a record of a known
        version, of ``arch`` and ``release``, whose proofs name keys of the
        arch, well-formed digests, a JIT of the room's release and (from
        version 2) evidence or null. Version-1 proofs count as NO_EVIDENCE."""
        doc = load_json(data, where, fix)
        if not isinstance(doc, dict) or not isinstance(doc.get("keys"), dict):
            raise ManifestError(f"{where}: not a dsv41-aot proof record (verified.json)", fix=fix)
        version = doc.get("version")
        if type(version) is not int or version not in (1, *EVIDENCE_FIELDS):
            raise ManifestError(f"{where}: proof record version {version!r}, this dsv41-aot reads 1 to "
                                f"{PROOF_VERSION}", fix=fix)
        more = doc.get("flydsl", {}) if version >= 3 else {}
        if not isinstance(more, dict) or not all(isinstance(v, dict) for v in more.values()):
            raise ManifestError(f"{where}: flydsl must map a FlyDSL release to its proofs", fix=fix)
        if doc.get("arch") != arch or doc.get("release") != release:
            raise ManifestError(f"{where}: proof record for {doc.get('arch')!r} vLLM {doc.get('release')!r} in the "
                                f"{arch} vLLM {release} folder", fix=fix)
        keys, others = {}, []
        records = [(None, key, rec) for key, rec in doc["keys"].items()]
        records += [(v, key, rec) for v, recs in sorted(more.items()) for key, rec in sorted(recs.items())]
        for under, key, rec in records:
            what = f"{where}: proof of {key}" + (f" under FlyDSL {under}" if under else "")
            if f"@{arch}:" not in key:
                raise ManifestError(f"{what}: not a key of {arch}", fix=fix)
            if not isinstance(rec, dict) or not isinstance(rec.get("code_object_sha256"), str) \
                    or not SHA256_RE.fullmatch(rec["code_object_sha256"]) or not isinstance(rec.get("jit"), dict):
                raise ManifestError(f"{what}: code_object_sha256 / jit missing or malformed", fix=fix)
            jit = rec["jit"]
            if "release" in jit and jit["release"] != release:
                raise ManifestError(f"{what}: proven against vLLM {jit['release']!r}'s JIT, in the vLLM {release} "
                                    f"folder", fix=fix)
            evidence = None
            if set(rec) != {"code_object_sha256", "jit", *(("evidence",) if version > 1 else ())}:
                raise ManifestError(f"{what}: fields {sorted(rec)} are not a version-{version} proof's", fix=fix)
            if version > 1:
                if jit.get("release") != release or not all(isinstance(jit.get(f), str) for f in (
                        "vllm_version", "mono_sources", "flydsl_version")):
                    raise ManifestError(f"{what}: jit must name its release, vllm_version, mono_sources and "
                                        f"flydsl_version", fix=fix)
                if rec["evidence"] is not None:
                    evidence = parse_evidence(rec["evidence"], rec["code_object_sha256"], what, fix, version)
            proof = KeyProof(key, rec["code_object_sha256"], {k: v for k, v in jit.items() if k not in HOST_FIELDS},
                             evidence)
            if under is None:
                keys[key] = proof
            elif jit.get("flydsl_version") != under:
                raise ManifestError(f"{what}: its jit names FlyDSL {jit.get('flydsl_version')!r}", fix=fix)
            elif key not in keys or keys[key].flydsl == under:
                raise ManifestError(f"{what}: the key has no proof of its own in keys, or that one is under FlyDSL "
                                    f"{under} too", fix=fix)
            else:
                others.append(proof)
        return cls(arch, release, keys, version, tuple(others))

    def to_bytes(self) -> bytes:
        """verified.json as written: always the current version, keys sorted."""
        doc = {"version": PROOF_VERSION, "arch": self.arch, "release": self.release,
               "keys": {k: self.keys[k].as_dict() for k in sorted(self.keys)}, "flydsl": {}}
        for p in self.others:
            doc["flydsl"].setdefault(p.flydsl, {})[p.key] = p.as_dict()
        return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()

    def verdict(self, key: str, entry: dict) -> str | None:
        """What ``key``'s proof says of its current manifest ``entry`` (None: no proof)."""
        p = self.keys.get(key)
        return p.verdict(entry) if p else None

    def counts(self, entries: dict) -> dict:
        """How many of ``entries`` have a proof in each state, and how many none (``unproven``)."""
        found = Counter(self.verdict(key, e) for key, e in entries.items())
        return dict(keys=len(entries), **{state: found[state] for state in PROOF_STATES}, unproven=found[None])


def flydsl_text(by_flydsl: dict) -> str:
    """Per-FlyDSL proof counts as a report clause: "; proven under FlyDSL X: 7" ("" if none)."""
    if not by_flydsl:
        return ""
    return "; proven under FlyDSL " + ", ".join(f"{v or '(unnamed)'}: {n}" for v, n in by_flydsl.items())


def parse_evidence(ev, code_sha: str, what: str, fix: str, version: int = PROOF_VERSION) -> Evidence:
    """Parse a proof's evidence, from a JIT answer or a record of ``version``.

    ManifestError naming ``what`` unless it holds its version's digests, a
    UTC time, optionally the launch's sha256, and not the code object's."""
    shapes = EVIDENCE_FIELDS[version]  # Proof.parse reads evidence of version 2 and later only
    named = set(ev) - {"launch_sha256"} if isinstance(ev, dict) else None
    shape = next((f for f in shapes if named == {*f, "at"}), None)
    launch = ev.get("launch_sha256") if isinstance(ev, dict) else None
    if shape is None or not all(isinstance(ev[f], str) and SHA256_RE.fullmatch(ev[f]) for f in shape) \
            or not isinstance(ev["at"], str) or not (launch is None or isinstance(launch, str)
                                                     and SHA256_RE.fullmatch(launch)):
        want = " or ".join(", ".join(f) for f in shapes)
        raise ManifestError(f"{what}: evidence must be {want} (sha256 digests), at and optionally "
                            f"launch_sha256", fix=fix)
    try:
        when = datetime.fromisoformat(ev["at"].replace("Z", "+00:00"))
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise ManifestError(f"{what}: evidence time {ev['at']!r} is not a UTC ISO 8601 time", fix=fix)
    if code_sha in (ev[f] for f in shape):
        raise ManifestError(f"{what}: its evidence repeats the code object's sha256: not what a JIT run produced",
                            fix=fix)
    return Evidence(ev["artifact_sha256"], ev.get("module_sha256"), ev["at"], ev.get("cache_key_sha256"),
                    ev.get("launch_sha256"))
