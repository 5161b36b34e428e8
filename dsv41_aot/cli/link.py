"""``dsv41-aot link``'s arguments and output; ``aot.link`` does the work."""

from __future__ import annotations

from pathlib import Path

from ..aot.link import link_dir
from ..aot.output import print_json, tally
from ..manifest import PREFIX
from . import add_dir


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "link",
        help="link stored objects into loadable libraries (<dir>/<arch>/lib/, one libs.json per release)",
        description="Link each room's (arch and vLLM release) stored export objects into shared libraries, one per "
                    "TP and band of eight step widths, stored xz-compressed (<arch>/lib/*.so.xz, shared by the "
                    f"arch's releases; <arch>/{PREFIX}<release>/libs.json); up-to-date bands are kept. No "
                    "libamdhip64 SONAME is recorded.",
    )
    add_dir(p)
    p.add_argument("--arch", action="append", help="link only this arch (repeatable)")
    p.add_argument("--release", help="link only this vLLM release's rooms")
    p.add_argument("--json", action="store_true", help="print one JSON document with per-room summaries")
    p.set_defaults(func=run)


def run(args) -> int:
    out = link_dir(Path(args.dir), args.arch, release=args.release, log=None if args.json else print)
    if args.json:
        keys = sum(s["keys"] for s in out)
        print_json(tally(keys, keys, [], dir=str(Path(args.dir).resolve()), arches=out,
                         libraries=sum(s["libraries"] for s in out), linked=sum(s["linked"] for s in out),
                         up_to_date=sum(s["up_to_date"] for s in out)))
    else:
        for s in out:
            print(f"{s['arch']} vLLM {s['release']}: {s['libraries']} libraries ({s['linked']} linked, {s['up_to_date']} up to date) "
                  f"in {s['seconds']} s")
    return 0
