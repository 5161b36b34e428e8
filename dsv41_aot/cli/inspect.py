"""``dsv41-aot inspect``'s arguments and output; ``aot.inspection`` does the work."""

from __future__ import annotations

from ..aot.inspection import cta_text, plot, report, summary_lines
from ..aot.output import print_json, tally
from ..errors import AotError
from . import add_dir


def register(sub) -> None:
    p = sub.add_parser("inspect", help="residency of every prebuilt symbol: resources against the arch's limits, spills, headroom")
    add_dir(p)
    p.add_argument("--json", action="store_true", help='print one JSON document: {"threads", "limits", "rows", "summary"} '
                                                        "(threads: a CTA of the rooms' releases; each row has its own)")
    p.add_argument("--plot", metavar="FILE.png", help="write a PNG of LDS / VGPR (AGPR, SGPR where they bind) use against "
                                                      "step width, per arch and vLLM release")
    p.add_argument("--release", help="only this vLLM release's rooms (default: every room)")
    p.set_defaults(func=run)


def run(args) -> int:
    """Print the residency report; exit 1 when a symbol cannot be resident."""
    if args.plot is not None and not args.plot.strip():  # never no picture and no word
        raise AotError("--plot '': an empty file name", fix="pass --plot FILE.png")
    doc = report(args.dir, args.release)
    rows = doc["rows"]
    not_resident = [r for r in rows if not r["resident"]]
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        failures = [{"key": r["key"], "release": r["release"], "error": "; ".join(r["problems"])}
                    for r in not_resident]
        print_json(tally(len(rows), len(rows) - len(failures), failures, **doc))
    else:
        print(f"{'release':7} {'key':44} {'VGPR':>4} {'AGPR':>4} {'SGPR':>4} {'LDS':>7} {'scratch':>7} {'kernarg':>7} {'wave':>4} {'w/SIMD':>6}  resident")
        for r in rows:
            x = r["resources"]
            print(
                f"{r['release']:7} {r['key']:44} {x['vgpr_count']:4d} {x['agpr_count']:4d} {x['sgpr_count']:4d} {x['lds_bytes']:7d}"
                f" {x['scratch_bytes']:7d} {x['kernarg_bytes']:7d} {x['wavefront_size']:4d} {r['waves_per_simd']:6d}"
                f"  {'yes' if r['resident'] else 'NO'}{', spills' if r['spills'] else ''}"
            )
            for note in r["problems"] + r["spills"]:
                print(f"    {note}")
        spilled = sum(bool(r["spills"]) for r in rows)
        print(f"{len(rows)} symbol{'s' if len(rows) != 1 else ''}, {len(not_resident)} cannot be resident {cta_text(rows)} per CU, {spilled} spilling"
              + (f"; plot: {args.plot}" if args.plot else ""))
        print()
        print("\n".join(summary_lines(doc["summary"])))
    return 1 if not_resident else 0
