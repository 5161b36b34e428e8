"""Deployment -> every key a vLLM release can ask for, and a check that a
prebuilt directory (or a matrix profile) holds them all, per release.

Everything here is written from each release's vLLM sources
(``facts/releases.py``: its ``Deploy`` per arch, its whole-layer ratios, its
MonoBuild fields), independently of the build matrix -- its ``rules:`` and
its ``layer_kinds`` -- so ``dsv41-aot coverage --profile full`` really checks
the matrix: the layer kinds are every (ratio, fold, index) the release's
runner accepts, not one checkpoint's schedule. The matrix's own layer kinds
are checked against the invariants vLLM asserts. Paths are relative to
``vllm/models/deepseek_v41/`` of the release.

    dsv41-aot coverage --arch gfx950 --tp 4 --draft dspark          # every release
    dsv41-aot coverage --arch gfx950 --tp 4 --release 0.32.0 --profile full --json
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import AotError
from ..facts.arches import ARCHES
from ..facts.releases import NEWEST, release_facts, version_order
from ..keys import DEFAULTS, BuildKey
from ..manifest import MANIFEST, prebuilt_dir, releases_in, room_dir
from ..room import Room

# amd/mono_decode.py MonoDecodeLayer._create: ``experts, topk = 384, 6`` for a
# target layer; _mono_runner builds the target's DSV41MonoLayer with its
# defaults: timeline=False, ug_groups=2, swa_width=WINDOW (attention/plan.py,
# 128). vLLM 0.32.0's MonoBuild has no routing fields: it is these values.
TARGET = dict(experts=384, topk=6, ug_groups=2, swa_width=128)
TIMELINE = False
# amd/mono_decode.py DRAFT_UG_GROUPS = 1 (0.33.0): _mono_runner(draft=...) builds
# the draft's runner with it and the draft layer's experts / topk / swa_width
DRAFT_UG_GROUPS = 1


class CoverageInputError(AotError):
    """A deployment coverage cannot describe (unknown arch, unsupported TP...)."""


class NotDeployed(CoverageInputError):
    """A deployment one release's mono path does not run (arch or TP): skipped
    when every release is checked, bad input when that release is named."""


@dataclass(frozen=True)
class Deployment:
    """One vLLM deployment of the mono path: release, arch, TP size, step rows
    at most, and the DSpark draft's (experts, topk, swa_width) when it has one."""

    arch: str
    tp: int
    max_rows: int
    draft: tuple | None = None
    release: str = NEWEST

    def describe(self) -> str:
        if self.draft is None:
            d = "no draft"
        elif release_facts(self.release).deploy(self.arch).draft_layers is None:
            d = "draft layers off the mono path"
        else:
            d = "draft e=%d k=%d w=%d" % self.draft
        return f"vLLM {self.release} {self.arch} TP{self.tp}, steps of 1..{self.max_rows} rows, {d}"


def deployment(arch: str, tp: int, max_rows: int | None = None, draft: tuple | None = None,
               release: str = NEWEST) -> Deployment:
    """Validate a deployment against vLLM ``release``'s own refusals (exit 2
    when wrong; NotDeployed when the release does not run the arch or TP)."""
    rel = release_facts(release)
    runs = "; ".join(f"{a}: TP {' or '.join(map(str, d.tp_sizes))}" for a, d in rel.arches.items())
    fix = f"dsv41-aot coverage --release {release} --arch {next(iter(rel.arches))} --tp 4  ({runs})"
    if arch not in ARCHES:
        raise CoverageInputError(f"unknown arch {arch!r}: dsv41-aot knows {', '.join(ARCHES)}", fix=fix)
    if arch not in rel.arches:
        raise NotDeployed(f"vLLM {release}'s mono path does not run on {arch} (amd/mono_decode.py: it runs on "
                          f"{', '.join(rel.arches)})", fix=fix)
    dep = rel.deploy(arch)
    if tp not in dep.tp_sizes:
        raise NotDeployed(
            f"vLLM {release}'s mono path refuses {arch} at TP {tp} (amd/mono_decode.py MonoDecodeLayer._create: "
            f"{arch} takes tensor parallel size {' or '.join(map(str, dep.tp_sizes))})",
            fix=fix,
        )
    if max_rows is None:
        max_rows = dep.max_rows
    if max_rows < 1:
        raise CoverageInputError(f"--max-rows {max_rows}: a step has at least one row", fix="pass --max-rows 1..48")
    if draft is not None:
        if len(draft) != 3 or any(not isinstance(v, int) or v < 1 for v in draft):
            raise CoverageInputError(f"--draft {draft}: expected three positive integers experts,topk,swa_width",
                                     fix="--draft 128,3,192  (or --draft dspark: the matrix's routing preset)")
    return Deployment(arch, tp, min(max_rows, dep.max_rows), tuple(draft) if draft else None, release)


# ------------------------------------------------------------------ the schedule (data)


def layer_kinds(release: str = NEWEST) -> dict:
    """Every (ratio, fold, index) vLLM ``release``'s runner runs a whole layer
    with. 0.33.0's target layers: runner.forward takes any compress ratio
    attention.py allows (0, 1, 2), fold True or False (mono_decode.py passes
    False on the first layer and after an Engram write, which the checkpoint
    places), and index only on a compressed layer (``assert not index or
    ratio``); its draft layers: mono_decode._create refuses "a draft layer
    with compressed keys" or an indexer, and the first settles the residual
    (fold False). 0.32.0: a layer runs whole with ratio 1 or 2 only, its
    MonoBuild has no fold or index (pinned), and no draft layer takes the
    mono path. A field the release's MonoBuild lacks takes its pinned value."""
    rel = release_facts(release)
    folds = (False, True) if rel.reads("fold") else (DEFAULTS["fold"],)
    indexes = (False, True) if rel.reads("index") else (DEFAULTS["index"],)
    whole_drafts = any(d.draft_layers == "whole" for d in rel.arches.values())
    return {
        "backbone": [(r, f, i) for r in rel.whole_ratios for f in folds for i in indexes if r or not i],
        "draft": [(0, f, False) for f in folds] if whole_drafts else [],
    }


def schedule(path=None) -> dict:
    """{"matrix": the loaded matrix, "routing": {preset: fields} (each
    preset's fields from the newest release that gives them all)}, after
    the matrix's own layer kinds were checked, per release, against what
    that release's vLLM asserts: an index source is a compressed layer
    (runner.forward ``assert not index or ratio``), a layer runs whole only
    with the release's whole-layer ratios, a draft layer has no compressed
    keys (mono_decode._create), and only a release whose mono path runs
    draft layers whole lists draft layer kinds."""
    from . import matrix

    m = matrix.load(path)
    mpath = Path(m.path)
    routing: dict = {}
    for version, entry in m.releases.items():
        rel = release_facts(version)
        whole_drafts = any(d.draft_layers == "whole" for d in rel.arches.values())
        for name, entries in entry.layer_kinds.items():
            for e in entries:
                where = f"{mpath}: vLLM {version} layer_kinds.{name} {dict(e)}"
                ratio = int(e["ratio"])
                index = bool(e.get("index", DEFAULTS["index"]))
                if index and not ratio:
                    raise CoverageInputError(f"{where}: an index source has compressed keys "
                                             f"(runner.py forward: assert not index or ratio)", fix=f"edit {mpath}")
                if ratio not in rel.whole_ratios:
                    raise CoverageInputError(f"{where}: vLLM {version} runs a layer whole only with compress ratio "
                                             f"{' or '.join(map(str, rel.whole_ratios))} (amd/mono_decode.py)",
                                             fix=f"edit {mpath}")
                if name == "draft" and (ratio or index):
                    raise CoverageInputError(f"{where}: vLLM runs no draft layer with compressed keys on the mono "
                                             f"path (mono_decode.py)", fix=f"edit {mpath}")
                if name == "draft" and not whole_drafts:
                    raise CoverageInputError(f"{where}: vLLM {version}'s mono path runs no draft layer whole "
                                             f"(mono_decode.py)", fix=f"edit {mpath}")
    for version in sorted(m.releases, key=version_order, reverse=True):
        for name, preset in m.releases[version].routing.items():
            if name not in routing and {"experts", "topk", "swa_width"} <= set(preset):
                routing[name] = dict(preset)
    return {"matrix": m, "routing": routing}


# ------------------------------------------------------------------ the rules (code)


def _key(kind: str, release: str, **fields) -> BuildKey:
    """A key of ``release`` from the fields its MonoBuild has (the others
    keep their pinned values)."""
    rel = release_facts(release)
    return BuildKey(kind=kind, release=release, **{k: v for k, v in fields.items() if k == "arch" or rel.reads(k)})


def _k1_k2(dep: Deployment, tokens: int, ratio: int, fold: bool, index: bool, routing: dict) -> list[BuildKey]:
    """runner.py DSV41MonoLayer.kernels(): K1 = build_mono_k1(b), K2 =
    build_mono_k2(b), or (0.33.0 on gfx942) build_mono_k2(replace(b, index=False))."""
    b = dict(arch=dep.arch, tokens=tokens, tp=dep.tp, ratio=ratio, fold=fold, index=index, timeline=TIMELINE, **routing)
    k2 = b if release_facts(dep.release).deploy(dep.arch).k2_reads_index else dict(b, index=False)
    return [_key("k1", dep.release, **b), _key("k2", dep.release, **k2)]


def _ffn(dep: Deployment, tokens: int, experts: int, topk: int) -> BuildKey:
    """runner.py DSV41MonoLayer.ffn_kernel(): 0.33.0 MonoBuild(tokens, tp, 0,
    timeline, experts=, topk=), 0.32.0 MonoBuild(tokens, tp, 0); ug_groups /
    swa_width stay MonoBuild's."""
    return _key("ffn", dep.release, arch=dep.arch, tokens=tokens, tp=dep.tp, ratio=0, timeline=TIMELINE,
                experts=experts, topk=topk)


def required(dep: Deployment, sched: dict | None = None) -> list[BuildKey]:
    """Every key vLLM ``dep.release`` can build for ``dep``, sorted (the
    layer kinds are the release's rules, never the matrix's)."""
    facts = release_facts(dep.release).deploy(dep.arch)
    kinds = layer_kinds(dep.release)
    keys: set = set()
    for tokens in range(1, dep.max_rows + 1):
        # the target's whole layers (MonoDecodeLayer.__call__ -> runner.forward
        # -> kernels(M, attn.compress_ratio[, fold, select is not None]))
        for ratio, fold, index in kinds["backbone"]:
            keys.update(_k1_k2(dep, tokens, ratio, fold, index, TARGET))
        # any other mono layer (0.33.0: an MXFP8 KV cache, another indexer;
        # 0.32.0: ratio 0, a compressor / indexer, Engram): MonoDecodeLayer(
        # ffn_only=True).ffn -> ffn_kernel(M[, gate_w rows = 384, 6])
        keys.add(_ffn(dep, tokens, TARGET["experts"], TARGET["topk"]))
        if dep.draft is None or facts.draft_layers is None:
            continue  # 0.32.0 mono_decode._create: a "draft layer" leaves the mono path
        experts, topk, swa_width = dep.draft
        if facts.draft_layers == "ffn":
            # 0.33.0 mono_decode._create: "On gfx942 the DSpark draft layers take
            # the FFN launch, built for the draft's routing" on the target's runner
            keys.add(_ffn(dep, tokens, experts, topk))
        else:
            # the draft's own runner: DSV41MonoLayer(experts, topk,
            # ug_groups=DRAFT_UG_GROUPS, swa_width) running whole draft layers
            routing = dict(experts=experts, topk=topk, ug_groups=DRAFT_UG_GROUPS, swa_width=swa_width)
            for ratio, fold, index in kinds["draft"]:
                keys.update(_k1_k2(dep, tokens, ratio, fold, index, routing))
    return sorted(keys)


# ------------------------------------------------------------------ what is there


def available_in_dir(root: Path, arch: str, release: str = NEWEST, *,
                     missing_ok: bool = False) -> tuple[set, set | None, str]:
    """(keys in the room's manifest, keys its libs.json links -- None when
    nothing is linked --, what was checked) of ``root/arch/vllm-<release>``;
    with ``missing_ok`` a room that is not there holds nothing."""
    room = room_dir(Path(root) / arch, release)
    if not (room / MANIFEST).is_file():
        if missing_ok:
            return set(), set(), f"{room} (absent)"
        held = releases_in(Path(root) / arch)
        raise CoverageInputError(
            f"no prebuilt kernels for {arch} of vLLM {release} at {room} (no manifest.json; "
            f"{arch} holds {', '.join('vLLM ' + v for v in held) if held else 'no release'})",
            fix=f"dsv41-aot build --arch {arch} --release {release} --out {root}, or pass --dir / --profile")
    r = Room(root, arch, release)
    have = set(r.manifest().entries)
    linked = set(r.links().band_of) if r.libs_path.is_file() else None
    return have, linked, str(room)


def check(dep: Deployment, sched: dict, *, root=None, profile: str | None = None, missing_ok: bool = False) -> dict:
    """The coverage report of ``dep`` against a prebuilt directory's room of
    ``dep.release`` or a matrix profile's keys of that release: required,
    missing (absent), unlinked (in the manifest, not in a linked library:
    the loader would refuse them). Keys are compared with their release: a
    key of another release never satisfies one."""
    need = required(dep, sched)
    texts = [str(k) for k in need]
    unlinked: list = []
    if profile is not None:
        selected = set(sched["matrix"].select(profile))
        missing = [str(k) for k in need if k not in selected]
        against = f"profile {profile!r} of {sched['matrix'].path}"
    else:
        have, linked, against = available_in_dir(Path(root) if root is not None else prebuilt_dir(), dep.arch,
                                                 dep.release, missing_ok=missing_ok)
        missing = [t for t in texts if t not in have]
        unlinked = [t for t in texts if t in have and (linked is None or t not in linked)]
    counts = {kind: sum(1 for k in need if k.kind == kind) for kind in ("k1", "k2", "ffn")}
    return {"release": dep.release, "arch": dep.arch, "tp": dep.tp, "deployment": dep.describe(),
            "against": against, "counts": counts, "required": texts, "missing": missing, "unlinked": unlinked}


def check_all(arch: str, tp: int, *, max_rows=None, draft_text: str | None = None, release: str | None = None,
              root=None, profile: str | None = None, matrix_path=None) -> tuple[list[dict], list[dict]]:
    """(reports, skipped) for the deployment under ``release``, or under
    every release of the matrix: a release that does not run the deployment
    is skipped ({"release", "arch", "tp", "reason"}), unless it was named
    (NotDeployed, exit 2). A prebuilt directory with no room of the arch at
    all is bad input; one without the room of some release (every release
    checked) misses all that release's keys."""
    sched = schedule(matrix_path)
    draft = _parse_draft(draft_text, sched["routing"])
    releases = [release_facts(release).version] if release is not None else list(sched["matrix"].releases)
    skipped, deps = [], []
    for version in releases:
        try:
            deps.append(deployment(arch, tp, max_rows, draft, version))
        except NotDeployed as e:
            if release is not None:
                raise
            skipped.append({"release": version, "arch": arch, "tp": tp, "reason": str(e).split("\n")[0]})
    if not deps:
        raise NotDeployed(f"no vLLM release of the matrix runs {arch} at TP {tp}: "
                          f"{'; '.join(s['reason'] for s in skipped)}",
                          fix="pick a deployment one of them runs (see dsv41-aot coverage --help)")
    if profile is None:
        root = Path(root) if root is not None else prebuilt_dir()
        if release is None and not releases_in(root / arch):
            raise CoverageInputError(f"no prebuilt kernels for {arch} at {root / arch} (no vllm-<release>/manifest.json)",
                                     fix=f"dsv41-aot build --arch {arch} --out {root}, or pass --dir / --profile")
    reports = [check(dep, sched, root=root, profile=profile, missing_ok=release is None) for dep in deps]
    return reports, skipped


# ------------------------------------------------------------------ CLI


def _parse_draft(text: str | None, routing: dict) -> tuple | None:
    if text is None:
        return None
    if text in routing:
        r = routing[text]
        return (r["experts"], r["topk"], r["swa_width"])
    try:
        parts = tuple(int(p) for p in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3:
        raise CoverageInputError(f"--draft {text!r}: expected experts,topk,swa_width or a routing preset "
                                 f"({', '.join(routing)})", fix="--draft 128,3,192  (or --draft dspark)")
    return parts
