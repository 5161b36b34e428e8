"""The build matrix (build_matrix.yaml): its schema, releases and profiles.

The matrix says what a build covers; each release's keys come from
expand.py. See docs/building.md, "The build matrix". Every error names the
file and line of the offending entry and the command that checks a fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .. import commands
from ..errors import KeyFormatError, MatrixError
from ..deployment import NotDeployed, deployment, required
from ..facts.releases import RELEASES, version_order
from ..keys import BuildKey
from .expand import ReleaseEntry, check_match, expand_release, matches
from .yamllines import Node, line_of, parse

DEFAULT_MATRIX = Path(__file__).resolve().parents[2] / "build_matrix.yaml"

SCHEMA = 3
_TOP = {"version", "default_profile", "releases", "profiles"}
_SECTIONS = ("axes", "layer_kinds", "drafts")
_RELEASE = {"like", "mono_sources", *_SECTIONS}
_DIGEST = re.compile(r"^[0-9a-f]{16}$")


@dataclass
class Matrix:
    """A loaded build matrix: every release's keys, its profiles and releases."""

    path: Path
    default_profile: str
    keys: list = field(default_factory=list)  # every release's keys, sorted
    profiles: dict = field(default_factory=dict)  # name -> Node
    profile_lines: dict = field(default_factory=dict)  # name -> line
    releases: dict = field(default_factory=dict)  # version -> ReleaseEntry

    def error(self, line: int, msg: str) -> MatrixError:
        return MatrixError(
            f"{self.path}:{line}: {msg}",
            fix=f"edit {self.path} and check it with: {commands.listing(matrix=self.path)}",
        )

    def all_keys(self) -> list[BuildKey]:
        """Every key of the matrix, sorted, once each."""
        return list(self.keys)

    def profile_names(self) -> list[str]:
        return list(self.profiles)

    def digests(self) -> dict:
        """Each release's mono sources digest, by version: what its rooms must be built from."""
        return {v: e.mono_sources for v, e in self.releases.items()}

    def select(self, profile: str | None = None) -> list[BuildKey]:
        """The keys of ``profile`` (the matrix's default when None), sorted."""
        name = profile or self.default_profile
        if name not in self.profiles:
            raise MatrixError(
                f"{self.path}: no profile {name!r} (profiles: {', '.join(self.profiles)})",
                fix=f"name one of them: {commands.listing(next(iter(self.profiles), 'full'), matrix=self.path)}",
            )
        spec = self.profiles[name]
        universe = self.all_keys()
        if "keys" in spec:
            listed = spec["keys"]
            # a list: keys of the newest release; a mapping: release -> its keys
            by_release = listed if isinstance(listed, dict) else {self.newest: listed}
            out = []
            known = set(universe)
            for release, texts in by_release.items():
                if release not in self.releases:
                    raise self.error(line_of(listed, release), f"profile {name!r}: vLLM {release!r} is not a release "
                                                            f"of the matrix ({', '.join(self.releases)})")
                if not isinstance(texts, list) or not texts:
                    raise self.error(line_of(listed, release), f"profile {name!r}: expected a list of keys")
                for i, text in enumerate(texts):
                    line = line_of(texts, i)
                    try:
                        key = BuildKey.parse(str(text), release)
                    except KeyFormatError as e:
                        raise self.error(line, f"profile {name!r}: {e}") from None
                    if key in out:
                        raise self.error(line, f"profile {name!r}: duplicate key {key.describe()}")
                    if key not in known:
                        raise self.error(line, f"profile {name!r}: {key.describe()} is not a key the matrix builds "
                                              f"({self.why_not(key)})")
                    out.append(key)
            selected = out
        else:
            where = spec.get("where", {})
            selected = [k for k in self.keys if matches(where, k)]
        if not selected:
            raise self.error(self.profile_lines.get(name, 0), f"profile {name!r} selects no keys")
        return sorted(selected)

    @property
    def newest(self) -> str:
        return max(self.releases, key=version_order)

    @property
    def drafts(self) -> dict:
        """Every draft the matrix covers, name -> (experts, topk, swa_width); newest wins."""
        out: dict = {}
        for version in sorted(self.releases, key=version_order):
            out.update(self.releases[version].drafts)
        return out

    def why_not(self, key: BuildKey) -> str:
        """Why the matrix does not build ``key``, for an error message."""
        entry = self.releases.get(key.release)
        if entry is None:
            return f"the matrix builds no vLLM {key.release} keys"
        try:
            deps = [deployment(key.arch, key.tp, draft=d, release=key.release) for d in [None, *entry.drafts.values()]]
        except NotDeployed:
            return f"vLLM {key.release}'s mono path does not run {key.arch} at TP {key.tp}"
        if any(key in required(dep) for dep in deps):
            return f"vLLM's runner can ask for it, but vLLM {key.release}'s entry does not cover it"
        return f"vLLM's runner never asks for it on {deps[-1].describe()}; see dsv41-aot facts"


def load(path: str | Path | None = None) -> Matrix:
    """Parse and expand a build matrix file (build_matrix.yaml by default)."""
    path = Path(path) if path else DEFAULT_MATRIX
    try:
        text = path.read_text()
    except OSError as e:
        raise MatrixError(f"cannot read build matrix {path}: {e.strerror}", fix="pass --matrix PATH to an existing build_matrix.yaml") from None
    doc = parse(text, path)
    m = Matrix(path=path, default_profile="")
    if not isinstance(doc, dict):
        raise m.error(1, "expected a mapping at the top level")
    for name in doc:
        if name not in _TOP:
            raise m.error(line_of(doc, name), f"unknown top-level entry {name!r} (known: {', '.join(sorted(_TOP))})")
    for name in ("releases", "profiles"):
        if name not in doc:
            raise m.error(1, f"missing top-level entry {name!r}")
    if doc.get("version", SCHEMA) != SCHEMA:
        raise m.error(line_of(doc, "version"), f"matrix version {doc.get('version')!r}: this dsv41-aot reads version {SCHEMA} "
                                             f"(a `releases:` mapping of vLLM release -> its axes, layer kinds and "
                                             f"drafts; vLLM's own rules are dsv41_aot/facts/'s)")
    releases = doc["releases"]
    if not isinstance(releases, dict) or not releases:
        raise m.error(line_of(doc, "releases"), "releases: expected a mapping of vLLM release -> its entry")
    resolved: dict = {}

    def sections(version: str, chain=()) -> dict:
        """The release's sections, ``like`` followed: name -> (value, giving release)."""
        if version in resolved:
            return resolved[version]
        spec = releases[version]
        line = line_of(releases, version)
        if not isinstance(spec, dict):
            raise m.error(line, f"release {version}: expected a mapping")
        for name in spec:
            if name not in _RELEASE:
                raise m.error(line_of(spec, name), f"release {version}: unknown entry {name!r} "
                                                f"(known: {', '.join(sorted(_RELEASE))})")
        out = {}
        like = spec.get("like")
        if like is not None:
            if like not in releases or like == version or like in chain:
                raise m.error(line_of(spec, "like"), f"release {version}: like {like!r} is not another release "
                                                  f"of the matrix ({', '.join(map(str, releases))})")
            out.update(sections(like, chain + (version,)))
        out.update({k: (spec[k], version) for k in _SECTIONS if k in spec})
        for name in ("axes", "layer_kinds"):
            if name not in out:
                raise m.error(line, f"release {version}: missing {name!r} (give it, or take it with like: RELEASE)")
        resolved[version] = out
        return out

    keys: list = []
    for version in releases:
        line = line_of(releases, version)
        if not isinstance(version, str) or version not in RELEASES:
            raise m.error(line, f"release {version!r}: dsv41-aot knows vLLM {', '.join(RELEASES)} "
                               f"(write it quoted; a new release also needs its facts in dsv41_aot/facts/releases.py)")
        spec = releases[version]
        digest = spec.get("mono_sources") if isinstance(spec, dict) else None
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise m.error(line, f"release {version}: mono_sources must be the release's 16-hex-digit mono sources "
                               f"digest (dsv41-aot fetch-vllm {version} prints it)")
        m.releases[version] = ReleaseEntry(version, digest, line)
        given = sections(version)
        keys += expand_release(m, version, {k: v for k, (v, _) in given.items()},
                               {k for k, (_, owner) in given.items() if owner == version}, line)
    m.keys = sorted(keys)

    profiles = doc["profiles"]
    if not isinstance(profiles, dict) or not profiles:
        raise m.error(line_of(doc, "profiles"), "profiles: expected at least one named profile")
    for pname, spec in profiles.items():
        spec = spec if spec is not None else Node()
        if not isinstance(spec, dict) or set(spec) - {"where", "keys"} or len(spec) > 1:
            raise m.error(line_of(profiles, pname), f"profile {pname!r}: expected {{}}, {{where: ...}} or {{keys: [...]}}")
        if "where" in spec:
            check_match(m, spec["where"], line_of(profiles, pname), f"profile {pname!r} `where`")
        if "keys" in spec and (not isinstance(spec["keys"], (list, dict)) or not spec["keys"]):
            raise m.error(line_of(profiles, pname), f"profile {pname!r}: keys must be a non-empty list, or a "
                                                 f"mapping of vLLM release -> its keys")
        m.profiles[pname] = spec
        m.profile_lines[pname] = line_of(profiles, pname)
    m.default_profile = doc.get("default_profile") or next(iter(profiles))
    if m.default_profile not in profiles:
        raise m.error(line_of(doc, "default_profile"), f"default_profile {m.default_profile!r} is not a profile")
    for pname in m.profiles:
        m.select(pname)  # every profile must select something valid
    return m

