"""A room's proof record, ``verified.json``: each key's proof against vLLM's JIT.

:class:`Proof` has the one parser and the one serializer; ``room.Room``
reads it.

Shared core: standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

from .errors import ManifestError
from .manifest import SHA256_RE

VERIFIED = "verified.json"


# 4: each proof's evidence names its JIT run's compiled module (module_sha256); 3: a key's proofs under other
# FlyDSL releases kept beside its own ("flydsl"), evidence naming FlyDSL's cache key (cache_key_sha256: the same
# for every key of one arch and kind); 2: that evidence, no "flydsl"; 1: no evidence. Older proofs stay readable.
PROOF_VERSION = 4
# the evidence digests a proof of each version may carry (a version-4 record keeps an older proof's as it was)
_OLD_EVIDENCE = (("artifact_sha256", "cache_key_sha256"),)
EVIDENCE_FIELDS = {2: _OLD_EVIDENCE, 3: _OLD_EVIDENCE, 4: (("artifact_sha256", "module_sha256"), *_OLD_EVIDENCE)}
HOST_FIELDS = ("mono_dir",)  # a JIT identity's build-host paths: never written into a proof
# what a key's proof says of its current manifest entry (Proof.verdict)
PROVEN = "proven"  # same code object and vLLM sources, and evidence only a JIT run produced
NO_EVIDENCE = "no_evidence"  # same code object, but nothing a JIT run alone produced (version 1, or copied)
STALE = "stale"  # a proof of another code object (rebuilt since) or of other vLLM sources (KeyProof.changed)
PROOF_STATES = (PROVEN, NO_EVIDENCE, STALE)


@dataclass(frozen=True)
class Evidence:
    """What only the JIT run that made a proof produced (``aot/jit.py``'s
    worker): the sha256 of the artifact FlyDSL's JIT wrote to its own disk
    cache, the sha256 of the compiled module that artifact holds (its IR,
    host and GPU code: different for every key), and when it ran. Nothing
    in the manifest holds them, so a proof copied from the manifest cannot
    carry them; nothing signs them either (docs/releases.md). A proof of
    version 2 or 3 carries FlyDSL's cache key's sha256 (``cache_key_sha256``)
    instead of the module's. ``launch_sha256``: the sha256 of the launch
    vLLM's JIT and the prebuilt Launcher both handed the recording HIP (the
    stand-in for the AMD GPU; ``aot/hiprec``'s ``launch_digest``); None in a
    proof recorded before launches were compared (the field absent)."""

    artifact_sha256: str
    module_sha256: str | None
    at: str  # UTC, ISO 8601 ("2026-03-01T12:00:00Z")
    cache_key_sha256: str | None = None  # a version-2 or 3 proof's, kept as it was
    launch_sha256: str | None = None

    @property
    def digests(self) -> set:
        return {d for d in (self.artifact_sha256, self.module_sha256, self.cache_key_sha256) if d}

    def as_dict(self) -> dict:
        second = ("module_sha256", self.module_sha256) if self.module_sha256 else \
            ("cache_key_sha256", self.cache_key_sha256)
        out = {"artifact_sha256": self.artifact_sha256, second[0]: second[1], "at": self.at}
        if self.launch_sha256 is not None:
            out["launch_sha256"] = self.launch_sha256
        return out


@dataclass(frozen=True)
class KeyProof:
    """One key's proof: vLLM's JIT built ``code_object_sha256`` (the code
    object the room's entry was byte-identical to), under ``jit`` (the JIT
    worker's identity: release, vllm_version, mono_sources, flydsl_version;
    a build-host path such as mono_dir is never written), with ``evidence``
    of that run (None: a proof of the old format, recorded before proofs
    carried any)."""

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

    def changed(self, entry) -> str | None:
        """What changed since this proof was made, of a manifest entry of its
        key (None: nothing that makes it stale): the code object (rebuilt
        since, and under which FlyDSL) or the vLLM source. The FlyDSL alone
        is no change: a proof says that FlyDSL's JIT builds the entry's code
        object, whichever FlyDSL built the entry."""
        source = entry.source or {}
        if self.code_object_sha256 != entry.code_object_sha256:
            built = source.get("flydsl_version")
            under = f" by FlyDSL {built}, proven under {self.flydsl or 'an unnamed FlyDSL'}" \
                if built and built != self.flydsl else ""
            return f"the code object (rebuilt since{under})"
        if "mono_sources" in self.jit and self.jit["mono_sources"] != source.get("mono_sources"):
            return f"the vLLM source (mono sources {source.get('mono_sources')}, proven against {self.jit['mono_sources']})"
        return None

    def verdict(self, entry) -> str:
        """PROVEN, NO_EVIDENCE or STALE against a manifest entry of its key."""
        if self.changed(entry):
            return STALE
        ev = self.evidence
        if ev is None or ev.digests & {entry.sha256, self.code_object_sha256}:
            return NO_EVIDENCE  # nothing, or the manifest's own digests passed off as the JIT's
        return PROVEN


@dataclass(frozen=True)
class Proof:
    """A room's verified.json: per key, its proof against vLLM's JIT
    (written by ``dsv41-aot verify --against-jit --record``, carried by
    ``ci/merge.py``; the loader never reads it)."""

    arch: str
    release: str
    keys: dict  # key -> KeyProof: under the FlyDSL its object was built with when there is one, else its latest
    version: int = PROOF_VERSION
    others: tuple = ()  # KeyProofs of keys under other FlyDSL releases than their ``keys`` proof's

    @classmethod
    def of(cls, arch: str, release: str, proofs, entries: dict) -> "Proof":
        """A room's proof from ``proofs`` (KeyProofs; the last one a key and
        FlyDSL stands), keeping those whose manifest entry (``entries``: key
        -> entry) holds the code object proven. A key's ``keys`` proof is the
        one under the FlyDSL its entry was built with, else its latest."""
        by_key: dict = {}
        for p in proofs:
            if p.key in entries and entries[p.key].code_object_sha256 == p.code_object_sha256:
                by_key.setdefault(p.key, {})[p.flydsl] = p
        keys, others = {}, []
        for k, ps in by_key.items():
            built = (entries[k].source or {}).get("flydsl_version")
            main = ps.get(built) or max(ps.values(), key=lambda p: p.evidence.at if p.evidence else "")
            keys[k] = main
            others += [p for p in ps.values() if p is not main]
        return cls(arch, release, keys, PROOF_VERSION, tuple(sorted(others, key=lambda p: (p.key, p.flydsl))))

    def all(self) -> list:
        """Every proof the record holds: each key's, then those under other FlyDSL releases."""
        return [*self.keys.values(), *self.others]

    def flydsl_counts(self, entries: dict) -> dict:
        """FlyDSL release -> how many of ``entries`` (key -> manifest entry)
        carry a PROVEN proof made under it (a key may count under several)."""
        out: dict = {}
        for p in self.all():
            if p.key in entries and p.verdict(entries[p.key]) == PROVEN:
                out[p.flydsl] = out.get(p.flydsl, 0) + 1
        return dict(sorted(out.items()))

    def changes(self, entries: dict) -> dict:
        """What changed (KeyProof.changed) -> how many of ``entries``' proofs it made stale."""
        out: dict = {}
        for k, e in entries.items():
            why = self.keys[k].changed(e) if k in self.keys else None
            if why:
                what = why.split(" (")[0]
                out[what] = out.get(what, 0) + 1
        return out

    @classmethod
    def parse(cls, data: bytes, where: str, arch: str, release: str, fix: str) -> "Proof":
        """The one parser of verified.json: ManifestError naming ``where``
        for anything but a version-1 or -2 record of ``arch`` / ``release``
        whose proofs name keys of the arch, well-formed digests, a JIT of the
        room's release and (version 2) its evidence or null. Version 1 (every
        proof without evidence) stays readable: its proofs count as
        NO_EVIDENCE until proven again."""
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise ManifestError(f"{where}: malformed JSON ({e})", fix=fix) from None
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
            if version == 1:
                if set(rec) != {"code_object_sha256", "jit"}:
                    raise ManifestError(f"{what}: fields {sorted(rec)} are not a version-1 proof's", fix=fix)
            else:
                if set(rec) != {"code_object_sha256", "jit", "evidence"}:
                    raise ManifestError(f"{what}: fields {sorted(rec)} are not a version-{version} proof's", fix=fix)
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
        """verified.json as written: always this version, keys sorted."""
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
        """How many of ``entries`` (key -> manifest entry) carry a proof of
        each state, and how many none (``unproven``)."""
        out = dict.fromkeys(PROOF_STATES, 0)
        for key, e in entries.items():
            state = self.verdict(key, e)
            if state:
                out[state] += 1
        return dict(keys=len(entries), **out, unproven=len(entries) - sum(out.values()))


def flydsl_text(by_flydsl: dict) -> str:
    """Per-FlyDSL proof counts (``Proof.flydsl_counts``) as a clause of a
    report line: "; proven under FlyDSL X: 7, Y: 7" ("" when none)."""
    if not by_flydsl:
        return ""
    return "; proven under FlyDSL " + ", ".join(f"{v or '(unnamed)'}: {n}" for v, n in by_flydsl.items())


def parse_evidence(ev, code_sha: str, what: str, fix: str, version: int = PROOF_VERSION) -> Evidence:
    """A proof's evidence (a JIT answer's, or a ``version`` record's):
    ManifestError naming ``what`` unless it holds the artifact's sha256, the
    module's (or, kept from versions 2 and 3, the cache key's), a UTC time
    and optionally the launch's sha256, and repeats no digest of the code
    object it proves."""
    shapes = EVIDENCE_FIELDS.get(version, ())
    named = set(ev) - {"launch_sha256"} if isinstance(ev, dict) else None
    shape = next((f for f in shapes if named == {*f, "at"}), None)
    launch = ev.get("launch_sha256") if isinstance(ev, dict) else None
    if shape is None or not all(isinstance(ev[f], str) and SHA256_RE.fullmatch(ev[f]) for f in shape) \
            or not isinstance(ev["at"], str) or not (launch is None or isinstance(launch, str)
                                                     and SHA256_RE.fullmatch(launch)):
        want = " or ".join(", ".join(f) for f in shapes) or "none"
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
