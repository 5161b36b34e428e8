"""Deployment -> every key vLLM 0.33.0 can ask for, and a check that a
prebuilt directory (or a matrix profile) holds them all.

Everything here is written from vLLM's sources, independently of the build
matrix -- its ``rules:`` and its ``layer_kinds`` -- so ``dsv41-aot coverage
--profile full`` really checks the matrix: the layer kinds are every
(ratio, fold, index) ``runner.forward`` accepts, not one checkpoint's
schedule. The matrix's own layer kinds are checked against the invariants
vLLM asserts. Paths are relative to ``vllm/models/deepseek_v41/``.

    dsv41-aot coverage --arch gfx950 --tp 4 --draft dspark
    dsv41-aot coverage --arch gfx942 --tp 4 --profile full --json
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import AotError
from ..facts.arches import ARCHES, arch_facts
from ..facts.releases import RELEASES
from ..keys import RATIOS, BuildKey
from ..manifest import LIB, LIBS_JSON, MANIFEST, Manifest, prebuilt_dir

# Per arch (dsv41_aot/facts/arches.py, each fact with its vLLM source): the TP
# sizes MonoDecodeLayer._create accepts, the row cap of _max_rows() (a step
# takes the kernels at 1..cap rows, eager steps of any width), whether the
# runner's K2 reads index, and how a DSpark draft layer runs.
# amd/mono_decode.py MonoDecodeLayer._create: ``experts, topk = 384, 6`` for a
# target layer; _mono_runner builds the target's DSV41MonoLayer with its
# defaults: timeline=False, ug_groups=2, swa_width=WINDOW (attention/plan.py, 128)
TARGET = dict(experts=384, topk=6, ug_groups=2, swa_width=128)
TIMELINE = False
# amd/mono_decode.py DRAFT_UG_GROUPS = 1: _mono_runner(draft=...) builds the
# draft's runner with it and the draft layer's experts / topk / swa_width
DRAFT_UG_GROUPS = 1


class CoverageInputError(AotError):
    """A deployment coverage cannot describe (unknown arch, unsupported TP...)."""


@dataclass(frozen=True)
class Deployment:
    """One vLLM deployment of the mono path: arch, TP size, step rows at most,
    and the DSpark draft's (experts, topk, swa_width) when it has one."""

    arch: str
    tp: int
    max_rows: int
    draft: tuple | None = None

    def describe(self) -> str:
        d = "no draft" if self.draft is None else "draft e=%d k=%d w=%d" % self.draft
        return f"{self.arch} TP{self.tp}, steps of 1..{self.max_rows} rows, {d}"


def deployment(arch: str, tp: int, max_rows: int | None = None, draft: tuple | None = None) -> Deployment:
    """Validate a deployment against vLLM's own refusals (exit 2 when wrong)."""
    tps = "; ".join(f"{a.name}: TP {' or '.join(map(str, a.tp_sizes))}" for a in ARCHES.values())
    fix = f"dsv41-aot coverage --arch {next(iter(ARCHES))} --tp 4  ({tps})"
    if arch not in ARCHES:
        raise CoverageInputError(f"unknown arch {arch!r}: vLLM's mono path runs on {', '.join(ARCHES)}", fix=fix)
    facts = arch_facts(arch)
    if tp not in facts.tp_sizes:
        raise CoverageInputError(
            f"vLLM's mono path refuses {arch} at TP {tp} (mono_decode.py MonoDecodeLayer._create: "
            f"{arch} takes tensor parallel size {' or '.join(map(str, facts.tp_sizes))})",
            fix=fix,
        )
    cap = facts.max_rows
    if max_rows is None:
        max_rows = cap
    if max_rows < 1:
        raise CoverageInputError(f"--max-rows {max_rows}: a step has at least one row", fix="pass --max-rows 1..48")
    if draft is not None:
        if len(draft) != 3 or any(not isinstance(v, int) or v < 1 for v in draft):
            raise CoverageInputError(f"--draft {draft}: expected three positive integers experts,topk,swa_width",
                                     fix="--draft 128,3,192  (or --draft dspark: the matrix's routing preset)")
    return Deployment(arch, tp, min(max_rows, cap), tuple(draft) if draft else None)


# ------------------------------------------------------------------ the schedule (data)


def _matrix_doc(path) -> tuple[Path, dict]:
    """The matrix file's ``layer_kinds`` and ``routing``, after matrix.load has
    validated the whole file."""
    from . import matrix

    m = matrix.load(path)
    return Path(m.path), {"layer_kinds": m.layer_kinds, "routing": m.routing, "matrix": m}


def layer_kinds() -> dict:
    """Every (ratio, fold, index) vLLM's runner runs a whole layer with.
    Target layers: runner.forward takes any compress ratio attention.py
    allows (0, 1, 2), fold True or False (mono_decode.py passes False on the
    first layer and after an Engram write, which the checkpoint places), and
    index only on a compressed layer (``assert not index or ratio``). Draft
    layers: mono_decode._create refuses "a draft layer with compressed keys"
    or an indexer, and its first layer settles the residual (fold False)."""
    folds = (False, True)
    return {
        "backbone": [(r, f, i) for r in RATIOS for f in folds for i in (False, True) if r or not i],
        "draft": [(0, f, False) for f in folds],
    }


def schedule(path=None) -> dict:
    """{"backbone": [(ratio, fold, index), ...], "draft": [...]} (``layer_kinds``),
    the matrix file's routing presets and the matrix; the matrix's own
    layer kinds are checked against what vLLM asserts: runner.forward
    ``assert not index or ratio`` (an index source is a compressed layer);
    mono_decode._create refuses "a draft layer with compressed keys"."""
    mpath, doc = _matrix_doc(path)
    out = layer_kinds()
    for name, entries in doc["layer_kinds"].items():
        for e in entries:
            ratio, fold, index = int(e["ratio"]), bool(e["fold"]), bool(e["index"])
            if index and not ratio:
                raise CoverageInputError(f"{mpath}: layer_kinds.{name} {dict(e)}: an index source has compressed keys "
                                         f"(runner.py forward: assert not index or ratio)", fix=f"edit {mpath}")
            if name == "draft" and (ratio or index):
                raise CoverageInputError(f"{mpath}: layer_kinds.draft {dict(e)}: vLLM runs no draft layer with "
                                         f"compressed keys on the mono path (mono_decode.py)", fix=f"edit {mpath}")
    out["routing"] = {k: dict(v) for k, v in doc["routing"].items()}
    out["matrix"] = doc["matrix"]
    return out


# ------------------------------------------------------------------ the rules (code)


def _k1_k2(arch: str, tp: int, tokens: int, ratio: int, fold: bool, index: bool, routing: dict) -> list[BuildKey]:
    """runner.py DSV41MonoLayer.kernels(): K1 = build_mono_k1(b),
    K2 = build_mono_k2(replace(b, index=False) if GFX942 else b)."""
    b = dict(arch=arch, tokens=tokens, tp=tp, ratio=ratio, fold=fold, index=index, timeline=TIMELINE, **routing)
    k2 = b if arch_facts(arch).k2_reads_index else dict(b, index=False)
    return [BuildKey(kind="k1", **b), BuildKey(kind="k2", **k2)]


def _ffn(arch: str, tp: int, tokens: int, experts: int, topk: int) -> BuildKey:
    """runner.py DSV41MonoLayer.ffn_kernel(): MonoBuild(tokens, tp, 0,
    timeline, experts=, topk=); ug_groups / swa_width stay MonoBuild's."""
    return BuildKey(kind="ffn", arch=arch, tokens=tokens, tp=tp, ratio=0, timeline=TIMELINE, experts=experts, topk=topk)


def required(dep: Deployment, sched: dict) -> list[BuildKey]:
    """Every key vLLM 0.33.0 can build for ``dep``, sorted."""
    keys: set = set()
    for tokens in range(1, dep.max_rows + 1):
        # the target's whole layers (MonoDecodeLayer.__call__ -> runner.forward
        # -> kernels(M, attn.compress_ratio, fold, select is not None))
        for ratio, fold, index in sched["backbone"]:
            keys.update(_k1_k2(dep.arch, dep.tp, tokens, ratio, fold, index, TARGET))
        # a target layer outside the whole-layer kernels (MXFP8 KV cache, another
        # indexer): MonoDecodeLayer(ffn_only=True).ffn -> runner.ffn(topk=6)
        # -> ffn_kernel(M, gate_w rows = 384, 6)
        keys.add(_ffn(dep.arch, dep.tp, tokens, TARGET["experts"], TARGET["topk"]))
        if dep.draft is not None:
            experts, topk, swa_width = dep.draft
            if arch_facts(dep.arch).draft_layers == "ffn":
                # mono_decode._create: "On gfx942 the DSpark draft layers take the
                # FFN launch, built for the draft's routing" on the target's runner
                keys.add(_ffn(dep.arch, dep.tp, tokens, experts, topk))
            else:
                # the draft's own runner: DSV41MonoLayer(experts, topk,
                # ug_groups=DRAFT_UG_GROUPS, swa_width) running whole draft layers
                routing = dict(experts=experts, topk=topk, ug_groups=DRAFT_UG_GROUPS, swa_width=swa_width)
                for ratio, fold, index in sched["draft"]:
                    keys.update(_k1_k2(dep.arch, dep.tp, tokens, ratio, fold, index, routing))
    return sorted(keys)


# ------------------------------------------------------------------ what is there


def available_in_dir(root: Path, arch: str) -> tuple[set, set | None, str]:
    """(keys in the manifest, keys linked -- None when nothing is linked --,
    what was checked) of ``root/arch``."""
    folder = Path(root) / arch
    if not (folder / MANIFEST).is_file():
        raise CoverageInputError(f"no prebuilt kernels for {arch} at {folder} (no manifest.json)",
                                 fix=f"dsv41-aot build --arch {arch} --out {root}, or pass --dir / --profile")
    have = set(Manifest.read(folder, arch).entries)
    linked = None
    libs = folder / LIB / LIBS_JSON
    if libs.is_file():
        try:
            doc = json.loads(libs.read_bytes())
            linked = {k for lib in doc["libraries"] for k in lib["entries"]}
        except (ValueError, KeyError, TypeError):
            raise CoverageInputError(f"{libs}: not a dsv41-aot link record", fix=f"dsv41-aot link --dir {root}") from None
    return have, linked, str(folder)


def check(dep: Deployment, sched: dict, *, root=None, profile: str | None = None) -> dict:
    """The coverage report of ``dep`` against a prebuilt directory or a
    matrix profile: required, missing (absent), unlinked (in the manifest,
    not in a linked library: the loader would refuse them)."""
    need = required(dep, sched)
    texts = [str(k) for k in need]
    unlinked: list = []
    if profile is not None:
        have = {str(k) for k in sched["matrix"].select(profile)}
        against = f"profile {profile!r} of {sched['matrix'].path}"
    else:
        if root is None:
            root = prebuilt_dir()
        have, linked, against = available_in_dir(Path(root), dep.arch)
        if linked is not None:
            unlinked = [t for t in texts if t in have and t not in linked]
        else:
            unlinked = [t for t in texts if t in have]
    missing = [t for t in texts if t not in have]
    counts = {kind: sum(1 for k in need if k.kind == kind) for kind in ("k1", "k2", "ffn")}
    return {"deployment": dep.describe(), "against": against, "counts": counts,
            "required": texts, "missing": missing, "unlinked": unlinked}


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


def register(sub) -> None:
    p = sub.add_parser("coverage", help="the keys vLLM can ask for on a deployment, checked against prebuilt kernels")
    p.add_argument("--arch", required=True, help=" or ".join(f"{a.name} ({a.products})" for a in ARCHES.values()))
    p.add_argument("--tp", type=int, required=True, help="tensor parallel size (vLLM's mono path: " + "; ".join(
        f"{rel.version} {arch}: {' or '.join(map(str, d.tp_sizes))}"
        for rel in RELEASES.values() for arch, d in rel.arches.items()) + ")")
    p.add_argument("--max-rows", type=int, help="largest decode step in rows (default and cap: " + ", ".join(
        f"{rel.version} {arch} {d.max_rows}" for rel in RELEASES.values() for arch, d in rel.arches.items()) + ")")
    p.add_argument("--draft", help="the DSpark draft's experts,topk,swa_width (e.g. 128,3,192) or a matrix "
                                   "routing preset name (dspark); omit without a draft")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--dir", help="prebuilt directory to check (default: what the loader uses)")
    src.add_argument("--profile", help="check a build matrix profile instead, without building")
    p.add_argument("--matrix", help="build matrix file (default: build_matrix.yaml): routing presets, profiles")
    p.add_argument("--json", action="store_true", help='print {"required": [...], "missing": [...], ...}')
    p.set_defaults(func=run)


def run(args) -> int:
    sched = schedule(args.matrix)
    dep = deployment(args.arch, args.tp, args.max_rows, _parse_draft(args.draft, sched["routing"]))
    rep = check(dep, sched, root=args.dir, profile=args.profile)
    bad = rep["missing"] or rep["unlinked"]
    if args.json:
        from .output import print_json, tally

        failures = [{"key": k, "error": "missing"} for k in rep["missing"]] + \
                   [{"key": k, "error": "not linked"} for k in rep["unlinked"]]
        print_json(tally(len(rep["required"]), len(rep["required"]) - len(failures), failures, **rep))
        return 1 if bad else 0
    missing, unlinked = set(rep["missing"]), set(rep["unlinked"])
    for k in rep["required"]:
        mark = "MISSING " if k in missing else "UNLINKED" if k in unlinked else "ok      "
        print(f"{mark} {k}")
    c = rep["counts"]
    print(f"{rep['deployment']}: {len(rep['required'])} keys (K1 {c['k1']}, K2 {c['k2']}, FFN {c['ffn']}) "
          f"checked against {rep['against']}: {len(rep['missing'])} missing, {len(rep['unlinked'])} not linked")
    shown = " ".join(repr(k) for k in rep["missing"][:3]) + (" ..." if len(rep["missing"]) > 3 else "")
    if rep["missing"] and args.profile:
        print(f"  fix: make profile {args.profile!r} select {shown} (edit the matrix; check with "
              f"dsv41-aot build --list --profile {args.profile})")
    elif rep["missing"]:
        out = args.dir or "kernels_prebuilt"
        print(f"  fix: dsv41-aot build --key {shown} --out {out} && dsv41-aot link --dir {out}")
    elif rep["unlinked"]:
        print(f"  fix: dsv41-aot link --dir {args.dir or 'kernels_prebuilt'}")
    return 1 if bad else 0
