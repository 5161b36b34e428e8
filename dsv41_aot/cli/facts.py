"""``dsv41-aot facts``: the facts tables (``dsv41_aot/facts/``) as they are.

A short table for a person; ``--json`` for a script (ci/bootstrap.sh and
the wheels workflow read the releases and arches from it). Every value
comes from the tables' own dataclasses. Standard library only, like the
tables, so it runs with a bare interpreter and the project on ``PYTHONPATH``.
"""

from __future__ import annotations

import dataclasses

from ..aot.output import print_json, tally
from ..facts.arches import ARCHES
from ..manifest import folder_name
from ..facts.flydsl import FLYDSL, pinned
from ..facts.kinds import KINDS
from ..facts.releases import deployed_arches, oldest_first, releases_on


def document() -> dict:
    """The ``--json`` document's fields: releases, newest, arches, kinds and FlyDSL.

    Releases come newest last, each with its folder; arches are those some
    release runs on, each with the releases that do; ``flydsl`` names the
    releases dsv41-aot compiles and proves with, oldest first, and the one
    the build pins. Tuples stay tuples: JSON writes them as lists."""
    releases = [dict(dataclasses.asdict(r), folder=folder_name(r.version)) for r in oldest_first()]
    arches = [dict(dataclasses.asdict(ARCHES[a]), releases=releases_on(a)) for a in deployed_arches()]
    kinds = [dataclasses.asdict(k) for k in KINDS.values()]
    flydsl = {"supported": [dataclasses.asdict(r) for r in FLYDSL.values()], "pinned": pinned()}
    return {"releases": releases, "newest": releases[-1]["version"], "arches": arches, "kinds": kinds,
            "flydsl": flydsl}


# ---------------------------------------------------------------- CLI


def register(sub) -> None:
    p = sub.add_parser("facts", help="the facts tables: vLLM releases (newest last), GPU arches, launch kinds, "
                                     "FlyDSL releases")
    p.add_argument("--json", action="store_true",
                   help='print one JSON document: {"releases" (newest last), "newest", "arches", "kinds", "flydsl"}')
    p.set_defaults(func=run)


def lines() -> list[str]:
    """The text form: one block per release (newest last), then arches and kinds."""
    out = ["vLLM releases (newest last):"]
    ordered = oldest_first()
    for rel in ordered:
        newest = "  (newest)" if rel is ordered[-1] else ""
        out.append(f"  {rel.version:8} {folder_name(rel.version)}{newest}")
        out.append(f"    MonoBuild({', '.join(rel.mono_fields)})")
        out.append(f"    defaults {', '.join(f'{k}={v}' for k, v in rel.defaults.items())}")
        out.append(f"    whole-layer ratios {', '.join(map(str, rel.whole_ratios))}; steps of 1..{rel.max_tokens} "
                   f"tokens; grid of {rel.grid_ctas} CTAs x {rel.cta_threads} threads")
        for arch, dep in rel.arches.items():
            draft = {"whole": "draft layers whole", "ffn": "draft layers take the FFN launch"}.get(
                dep.draft_layers, "draft layers off the mono path")
            flag = f"{rel.arch_flag}={dep.runner_flag}" if rel.arch_flag else "no arch flag"
            out.append(f"    {arch:7} TP {' or '.join(map(str, dep.tp_sizes))}, rows 1..{dep.max_rows}, "
                       f"K2 {'reads' if dep.k2_reads_index else 'without'} index, {draft}, {flag}")
    out.append("arches:")
    for name in deployed_arches():
        a = ARCHES[name]
        runs = ", ".join(releases_on(name))
        out.append(f"  {a.name:7} {a.products:16} gfx_target_version {a.gfx_target_version}  {a.cus} CUs, "
                   f"LDS {a.lds_bytes // 1024} KiB per CU  vLLM {runs}")
    out.append("launch kinds:")
    for k in KINDS.values():
        asked = f"{k.runner_method}()" + (f"[{k.runner_index}]" if k.runner_index is not None else "")
        shape = "whole layer" if k.whole_layer else "one layer shape"
        fixed = "".join(f", {f}={v} fixed" for f, v in k.fixed.items())
        out.append(f"  {k.name:4} {k.builder:15} {shape:15} {asked:13} unread: {', '.join(k.unread) or '-'}{fixed}")
    out.append("FlyDSL releases dsv41-aot compiles and proves with (oldest first):")
    pin = pinned()
    for r in FLYDSL.values():
        out.append(f"  {r.version:8}{'  (the build pins it)' if r.version == pin else ''}")
    if pin is None:
        out.append("  (which one the build pins: in pyproject.toml; dsv41-aot is not installed here)")
    return out


def run(args) -> int:
    if args.json:
        print_json(tally(0, 0, [], **document()))
    else:
        print("\n".join(lines()))
    return 0
