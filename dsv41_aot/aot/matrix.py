"""The build matrix (build_matrix.yaml): the releases and drafts a build covers, and its profiles.

The matrix names the vLLM releases (each with the digest of the mono
sources its rooms are built from), the draft models and the profiles. It
states no rule of vLLM's runner: a release's keys are every key
``deployment.required`` lists for each deployment its facts say it runs
(facts/releases.py), with and without each draft, so a rule changed in the
facts moves ``build --list``, ``coverage`` and ``doctor`` together. A
profile narrows them with ``where`` or names them with ``keys``. See
docs/building.md, "The build matrix". Every error names the file and line
of the offending entry and the command that checks a fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .. import commands
from ..deployment import NotDeployed, deployment, required
from ..errors import AotError, KeyFormatError, MatrixError
from ..facts.arches import ARCHES, arch_facts
from ..facts.kinds import KINDS
from ..facts.releases import ALL_FIELDS, RELEASES, version_order
from ..keys import BuildKey
from . import shards
from .yamllines import Node, line_of, parse

DEFAULT_MATRIX = Path(__file__).resolve().parents[2] / "build_matrix.yaml"

SCHEMA = 4
_TOP = {"version", "default_profile", "releases", "drafts", "profiles"}
DRAFT_FIELDS = ("experts", "topk", "swa_width")  # deployment.Deployment.draft's order
_MATCH_FIELDS = {"arch", "kind", "release", *ALL_FIELDS}  # what a `where` filter can name
_DIGEST = re.compile(r"^[0-9a-f]{16}$")


@dataclass
class Matrix:
    """A loaded build matrix: every release's keys, its profiles, releases and drafts."""

    path: Path
    default_profile: str = ""
    keys: list = field(default_factory=list)  # every release's keys, sorted
    profiles: dict = field(default_factory=dict)  # name -> Node
    profile_lines: dict = field(default_factory=dict)  # name -> line
    releases: dict = field(default_factory=dict)  # version -> the mono sources digest its rooms are built from
    drafts: dict = field(default_factory=dict)  # name -> (experts, topk, swa_width)

    def error(self, line: int, msg: str) -> MatrixError:
        return MatrixError(
            f"{self.path}:{line}: {msg}",
            fix=f"edit {self.path} and check it with: {commands.listing(matrix=self.path)}",
        )

    def choose(self, profile: str | None = None, *, keys: list | None = None, release: str | None = None,
               arches=(), shard: str | None = None, seconds=()) -> list[BuildKey]:
        """The keys a command builds or verifies: ``keys`` (else ``profile``'s), of ``release`` and ``arches``, cut
        to shard ``shard`` ("i/N") by the ``seconds`` files (``shards.recorded_seconds``).

        build and verify choose through here, so ``verify --shard`` checks what ``build --shard`` built. A
        narrowing that leaves no key is bad input, as is an unknown arch."""
        keys = self.select(profile) if keys is None else keys
        if release:
            keys = [k for k in keys if k.release == release]
            if not keys:
                raise AotError(f"profile {profile or self.default_profile!r} selects no vLLM {release} key",
                               fix=f"drop --release, or pick another profile (releases: {', '.join(self.releases)})")
        if arches:
            for a in arches:
                arch_facts(a)  # an unknown arch: "unknown arch", naming the known ones (exit 2)
            keys = [k for k in keys if k.arch in arches]
            if not keys:
                raise AotError(f"no selected key is for {', '.join(arches)}", fix="drop --arch or pick another profile")
        if shard:
            # every CI cell must cut the same shards: seconds come from files all cells share (--seconds), never
            # from a cell's own output directory
            i, n = shards.parse_shard(shard)
            keys = shards.shard(keys, i, n, shards.recorded_seconds(seconds))
        return keys

    def select(self, profile: str | None = None) -> list[BuildKey]:
        """The keys of ``profile`` (the matrix's default when None), sorted."""
        name = profile or self.default_profile
        if name not in self.profiles:
            raise MatrixError(
                f"{self.path}: no profile {name!r} (profiles: {', '.join(self.profiles)})",
                fix=f"name one of them: {commands.listing(next(iter(self.profiles), 'full'), matrix=self.path)}",
            )
        spec = self.profiles[name]
        if "keys" in spec:
            selected = self._listed(name, spec["keys"])
        else:
            selected = [k for k in self.keys if matches(spec.get("where", {}), k)]
        if not selected:
            raise self.error(self.profile_lines.get(name, 0), f"profile {name!r} selects no keys")
        return sorted(selected)

    def _listed(self, name: str, listed) -> list[BuildKey]:
        """The keys a profile's ``keys`` names: a list (the newest release's) or release -> list."""
        by_release = listed if isinstance(listed, dict) else {self.newest: listed}
        out: list = []
        known = set(self.keys)
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
        return out

    @property
    def newest(self) -> str:
        return max(self.releases, key=version_order)

    def why_not(self, key: BuildKey) -> str:
        """Why the matrix does not build ``key``, for an error message."""
        if key.release not in self.releases:
            return f"the matrix builds no vLLM {key.release} keys"
        try:
            dep = deployment(key.arch, key.tp, release=key.release)
        except NotDeployed:
            return f"vLLM {key.release}'s mono path does not run {key.arch} at TP {key.tp}"
        drafts = f" or with the drafts {', '.join(self.drafts)}" if self.drafts else ""
        return f"vLLM's runner never asks for it on {dep.describe()}{drafts}; see dsv41-aot facts"


def matches(where: dict, key: BuildKey) -> bool:
    """Whether ``key`` has the values ``where`` names (a value or a list per field)."""
    return all(getattr(key, name) in (want if isinstance(want, list) else [want]) for name, want in where.items())


def release_keys(version: str, drafts: dict) -> dict:
    """The keys vLLM ``version``'s runner can ask for: draft name (None: no draft) -> keys.

    Over every arch and TP the release's facts say its mono path runs."""
    out: dict = {}
    for name, draft in [(None, None), *drafts.items()]:
        out[name] = {k for arch, facts in RELEASES[version].arches.items() for tp in facts.tp_sizes
                     for k in required(deployment(arch, tp, draft=draft, release=version))}
    return out


def _check_where(m: Matrix, where, line: int, what: str) -> None:
    """Check a ``where`` filter: known fields, arches, kinds and releases."""
    if not isinstance(where, dict):
        raise m.error(line, f"{what}: expected a mapping of field: value")
    known = {"arch": ARCHES, "kind": KINDS, "release": RELEASES}
    for name, want in where.items():
        if name not in _MATCH_FIELDS:
            raise m.error(line_of(where, name), f"{what}: unknown field {name!r} "
                                                f"(known: {', '.join(sorted(_MATCH_FIELDS))})")
        for v in want if isinstance(want, list) else [want]:
            if name in known and v not in known[name]:
                raise m.error(line_of(where, name), f"{what}: unknown {name} {v!r} (known: "
                                                    f"{', '.join(known[name])}; write a release quoted)")


def _read_releases(m: Matrix, doc: Node) -> None:
    """The ``releases`` mapping: vLLM release -> {mono_sources: digest}."""
    releases = doc["releases"]
    if not isinstance(releases, dict) or not releases:
        raise m.error(line_of(doc, "releases"), "releases: expected a mapping of vLLM release -> its entry")
    for version, spec in releases.items():
        line = line_of(releases, version)
        if not isinstance(version, str) or version not in RELEASES:
            raise m.error(line, f"release {version!r}: dsv41-aot knows vLLM {', '.join(RELEASES)} "
                               f"(write it quoted; a new release also needs its facts in dsv41_aot/facts/releases.py)")
        if not isinstance(spec, dict):
            raise m.error(line, f"release {version}: expected a mapping")
        for name in spec:
            if name != "mono_sources":
                raise m.error(line_of(spec, name), f"release {version}: unknown entry {name!r} (a release gives "
                                                f"its mono_sources only: the widths, TP sizes and layer kinds are "
                                                f"vLLM's rules, in dsv41_aot/facts/; narrow a build with a "
                                                f"profile's `where`)")
        digest = spec.get("mono_sources")
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise m.error(line, f"release {version}: mono_sources must be the release's 16-hex-digit mono sources "
                               f"digest (dsv41-aot fetch-vllm {version} prints it)")
        m.releases[version] = digest


def _read_drafts(m: Matrix, doc: Node) -> None:
    """The ``drafts`` mapping: name -> the draft runner's experts, topk and swa_width."""
    drafts = doc.get("drafts")
    if drafts is None:
        return
    if not isinstance(drafts, dict):
        raise m.error(line_of(doc, "drafts"), "drafts: expected a mapping of draft name -> its routing")
    for name, preset in drafts.items():
        if not isinstance(preset, dict) or set(preset) != set(DRAFT_FIELDS) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in preset.values()):
            raise m.error(line_of(drafts, name), f"drafts.{name}: needs exactly {', '.join(DRAFT_FIELDS)}, "
                                                 f"positive integers (the draft runner's routing)")
        m.drafts[name] = tuple(preset[f] for f in DRAFT_FIELDS)


def load(path: str | Path | None = None) -> Matrix:
    """Parse and expand a build matrix file (build_matrix.yaml by default)."""
    path = Path(path) if path else DEFAULT_MATRIX
    try:
        text = path.read_text()
    except OSError as e:
        raise MatrixError(f"cannot read build matrix {path}: {e.strerror}", fix="pass --matrix PATH to an existing build_matrix.yaml") from None
    doc = parse(text, path)
    m = Matrix(path=path)
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
                                             f"(`releases:` vLLM release -> its mono_sources, `drafts:`, `profiles:`; "
                                             f"vLLM's own rules are dsv41_aot/facts/'s)")
    _read_releases(m, doc)
    _read_drafts(m, doc)
    keys: set = set()
    adds: set = set()  # the drafts that add a key to some release
    for version in m.releases:
        by_draft = release_keys(version, m.drafts)
        adds |= {name for name, got in by_draft.items() if name and got - by_draft[None]}
        keys = keys.union(*by_draft.values())
    for name in m.drafts:
        if name not in adds:
            raise m.error(line_of(doc["drafts"], name), f"drafts.{name} adds no key: no release of the matrix runs "
                                                       f"a draft layer with its own launches (dsv41-aot facts)")
    m.keys = sorted(keys)

    profiles = doc["profiles"]
    if not isinstance(profiles, dict) or not profiles:
        raise m.error(line_of(doc, "profiles"), "profiles: expected at least one named profile")
    for pname, spec in profiles.items():
        spec = spec if spec is not None else Node()
        if not isinstance(spec, dict) or set(spec) - {"where", "keys"} or len(spec) > 1:
            raise m.error(line_of(profiles, pname), f"profile {pname!r}: expected {{}}, {{where: ...}} or {{keys: [...]}}")
        if "where" in spec:
            _check_where(m, spec["where"], line_of(profiles, pname), f"profile {pname!r} `where`")
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
