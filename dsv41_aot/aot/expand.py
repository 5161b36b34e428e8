"""One release's sections -> its (group, BuildKey) pairs: the axes, layer kinds,
routing presets and launch groups checked and multiplied out, then the
release's rules (in order) dropping or rewriting keys; and the ``when``
matching that rules and profiles share. ``m`` is the :class:`.matrix.Matrix`
being loaded: its ``error`` names the file and line of an offending entry, and
each release's entry and rules are recorded on it."""

from __future__ import annotations

import itertools
import operator
import re
from dataclasses import dataclass, field

from ..errors import KeyFormatError
from ..facts.kinds import KINDS
from ..facts.releases import RELEASES
from ..keys import ARCHES, RATIOS, BuildKey
from .yamllines import line_of

_AXES = {"arch", "tp", "tokens", "timeline"}
_KIND_FIELDS = {"ratio", "fold", "index"}
_ROUTING_FIELDS = {"experts", "topk", "ug_groups", "swa_width"}
_MATCH_FIELDS = {
    "arch", "kind", "group", "release", "tokens", "tp", "ratio", "fold", "index",
    "experts", "topk", "ug_groups", "swa_width", "timeline",
}
_SET_FIELDS = _MATCH_FIELDS - {"arch", "kind", "group", "release"}
_CMP = re.compile(r"^\s*(<=|>=|!=|==|<|>)\s*(-?\d+)\s*$")
_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne}


@dataclass
class Rule:
    when: dict
    drop: bool
    set: dict
    source: str
    line: int
    release: str  # the release whose section holds the rule


@dataclass
class ReleaseEntry:
    """One release's entry in the matrix, its sections resolved through ``like``."""

    version: str
    mono_sources: str
    line: int
    layer_kinds: dict = field(default_factory=dict)  # name -> [{"ratio"[, "fold", "index"]}]
    routing: dict = field(default_factory=dict)  # preset -> the release's routing fields


def matches(when: dict, key: BuildKey, group: str | None, ignore_group: bool = False) -> bool:
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


def _tokens(value, m, line: int, max_tokens: int) -> list[int]:
    if isinstance(value, str):
        a, sep, b = value.partition("..")
        try:
            lo, hi = int(a), int(b)
        except ValueError:
            raise m.error(line, f"axis tokens: {value!r} is neither a list nor a range like 1..48") from None
        if not sep or lo > hi:
            raise m.error(line, f"axis tokens: bad range {value!r}")
        out = list(range(lo, hi + 1))
    elif isinstance(value, int):
        out = [value]
    else:
        out = list(value)
    for t in out:
        if not isinstance(t, int) or isinstance(t, bool) or not 1 <= t <= max_tokens:
            raise m.error(line, f"axis tokens: {t!r} outside 1..{max_tokens} (vLLM's MAX_TOKENS)")
    return out


def _check_values(m, name: str, values, allowed, line: int) -> list:
    if not isinstance(values, list) or not values:
        raise m.error(line, f"axis {name}: expected a non-empty list")
    seen = set()
    for v in values:
        if allowed is not None and v not in allowed:
            raise m.error(line, f"axis {name}: unknown value {v!r} (known: {', '.join(map(str, allowed))})")
        if v in seen:
            raise m.error(line, f"axis {name}: duplicate value {v!r}")
        seen.add(v)
    return list(values)


def check_match(m, where: dict, line: int, what: str, allowed=_MATCH_FIELDS) -> dict:
    if not isinstance(where, dict):
        raise m.error(line, f"{what}: expected a mapping of field: value")
    for name, want in where.items():
        if name not in allowed:
            raise m.error(line_of(where, name), f"{what}: unknown field {name!r} (known: {', '.join(sorted(allowed))})")
        if isinstance(want, str) and name not in ("arch", "kind", "group", "release") and not _CMP.match(want):
            raise m.error(line_of(where, name), f"{what}: {name}: {want!r} is not a comparison like '> 42'")
        if name == "arch":
            for v in want if isinstance(want, list) else [want]:
                if v not in ARCHES:
                    raise m.error(line_of(where, name), f"{what}: unknown arch {v!r} (known: {', '.join(ARCHES)})")
        if name == "release":
            for v in want if isinstance(want, list) else [want]:
                if v not in RELEASES:
                    raise m.error(line_of(where, name), f"{what}: unknown vLLM release {v!r} (known: "
                                                     f"{', '.join(RELEASES)}; write it quoted)")
        if name == "kind":
            for v in want if isinstance(want, list) else [want]:
                if v not in KINDS:
                    raise m.error(line_of(where, name), f"{what}: unknown kind {v!r} (known: {', '.join(KINDS)})")
    return where


def expand_release(m, doc: dict, version: str, sec: dict, digest: str) -> list:
    """The (group, key) pairs of one release, after its rules."""
    rel = RELEASES[version]
    axes = sec["axes"]
    for name in axes:
        if name not in _AXES:
            raise m.error(line_of(axes, name), f"unknown axis {name!r} (known: {', '.join(sorted(_AXES))})")
    for name in _AXES:
        if name not in axes:
            raise m.error(line_of(sec, "axes"), f"missing axis {name!r}")
    arches = _check_values(m, "arch", axes["arch"], list(rel.arches), line_of(axes, "arch"))
    tps = _check_values(m, "tp", axes["tp"], None, line_of(axes, "tp"))
    for tp in tps:
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise m.error(line_of(axes, "tp"), f"axis tp: {tp!r} is not a TP size")
    tokens = _tokens(axes["tokens"], m, line_of(axes, "tokens"), rel.max_tokens)
    if len(set(tokens)) != len(tokens):
        raise m.error(line_of(axes, "tokens"), "axis tokens: duplicate value")
    timelines = _check_values(m, "timeline", axes["timeline"], [False, True], line_of(axes, "timeline"))

    kind_fields = {f for f in _KIND_FIELDS if rel.reads(f)}
    routing_fields = {f for f in _ROUTING_FIELDS if rel.reads(f)}
    layer_kinds = sec.get("layer_kinds") or {}
    kinds_by_name: dict = {}
    for lname, entries in layer_kinds.items():
        seen = set()
        for i, entry in enumerate(entries or []):
            line = line_of(entries, i)
            if not isinstance(entry, dict) or set(entry) != kind_fields:
                raise m.error(line, f"layer_kinds.{lname}: each entry needs exactly {sorted(kind_fields)} "
                                   f"(vLLM {version}'s MonoBuild layer fields)")
            if entry["ratio"] not in RATIOS:
                raise m.error(line, f"layer_kinds.{lname}: unknown ratio {entry['ratio']!r} (known: {RATIOS})")
            for b in sorted(kind_fields - {"ratio"}):
                if not isinstance(entry[b], bool):
                    raise m.error(line, f"layer_kinds.{lname}: {b} must be true or false")
            t = tuple(sorted(entry.items()))
            if t in seen:
                raise m.error(line, f"layer_kinds.{lname}: duplicate layer kind {dict(entry)}")
            seen.add(t)
            kinds_by_name.setdefault(lname, []).append(dict(entry))
        if lname not in kinds_by_name:
            raise m.error(line_of(layer_kinds, lname), f"layer_kinds.{lname} is empty")

    routing = sec.get("routing") or {}
    for rname, preset in routing.items():
        if not isinstance(preset, dict) or set(preset) != routing_fields:
            raise m.error(line_of(routing, rname), f"routing.{rname}: needs exactly {sorted(routing_fields)} "
                                                f"(vLLM {version}'s MonoBuild routing fields)")
        for f, v in preset.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise m.error(line_of(preset, f), f"routing.{rname}.{f}: {v!r} is not a positive integer")

    entry = ReleaseEntry(version, digest, line=line_of(doc["releases"], version), layer_kinds=kinds_by_name,
                         routing={name: dict(preset) for name, preset in routing.items()})
    m.releases[version] = entry

    groups = sec["groups"]
    expanded: list = []
    gnames = set()
    for i, g in enumerate(groups or []):
        line = line_of(groups, i)
        if not isinstance(g, dict) or not {"name", "kinds", "routing"} <= set(g) or set(g) - {"name", "kinds", "routing", "layers"}:
            raise m.error(line, "groups: each group needs name, kinds, routing and (for k1/k2) layers")
        if g["name"] in gnames:
            raise m.error(line, f"groups: duplicate group {g['name']!r}")
        gnames.add(g["name"])
        for kind in g["kinds"]:
            if kind not in KINDS:
                raise m.error(line, f"group {g['name']}: unknown launch kind {kind!r} (known: {', '.join(KINDS)})")
        if g["routing"] not in routing:
            raise m.error(line, f"group {g['name']}: unknown routing {g['routing']!r} (known: {', '.join(routing)})")
        whole = [k for k in g["kinds"] if KINDS[k].whole_layer]  # built per layer kind (facts/kinds.py)
        if whole and g.get("layers") not in kinds_by_name:
            raise m.error(line, f"group {g['name']}: unknown layers {g.get('layers')!r} (known: {', '.join(kinds_by_name)})")
        lkinds = kinds_by_name[g["layers"]] if whole else [{"ratio": 0}]
        preset = routing[g["routing"]]
        for arch, tp, lk, s, tl, kind in itertools.product(arches, tps, lkinds, tokens, timelines, g["kinds"]):
            try:
                key = BuildKey(kind=kind, arch=arch, tokens=s, tp=tp, timeline=tl, release=version, **lk, **preset)
            except KeyFormatError as e:
                raise m.error(line, f"group {g['name']}: {e}") from None
            expanded.append((g["name"], key))

    allowed = {f for f in _MATCH_FIELDS if f in ("arch", "kind", "group", "release") or rel.reads(f)}
    rules = []
    for i, r in enumerate(sec.get("rules") or []):
        line = line_of(sec["rules"], i)
        if not isinstance(r, dict) or "when" not in r or ("drop" in r) == ("set" in r) or set(r) - {"when", "drop", "set", "source"}:
            raise m.error(line, "rules: each rule needs `when` and exactly one of `drop: true` / `set: {...}` (and `source`)")
        if "source" not in r:
            raise m.error(line, "rules: name the upstream `source` the rule follows")
        when = check_match(m, r["when"], line, f"vLLM {version} rule `when`", allowed=allowed)
        for name in when:
            if name == "group" and any(v not in gnames for v in (when[name] if isinstance(when[name], list) else [when[name]])):
                raise m.error(line_of(when, name), f"rule `when`: unknown group {when[name]!r} (known: {', '.join(sorted(gnames))})")
        sets = r.get("set") or {}
        check_match(m, sets, line, f"vLLM {version} rule `set`", allowed=allowed & _SET_FIELDS)
        rules.append(Rule(when=dict(when), drop=bool(r.get("drop")), set=dict(sets), source=r["source"], line=line,
                          release=version))
    m.rules += rules

    for rule in rules:
        out = []
        for g, key in expanded:
            if matches(rule.when, key, g):
                if rule.drop:
                    continue
                try:
                    key = key.with_(**rule.set)
                except KeyFormatError as e:
                    raise m.error(rule.line, f"rule `set` makes an invalid key: {e}") from None
            out.append((g, key))
        expanded = out
    if not expanded:
        raise m.error(entry.line, f"the rules of vLLM {version} drop every key")
    return expanded


