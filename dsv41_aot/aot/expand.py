"""One release's entry in the build matrix, expanded to its keys.

The keys are those of the calls ``deployment.runner_calls`` lists that
the entry covers. A value the release's own entry gives that adds no key is
an error, so a typo does not pass unnoticed. ``m`` is the
:class:`.matrix.Matrix` being loaded; its ``error`` names the file and line.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ..deployment import NotDeployed, deployment, runner_calls
from ..facts.arches import ARCHES
from ..facts.kinds import KINDS
from ..facts.releases import ALL_FIELDS, RELEASES
from ..keys import RATIOS, BuildKey
from .yamllines import line_of

AXES = ("arch", "tp", "tokens")
LAYER_FIELDS = ("ratio", "fold", "index")  # RunnerCall.layer's order
DRAFT_FIELDS = ("experts", "topk", "swa_width")  # coverage.Deployment.draft's order
_MATCH_FIELDS = {"arch", "kind", "release", *ALL_FIELDS}  # what a `where` filter can name


@dataclass
class ReleaseEntry:
    """One release's entry in the matrix, its sections resolved through ``like``."""

    version: str
    mono_sources: str
    line: int
    drafts: dict = field(default_factory=dict)  # name -> (experts, topk, swa_width)


def matches(where: dict, key: BuildKey) -> bool:
    """Whether ``key`` has the values ``where`` names (a value or a list per field)."""
    for name, want in where.items():
        have = getattr(key, name)
        if have not in (want if isinstance(want, list) else [want]):
            return False
    return True


def check_match(m, where: dict, line: int, what: str) -> dict:
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
    return where


def _positive_int(v) -> bool:
    """Whether ``v`` is an integer >= 1 (YAML's true and false are not integers here)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _tokens(value, m, line: int, max_tokens: int) -> list[int]:
    """The tokens axis as a list: a list, one width, or a range like 1..48."""
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
        if not _positive_int(t) or t > max_tokens:
            raise m.error(line, f"axis tokens: {t!r} outside 1..{max_tokens} (vLLM's MAX_TOKENS)")
    if len(set(out)) != len(out):
        raise m.error(line, "axis tokens: duplicate value")
    return out


def _values(m, what: str, values, allowed, line: int) -> list:
    """A checked list of values: each in ``allowed`` (None: positive ints), none twice."""
    if not isinstance(values, list) or not values:
        raise m.error(line, f"{what}: expected a non-empty list")
    for i, v in enumerate(values):
        if allowed is None and not _positive_int(v):
            raise m.error(line, f"{what}: {v!r} is not a positive integer")
        if allowed is not None and v not in allowed:
            raise m.error(line, f"{what}: unknown value {v!r} (known: {', '.join(map(str, allowed))})")
        if v in values[:i]:
            raise m.error(line, f"{what}: duplicate value {v!r}")
    return list(values)


def _mapping(m, sec: dict, name: str, known, noun: str, version: str, line: int):
    """Section ``name`` of a release: a mapping whose keys are among ``known`` (None: any)."""
    value = sec.get(name)
    if not isinstance(value, dict):
        raise m.error(line, f"release {version}: {name} must be a mapping")
    for entry in value:
        if known is not None and entry not in known:
            raise m.error(line_of(value, entry), f"unknown {noun} {entry!r} (known: {', '.join(known)})")
    return value


def _covered(m, version: str, sec: dict, own: set, line: int) -> dict:
    """What one release's sections cover, checked: {(section, field): values}.

    The axes and the layer fields its MonoBuild has; ("drafts", None) holds
    {name: (experts, topk, swa_width)}."""
    rel = RELEASES[version]
    axes = _mapping(m, sec, "axes", AXES, "axis", version, line)
    for name in AXES:
        if name not in axes:
            raise m.error(line_of(axes), f"missing axis {name!r}")
    covered = {
        ("axes", "arch"): _values(m, "axis arch", axes["arch"], ARCHES, line_of(axes, "arch")),
        ("axes", "tp"): _values(m, "axis tp", axes["tp"], None, line_of(axes, "tp")),
        ("axes", "tokens"): _tokens(axes["tokens"], m, line_of(axes, "tokens"), rel.max_tokens),
    }
    kinds = _mapping(m, sec, "layer_kinds", LAYER_FIELDS, "layer field", version, line)
    for f in LAYER_FIELDS:
        if rel.reads(f) and f not in kinds:
            raise m.error(line_of(kinds), f"layer_kinds: missing {f!r} (vLLM {version}'s MonoBuild layer fields: "
                                          f"{', '.join(x for x in LAYER_FIELDS if rel.reads(x))})")
        if not rel.reads(f) and f in kinds and "layer_kinds" in own:
            raise m.error(line_of(kinds, f), f"layer_kinds: vLLM {version}'s MonoBuild has no {f} field")
        if rel.reads(f):  # a field the release lacks (given by `like`) says nothing of its keys
            covered[("layer_kinds", f)] = _values(m, f"layer_kinds.{f}", kinds[f], RATIOS if f == "ratio" else
                                                  [False, True], line_of(kinds, f))
    drafts = _mapping(m, sec, "drafts", None, "draft", version, line) if sec.get("drafts") is not None else {}
    for name, preset in drafts.items():
        if not isinstance(preset, dict) or set(preset) != set(DRAFT_FIELDS) or not all(
                _positive_int(v) for v in preset.values()):
            raise m.error(line_of(drafts, name), f"drafts.{name}: needs exactly {', '.join(DRAFT_FIELDS)}, "
                                                 f"positive integers (the draft runner's routing)")
    covered[("drafts", None)] = {name: tuple(p[f] for f in DRAFT_FIELDS) for name, p in drafts.items()}
    return covered


def expand_release(m, version: str, sec: dict, own: set, line: int) -> list[BuildKey]:
    """The keys of one release: the covered calls its runner can make.

    ``sec`` holds the release's sections; ``own`` names those it gives itself
    rather than through ``like``. Each covered arch x tp is tried with and
    without each draft."""
    covered = _covered(m, version, sec, own, line)
    drafts = covered.pop(("drafts", None))
    m.releases[version].drafts = drafts
    used: set = set()  # (section, field, value) of the values that add a key; ("drafts", name, None)
    keys: set = set()
    for arch, tp in itertools.product(covered[("axes", "arch")], covered[("axes", "tp")]):
        base: set = set()
        for name, draft in [(None, None), *drafts.items()]:
            try:
                dep = deployment(arch, tp, draft=draft, release=version)
            except NotDeployed:
                break  # the release does not run this arch at this TP
            got = set()
            for call in runner_calls(dep):
                layer = [("layer_kinds", f, v) for f, v in zip(LAYER_FIELDS, call.layer or ())
                         if ("layer_kinds", f) in covered]
                if call.tokens in covered[("axes", "tokens")] and all(v in covered[s, f] for s, f, v in layer):
                    got.update(call.keys)
                    used.update([("axes", "arch", arch), ("axes", "tp", tp), ("axes", "tokens", call.tokens), *layer])
            if name is None:
                base = got
            elif got - base:
                used.add(("drafts", name, None))
            keys |= got
    given = [(s, f, v) for (s, f), values in covered.items() for v in values]
    given += [("drafts", name, None) for name in drafts]
    for section, name, value in given:
        if section in own and (section, name, value) not in used:
            what = f"drafts.{name}" if section == "drafts" else f"{section}.{name}: {value!r}"
            raise m.error(line_of(sec[section], name), f"{what} adds no key: vLLM {version}'s runner asks for "
                                                       f"no such key on what the entry covers (its rules: "
                                                       f"dsv41-aot facts)")
    if not keys:
        raise m.error(line, f"vLLM {version}'s entry covers no key its runner asks for")
    return sorted(keys)
