"""``dsv41-aot coverage``'s arguments and output; ``aot.coverage`` does the work."""

from __future__ import annotations

from .. import commands
from ..aot.coverage import check_all
from ..aot.output import print_json, tally
from ..facts.arches import ARCHES
from ..deployment import counts_text
from ..facts.releases import RELEASES


def register(sub) -> None:
    p = sub.add_parser("coverage", help="the keys each vLLM release can ask for on a deployment, checked against "
                                        "prebuilt kernels")
    p.add_argument("--arch", required=True, help=" or ".join(f"{a.name} ({a.products})" for a in ARCHES.values()))
    p.add_argument("--tp", type=int, required=True, help="tensor parallel size (vLLM's mono path: " + "; ".join(
        f"{rel.version} {arch}: {' or '.join(map(str, d.tp_sizes))}"
        for rel in RELEASES.values() for arch, d in rel.arches.items()) + ")")
    p.add_argument("--max-rows", type=int, help="largest decode step in rows (default and cap: " + ", ".join(
        f"{rel.version} {arch} {d.max_rows}" for rel in RELEASES.values() for arch, d in rel.arches.items()) + ")")
    p.add_argument("--draft", help="the DSpark draft's experts,topk,swa_width (e.g. 128,3,192) or the name of "
                                   "a draft of the matrix (dspark); omit without a draft")
    p.add_argument("--release", help="only this vLLM release (default: every release of the matrix; one that "
                                     "does not run the deployment is skipped)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--dir", help="prebuilt directory to check (default: what the loader uses)")
    src.add_argument("--profile", help="check a build matrix profile instead, without building")
    p.add_argument("--matrix", help="build matrix file (default: build_matrix.yaml): its releases, drafts, profiles")
    p.add_argument("--json", action="store_true", help='print {"reports": [{"release", "required", "missing", '
                                                       '"unlinked", ...} per release], "skipped": [...], ...}')
    p.set_defaults(func=run)


def run(args) -> int:
    reports, skipped = check_all(args.arch, args.tp, max_rows=args.max_rows, draft_text=args.draft,
                                 release=args.release, root=args.dir, profile=args.profile, matrix_path=args.matrix)
    bad = any(r["missing"] or r["unlinked"] for r in reports)
    if args.json:
        failures = [{"key": k, "release": r["release"], "error": why} for r in reports
                    for keys, why in ((r["missing"], "missing"), (r["unlinked"], "not linked")) for k in keys]
        required = sum(len(r["required"]) for r in reports)
        print_json(tally(required, required - len(failures), failures, reports=reports, skipped=skipped))
        return 1 if bad else 0
    out = args.dir or "kernels_prebuilt"
    for s in skipped:
        print(f"skipped  vLLM {s['release']}: {s['reason']}")
    for rep in reports:
        rel = rep["release"]
        missing, unlinked = set(rep["missing"]), set(rep["unlinked"])
        for k in rep["required"]:
            mark = "MISSING " if k in missing else "UNLINKED" if k in unlinked else "ok      "
            print(f"{mark} {rel} {k}")
        print(f"{rep['deployment']}: {len(rep['required'])} keys ({counts_text(rep['counts'])}) "
              f"checked against {rep['against']}: {len(rep['missing'])} missing, {len(rep['unlinked'])} not linked")
        shown = " ".join(repr(k) for k in rep["missing"][:3]) + (" ..." if len(rep["missing"]) > 3 else "")
        if rep["missing"] and args.profile:
            print(f"  fix: make profile {args.profile!r} select vLLM {rel}'s {shown} (edit the matrix; check with "
                  f"{commands.listing(args.profile, release=rel, matrix=args.matrix)})")
        elif rep["missing"]:
            print(f"  fix: {commands.build(out, release=rel, keys=rep['missing'], link=True)}")
        elif rep["unlinked"]:
            print(f"  fix: {commands.relink(out)}")
    return 1 if bad else 0
