"""``dsv41-aot doctor``'s arguments and output; ``runtime.doctor`` does the work."""

from __future__ import annotations

from ..aot.output import print_json, tally
from ..deployment import CoverageInputError, parse_draft

MARK = {"ok": "ok   ", "fail": "FAIL ", "warn": "warn ", "info": "--   ", "bad": "BAD  "}


def register(sub) -> None:
    p = sub.add_parser("doctor", help="will this serving host get prebuilt kernels, and if not, why (reads, "
                                      "checks, loads no kernel; exit 0 yes, 1 some launches will JIT, 2 bad input)")
    p.add_argument("--tp", type=int, help="count the launches vLLM can ask for at this tensor parallel size, "
                                          "and how many are prebuilt")
    p.add_argument("--max-rows", type=int, help="with --tp: the largest decode step in rows (default and cap: "
                                                "the release's)")
    p.add_argument("--draft", metavar="E,K,W", help="with --tp: the DSpark draft's experts,topk,swa_width "
                                                    "(V4.1-Flash: 128,3,192); omit without a draft")
    p.add_argument("--json", action="store_true", help='print one document: {"keys", "ok", "failed", "failures", '
                                                       '"checks": [...], "vllm", "arch", "hip", "plugin", "room", '
                                                       '"bands", "coverage", ...}')
    p.set_defaults(func=run)


def run(args) -> int:
    from ..runtime import doctor

    if args.tp is None and (args.max_rows is not None or args.draft is not None):
        raise CoverageInputError("--max-rows and --draft describe a deployment: name its TP size too",
                                 fix="dsv41-aot doctor --tp 4 ...")
    rep = doctor.diagnose(args.tp, args.max_rows, parse_draft(args.draft))
    if args.json:
        _print_json(rep)
        return rep.exit_code
    print(f"dsv41-aot doctor: prebuilt kernels at {rep.facts['prebuilt']}")
    for c in rep.checks:
        print(f"{MARK[c.status]} {c.name:9} {c.text}")
        if c.fix and c.status in ("fail", "warn", "bad"):
            print(f"{'':15} fix: {c.fix}")
    cov = rep.coverage
    if rep.exit_code == 0:
        what = f"all {len(cov['required'])} launches of the deployment" if cov else "every key of its room"
        tail = "" if cov else " (add --tp N to count the launches of your deployment)"
        print(f"verdict: this host gets prebuilt kernels for {what}{tail}")
    elif rep.exit_code == 2:
        print("verdict: the plugin's variables are bad input (each BAD line says how it was read); fix them first")
    else:
        failed = sum(c.status == "fail" for c in rep.checks)
        print(f"verdict: {failed} check(s) failed: this host will not get prebuilt kernels for every launch (vLLM "
              f"JIT-compiles the others, or stops in strict mode); run the fix under each FAIL line")
    return rep.exit_code


def _print_json(rep) -> None:
    cov = rep.coverage
    failures = [{"key": None, "check": c.name, "error": c.text, "fix": c.fix} for c in rep.checks
                if c.status in ("fail", "bad") and not (c.name == "coverage" and cov)]
    if cov:
        fix = next(c.fix for c in rep.checks if c.name == "coverage")
        for keys, why in ((cov["missing"], "not prebuilt"), (cov["unlinked"], "not linked"),
                          (cov["refused"], "refused: its band has a problem")):
            failures += [{"key": k, "release": cov["release"], "check": "coverage", "error": why, "fix": fix}
                         for k in keys]
    keys = len(cov["required"]) if cov else 0
    print_json(tally(keys, cov["served"] if cov else 0, failures, command="doctor", exit_code=rep.exit_code,
                     checks=[c.as_dict() for c in rep.checks], **rep.facts, coverage=cov))
