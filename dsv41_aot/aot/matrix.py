"""build_matrix.yaml -> the list of BuildKeys to build.

Per vLLM release: every arch x tp x launch group x layer kind x tokens x
timeline gives one key per launch kind of the group; the rules (in order) drop
or rewrite keys. A profile selects across releases; a shard takes its part. Every error names the file and line
of the offending entry and the command that checks a fix.
"""

from __future__ import annotations

import itertools
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import KeyFormatError, MatrixError
from ..facts.arches import ARCHES as ARCH_FACTS
from ..facts.kinds import KINDS as KINDS_FACTS
from ..facts.releases import RELEASES, version_order
from ..keys import ARCHES, KINDS, RATIOS, BuildKey

DEFAULT_MATRIX = Path(__file__).resolve().parents[2] / "build_matrix.yaml"

SCHEMA = 2
_TOP = {"version", "default_profile", "releases", "profiles"}
_SECTIONS = ("axes", "layer_kinds", "routing", "groups", "rules")
_RELEASE = {"like", "mono_sources", *_SECTIONS}
_AXES = {"arch", "tp", "tokens", "timeline"}
_KIND_FIELDS = {"ratio", "fold", "index"}
_ROUTING_FIELDS = {"experts", "topk", "ug_groups", "swa_width"}
_MATCH_FIELDS = {
    "arch", "kind", "group", "release", "tokens", "tp", "ratio", "fold", "index",
    "experts", "topk", "ug_groups", "swa_width", "timeline",
}
_SET_FIELDS = _MATCH_FIELDS - {"arch", "kind", "group", "release"}
_DIGEST = re.compile(r"^[0-9a-f]{16}$")
_CMP = re.compile(r"^\s*(<=|>=|!=|==|<|>)\s*(-?\d+)\s*$")
_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne}


# ---------------------------------------------------------------- YAML with lines
class _Node(dict):
    """A mapping that remembers the line of each of its keys (1-based)."""

    line: int = 0
    lines: dict


class _Seq(list):
    line: int = 0
    lines: list


class _LineLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        out = _Node(super().construct_mapping(node, deep=True))
        out.line = node.start_mark.line + 1
        out.lines = {self.construct_object(k, deep=True): k.start_mark.line + 1 for k, _ in node.value}
        seen = set()
        for k, _ in node.value:
            name = self.construct_object(k, deep=True)
            if name in seen:
                raise MatrixError(f"line {k.start_mark.line + 1}: key {name!r} given twice in one mapping")
            seen.add(name)
        return out

    def construct_sequence(self, node, deep=False):
        out = _Seq(super().construct_sequence(node, deep=True))
        out.line = node.start_mark.line + 1
        out.lines = [n.start_mark.line + 1 for n in node.value]
        return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _LineLoader.construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _LineLoader.construct_sequence)


def _line(obj, key=None) -> int:
    if key is not None and isinstance(obj, _Node) and key in obj.lines:
        return obj.lines[key]
    if key is not None and isinstance(obj, _Seq) and isinstance(key, int) and key < len(obj.lines):
        return obj.lines[key]
    return getattr(obj, "line", 0)


# ---------------------------------------------------------------- the matrix
@dataclass
class Rule:
    when: dict
    drop: bool
    set: dict
    source: str
    line: int
    release: str = ""


@dataclass
class ReleaseEntry:
    """One release's entry in the matrix, its sections resolved through ``like``."""

    version: str
    mono_sources: str
    line: int
    layer_kinds: dict = field(default_factory=dict)  # name -> [{"ratio"[, "fold", "index"]}]
    routing: dict = field(default_factory=dict)  # preset -> the release's routing fields


@dataclass
class Matrix:
    path: Path
    default_profile: str
    keys_by_group: list = field(default_factory=list)  # [(group, BuildKey)] after rules
    profiles: dict = field(default_factory=dict)  # name -> _Node
    profile_lines: dict = field(default_factory=dict)  # name -> line
    releases: dict = field(default_factory=dict)  # version -> ReleaseEntry
    rules: list = field(default_factory=list)

    def _err(self, line: int, msg: str) -> MatrixError:
        return MatrixError(
            f"{self.path}:{line}: {msg}",
            fix=f"edit {self.path} and check it with: dsv41-aot build --matrix {self.path} --list",
        )

    def all_keys(self) -> list[BuildKey]:
        """Every key of the matrix (the ``full`` selection), sorted, once each."""
        return sorted({k for _, k in self.keys_by_group})

    def profile_names(self) -> list[str]:
        return list(self.profiles)

    def select(self, profile: str | None = None) -> list[BuildKey]:
        """The keys of ``profile`` (the matrix's default when None), sorted."""
        name = profile or self.default_profile
        if name not in self.profiles:
            raise MatrixError(
                f"{self.path}: no profile {name!r} (profiles: {', '.join(self.profiles)})",
                fix=f"dsv41-aot build --matrix {self.path} --profile {next(iter(self.profiles), 'full')}",
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
                    raise self._err(_line(listed, release), f"profile {name!r}: vLLM {release!r} is not a release "
                                                            f"of the matrix ({', '.join(self.releases)})")
                if not isinstance(texts, list) or not texts:
                    raise self._err(_line(listed, release), f"profile {name!r}: expected a list of keys")
                for i, text in enumerate(texts):
                    line = _line(texts, i)
                    try:
                        key = BuildKey.parse(str(text), release)
                    except KeyFormatError as e:
                        raise self._err(line, f"profile {name!r}: {e}") from None
                    if key in out:
                        raise self._err(line, f"profile {name!r}: duplicate key {key.describe()}")
                    if key not in known:
                        raise self._err(line, f"profile {name!r}: {key.describe()} is not a key the matrix builds "
                                              f"({self._why_not(key)})")
                    out.append(key)
            selected = out
        else:
            where = spec.get("where", {})
            selected = [k for g, k in self.keys_by_group if _matches(where, k, g)]
            selected = sorted(set(selected))
        if not selected:
            raise self._err(self.profile_lines.get(name, 0), f"profile {name!r} selects no keys")
        return sorted(selected)

    @property
    def newest(self) -> str:
        return max(self.releases, key=version_order)

    def _why_not(self, key: BuildKey) -> str:
        if key.release not in self.releases:
            return f"the matrix builds no vLLM {key.release} keys"
        for rule in self.rules:
            if rule.release == key.release and rule.drop and _matches(rule.when, key, None, ignore_group=True):
                return f"dropped by the rule at line {rule.line}, {rule.source}"
        return f"no launch group, layer kind or routing preset of vLLM {key.release} produces it"


def _matches(when: dict, key: BuildKey, group: str | None, ignore_group: bool = False) -> bool:
    for name, want in when.items():
        if name == "group":
            if ignore_group:
                continue
            have = group
        else:
            have = getattr(key, name)
        if isinstance(want, list):
            if have not in want:
                return False
        elif isinstance(want, str) and _CMP.match(want):
            op, num = _CMP.match(want).groups()
            if not _OPS[op](have, int(num)):
                return False
        elif have != want:
            return False
    return True


def _tokens(value, m: Matrix, line: int, max_tokens: int) -> list[int]:
    if isinstance(value, str):
        a, sep, b = value.partition("..")
        try:
            lo, hi = int(a), int(b)
        except ValueError:
            raise m._err(line, f"axis tokens: {value!r} is neither a list nor a range like 1..48") from None
        if not sep or lo > hi:
            raise m._err(line, f"axis tokens: bad range {value!r}")
        out = list(range(lo, hi + 1))
    elif isinstance(value, int):
        out = [value]
    else:
        out = list(value)
    for t in out:
        if not isinstance(t, int) or isinstance(t, bool) or not 1 <= t <= max_tokens:
            raise m._err(line, f"axis tokens: {t!r} outside 1..{max_tokens} (vLLM's MAX_TOKENS)")
    return out


def _check_values(m: Matrix, name: str, values, allowed, line: int) -> list:
    if not isinstance(values, list) or not values:
        raise m._err(line, f"axis {name}: expected a non-empty list")
    seen = set()
    for v in values:
        if allowed is not None and v not in allowed:
            raise m._err(line, f"axis {name}: unknown value {v!r} (known: {', '.join(map(str, allowed))})")
        if v in seen:
            raise m._err(line, f"axis {name}: duplicate value {v!r}")
        seen.add(v)
    return list(values)


def _check_match(m: Matrix, where: dict, line: int, what: str, allowed=_MATCH_FIELDS) -> dict:
    if not isinstance(where, dict):
        raise m._err(line, f"{what}: expected a mapping of field: value")
    for name, want in where.items():
        if name not in allowed:
            raise m._err(_line(where, name), f"{what}: unknown field {name!r} (known: {', '.join(sorted(allowed))})")
        if isinstance(want, str) and name not in ("arch", "kind", "group", "release") and not _CMP.match(want):
            raise m._err(_line(where, name), f"{what}: {name}: {want!r} is not a comparison like '> 42'")
        if name == "arch":
            for v in want if isinstance(want, list) else [want]:
                if v not in ARCHES:
                    raise m._err(_line(where, name), f"{what}: unknown arch {v!r} (known: {', '.join(ARCHES)})")
        if name == "release":
            for v in want if isinstance(want, list) else [want]:
                if v not in RELEASES:
                    raise m._err(_line(where, name), f"{what}: unknown vLLM release {v!r} (known: "
                                                     f"{', '.join(RELEASES)}; write it quoted)")
        if name == "kind":
            for v in want if isinstance(want, list) else [want]:
                if v not in KINDS:
                    raise m._err(_line(where, name), f"{what}: unknown kind {v!r} (known: {', '.join(KINDS)})")
    return where


def _expand_release(m: Matrix, doc: dict, version: str, sec: dict, digest: str) -> list:
    """The (group, key) pairs of one release, after its rules."""
    rel = RELEASES[version]
    axes = sec["axes"]
    for name in axes:
        if name not in _AXES:
            raise m._err(_line(axes, name), f"unknown axis {name!r} (known: {', '.join(sorted(_AXES))})")
    for name in _AXES:
        if name not in axes:
            raise m._err(_line(sec, "axes"), f"missing axis {name!r}")
    arches = _check_values(m, "arch", axes["arch"], list(rel.arches), _line(axes, "arch"))
    tps = _check_values(m, "tp", axes["tp"], None, _line(axes, "tp"))
    for tp in tps:
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise m._err(_line(axes, "tp"), f"axis tp: {tp!r} is not a TP size")
    tokens = _tokens(axes["tokens"], m, _line(axes, "tokens"), rel.max_tokens)
    if len(set(tokens)) != len(tokens):
        raise m._err(_line(axes, "tokens"), "axis tokens: duplicate value")
    timelines = _check_values(m, "timeline", axes["timeline"], [False, True], _line(axes, "timeline"))

    kind_fields = {f for f in _KIND_FIELDS if rel.reads(f)}
    routing_fields = {f for f in _ROUTING_FIELDS if rel.reads(f)}
    layer_kinds = sec.get("layer_kinds") or {}
    kinds_by_name: dict = {}
    for lname, entries in layer_kinds.items():
        seen = set()
        for i, entry in enumerate(entries or []):
            line = _line(entries, i)
            if not isinstance(entry, dict) or set(entry) != kind_fields:
                raise m._err(line, f"layer_kinds.{lname}: each entry needs exactly {sorted(kind_fields)} "
                                   f"(vLLM {version}'s MonoBuild layer fields)")
            if entry["ratio"] not in RATIOS:
                raise m._err(line, f"layer_kinds.{lname}: unknown ratio {entry['ratio']!r} (known: {RATIOS})")
            for b in sorted(kind_fields - {"ratio"}):
                if not isinstance(entry[b], bool):
                    raise m._err(line, f"layer_kinds.{lname}: {b} must be true or false")
            t = tuple(sorted(entry.items()))
            if t in seen:
                raise m._err(line, f"layer_kinds.{lname}: duplicate layer kind {dict(entry)}")
            seen.add(t)
            kinds_by_name.setdefault(lname, []).append(dict(entry))
        if lname not in kinds_by_name:
            raise m._err(_line(layer_kinds, lname), f"layer_kinds.{lname} is empty")

    routing = sec.get("routing") or {}
    for rname, preset in routing.items():
        if not isinstance(preset, dict) or set(preset) != routing_fields:
            raise m._err(_line(routing, rname), f"routing.{rname}: needs exactly {sorted(routing_fields)} "
                                                f"(vLLM {version}'s MonoBuild routing fields)")
        for f, v in preset.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise m._err(_line(preset, f), f"routing.{rname}.{f}: {v!r} is not a positive integer")

    entry = ReleaseEntry(version, digest, line=_line(doc["releases"], version), layer_kinds=kinds_by_name,
                         routing={name: dict(preset) for name, preset in routing.items()})
    m.releases[version] = entry

    groups = sec["groups"]
    expanded: list = []
    gnames = set()
    for i, g in enumerate(groups or []):
        line = _line(groups, i)
        if not isinstance(g, dict) or not {"name", "kinds", "routing"} <= set(g) or set(g) - {"name", "kinds", "routing", "layers"}:
            raise m._err(line, "groups: each group needs name, kinds, routing and (for k1/k2) layers")
        if g["name"] in gnames:
            raise m._err(line, f"groups: duplicate group {g['name']!r}")
        gnames.add(g["name"])
        for kind in g["kinds"]:
            if kind not in KINDS:
                raise m._err(line, f"group {g['name']}: unknown launch kind {kind!r} (known: {', '.join(KINDS)})")
        if g["routing"] not in routing:
            raise m._err(line, f"group {g['name']}: unknown routing {g['routing']!r} (known: {', '.join(routing)})")
        whole = [k for k in g["kinds"] if k != "ffn"]
        if whole and g.get("layers") not in kinds_by_name:
            raise m._err(line, f"group {g['name']}: unknown layers {g.get('layers')!r} (known: {', '.join(kinds_by_name)})")
        lkinds = kinds_by_name[g["layers"]] if whole else [{"ratio": 0}]
        preset = routing[g["routing"]]
        for arch, tp, lk, s, tl, kind in itertools.product(arches, tps, lkinds, tokens, timelines, g["kinds"]):
            try:
                key = BuildKey(kind=kind, arch=arch, tokens=s, tp=tp, timeline=tl, release=version, **lk, **preset)
            except KeyFormatError as e:
                raise m._err(line, f"group {g['name']}: {e}") from None
            expanded.append((g["name"], key))

    allowed = {f for f in _MATCH_FIELDS if f in ("arch", "kind", "group", "release") or rel.reads(f)}
    rules = []
    for i, r in enumerate(sec.get("rules") or []):
        line = _line(sec["rules"], i)
        if not isinstance(r, dict) or "when" not in r or ("drop" in r) == ("set" in r) or set(r) - {"when", "drop", "set", "source"}:
            raise m._err(line, "rules: each rule needs `when` and exactly one of `drop: true` / `set: {...}` (and `source`)")
        if "source" not in r:
            raise m._err(line, "rules: name the upstream `source` the rule follows")
        when = _check_match(m, r["when"], line, f"vLLM {version} rule `when`", allowed=allowed)
        for name in when:
            if name == "group" and any(v not in gnames for v in (when[name] if isinstance(when[name], list) else [when[name]])):
                raise m._err(_line(when, name), f"rule `when`: unknown group {when[name]!r} (known: {', '.join(sorted(gnames))})")
        sets = r.get("set") or {}
        _check_match(m, sets, line, f"vLLM {version} rule `set`", allowed=allowed & _SET_FIELDS)
        rules.append(Rule(when=dict(when), drop=bool(r.get("drop")), set=dict(sets), source=r["source"], line=line,
                          release=version))
    m.rules += rules

    for rule in rules:
        out = []
        for g, key in expanded:
            if _matches(rule.when, key, g):
                if rule.drop:
                    continue
                try:
                    key = key.with_(**rule.set)
                except KeyFormatError as e:
                    raise m._err(rule.line, f"rule `set` makes an invalid key: {e}") from None
            out.append((g, key))
        expanded = out
    if not expanded:
        raise m._err(entry.line, f"the rules of vLLM {version} drop every key")
    return expanded


def load(path: str | Path | None = None) -> Matrix:
    """Parse and expand a build matrix file (build_matrix.yaml by default)."""
    path = Path(path) if path else DEFAULT_MATRIX
    try:
        text = path.read_text()
    except OSError as e:
        raise MatrixError(f"cannot read build matrix {path}: {e.strerror}", fix="pass --matrix PATH to an existing build_matrix.yaml") from None
    try:
        doc = yaml.load(text, Loader=_LineLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise MatrixError(f"{where}: not valid YAML: {getattr(e, 'problem', e)}", fix=f"fix the YAML syntax in {path}") from None
    except MatrixError as e:
        raise MatrixError(f"{path}:{str(e)[len('line '):]}" if str(e).startswith("line ") else str(e)) from None
    m = Matrix(path=path, default_profile="")
    if not isinstance(doc, dict):
        raise m._err(1, "expected a mapping at the top level")
    for name in doc:
        if name not in _TOP:
            raise m._err(_line(doc, name), f"unknown top-level entry {name!r} (known: {', '.join(sorted(_TOP))})")
    for name in ("releases", "profiles"):
        if name not in doc:
            raise m._err(1, f"missing top-level entry {name!r}")
    if doc.get("version", SCHEMA) != SCHEMA:
        raise m._err(_line(doc, "version"), f"matrix version {doc.get('version')!r}: this dsv41-aot reads version {SCHEMA} "
                                             f"(a `releases:` mapping of vLLM release -> its sections)")
    releases = doc["releases"]
    if not isinstance(releases, dict) or not releases:
        raise m._err(_line(doc, "releases"), "releases: expected a mapping of vLLM release -> its entry")
    resolved: dict = {}

    def sections(version: str, chain=()) -> dict:
        """The release's sections, ``like`` followed."""
        if version in resolved:
            return resolved[version]
        spec = releases[version]
        line = _line(releases, version)
        if not isinstance(spec, dict):
            raise m._err(line, f"release {version}: expected a mapping")
        for name in spec:
            if name not in _RELEASE:
                raise m._err(_line(spec, name), f"release {version}: unknown entry {name!r} "
                                                f"(known: {', '.join(sorted(_RELEASE))})")
        out = {}
        like = spec.get("like")
        if like is not None:
            if like not in releases or like == version or like in chain:
                raise m._err(_line(spec, "like"), f"release {version}: like {like!r} is not another release "
                                                  f"of the matrix ({', '.join(map(str, releases))})")
            out.update(sections(like, chain + (version,)))
        out.update({k: spec[k] for k in _SECTIONS if k in spec})
        for name in ("axes", "groups"):
            if name not in out:
                raise m._err(line, f"release {version}: missing {name!r} (give it, or take it with like: RELEASE)")
        resolved[version] = out
        return out

    expanded: list = []
    for version in releases:
        line = _line(releases, version)
        if not isinstance(version, str) or version not in RELEASES:
            raise m._err(line, f"release {version!r}: dsv41-aot knows vLLM {', '.join(RELEASES)} "
                               f"(write it quoted; a new release also needs its facts in dsv41_aot/facts/releases.py)")
        spec = releases[version]
        digest = spec.get("mono_sources") if isinstance(spec, dict) else None
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise m._err(line, f"release {version}: mono_sources must be the release's 16-hex-digit mono sources "
                               f"digest (dsv41-aot fetch-vllm {version} prints it)")
        expanded += _expand_release(m, doc, version, sections(version), digest)
    m.keys_by_group = expanded

    profiles = doc["profiles"]
    if not isinstance(profiles, dict) or not profiles:
        raise m._err(_line(doc, "profiles"), "profiles: expected at least one named profile")
    for pname, spec in profiles.items():
        spec = spec if spec is not None else _Node()
        if not isinstance(spec, dict) or set(spec) - {"where", "keys"} or len(spec) > 1:
            raise m._err(_line(profiles, pname), f"profile {pname!r}: expected {{}}, {{where: ...}} or {{keys: [...]}}")
        if "where" in spec:
            _check_match(m, spec["where"], _line(profiles, pname), f"profile {pname!r} `where`")
        if "keys" in spec and (not isinstance(spec["keys"], (list, dict)) or not spec["keys"]):
            raise m._err(_line(profiles, pname), f"profile {pname!r}: keys must be a non-empty list, or a "
                                                 f"mapping of vLLM release -> its keys")
        m.profiles[pname] = spec
        m.profile_lines[pname] = _line(profiles, pname)
    m.default_profile = doc.get("default_profile") or next(iter(profiles))
    if m.default_profile not in profiles:
        raise m._err(_line(doc, "default_profile"), f"default_profile {m.default_profile!r} is not a profile")
    for pname in m.profiles:
        m.select(pname)  # every profile must select something valid
    return m


# ---------------------------------------------------------------- shards
def estimate_seconds(key: BuildKey) -> float:
    """A compile-time guess for a key with no recorded time, from the kind's
    and the arch's facts (measured on a 2-core CPU, growing with the width)."""
    base, per_token = KINDS_FACTS[key.kind].compile_estimate
    return (base + per_token * key.tokens) * ARCH_FACTS[key.arch].compile_scale


def recorded_seconds(paths) -> dict:
    """(release, key) -> compile seconds: the shared input that makes every CI
    cell cut the same shards. Each path is a room's ``timings.json`` (its
    release is its folder's, ``vllm-<release>``), a room or arch folder
    holding them, a ``manifest.json`` (its sibling timings.json, or the
    ``compile_seconds`` manifests held before timings moved out of them), or
    any {key: seconds} JSON file elsewhere (release None: any release's)."""
    import json

    from ..facts.releases import RELEASES as _RELEASES
    from ..manifest import TIMINGS, read_timings

    folders = {r.folder: v for v, r in _RELEASES.items()}
    files: list = []
    for p in paths or ():
        p = Path(p)
        if p.is_dir():
            rooms = sorted(p.glob(f"vllm-*/{TIMINGS}"))
            files += rooms if rooms and not (p / TIMINGS).is_file() else [p / TIMINGS]
        else:
            files.append(p)
    out: dict = {}
    for p in files:
        try:
            doc = json.loads(p.read_bytes())
        except (OSError, ValueError) as e:
            raise MatrixError(f"cannot read recorded seconds from {p}: {e}",
                              fix=f"pass --seconds the {TIMINGS} (or manifest.json) a build wrote") from None
        if not isinstance(doc, dict):
            raise MatrixError(f"{p}: not a {{key: seconds}} mapping or a manifest",
                              fix=f"pass --seconds the {TIMINGS} (or manifest.json) a build wrote")
        release = folders.get(p.parent.name)
        if isinstance(doc.get("entries"), dict):  # a manifest
            release = doc.get("release", release)
            found = {k: e["compile_seconds"] for k, e in doc["entries"].items()
                     if isinstance(e, dict) and "compile_seconds" in e}
            found.update(read_timings(p.parent))
        else:
            found = doc
        for key, secs in sorted(found.items()):
            try:
                out[(release, key)] = float(secs)
            except (TypeError, ValueError):
                raise MatrixError(f"{p}: seconds of {key} is {secs!r}, not a number",
                                  fix=f"pass --seconds the {TIMINGS} a build wrote") from None
    return out


def parse_shard(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)/(\d+)", text or "")
    if not m or not (0 <= int(m[1]) < int(m[2])):
        raise MatrixError(f"bad shard {text!r}: expected i/N with 0 <= i < N", fix="pass --shard 0/4 (shards are numbered from 0)")
    return int(m[1]), int(m[2])


def shard(keys: list[BuildKey], index: int, count: int, seconds: dict | None = None) -> list[BuildKey]:
    """Shard ``index`` of ``count``: longest-first greedy over the recorded
    compile seconds (``seconds``: (release, key string) -> s, from
    :func:`recorded_seconds`; a release of None stands for any), or the
    estimate where none is recorded. Deterministic: every key lands in
    exactly one shard, the same one on every machine."""
    seconds = {(None, k) if isinstance(k, str) else k: v for k, v in (seconds or {}).items()}  # a bare key: any release
    cost = {k: float(seconds.get((k.release, str(k)), seconds.get((None, str(k)), estimate_seconds(k))))
            for k in keys}
    loads = [0.0] * count
    out: list[list[BuildKey]] = [[] for _ in range(count)]
    for k in sorted(keys, key=lambda k: (-cost[k], str(k), k.release)):
        i = min(range(count), key=lambda j: (loads[j], j))
        loads[i] += cost[k]
        out[i].append(k)
    return sorted(out[index])
