"""The tamper matrix, every case: how many tamperings every reader gives one verdict on.

Each tampering of the smoke build and its kernels wheel (tests/_tamper.py:
every record, every field, every artifact form that can hold it) is read by
every reader that reads that record in that form (tests/_tamper_readers.py:
verify --dir, verify --wheel, check_wheel, the wheel gate, doctor, link,
merge, the build's up-to-date judgement, the loader). It prints each case
whose readers differ (the tampering, its form, who accepted and who
refused), marked by design, known open (with its defect id) or DISAGREE, and
each refusal that names neither the file nor the key or prints no command
that fixes it; then

    tamperings N, readers M, agree A, disagree D

(A + D cases: a case is one tampering in one form; a case in BY_DESIGN,
whose readers but the excused ones agree, counts as agreed) and the KNOWN_OPEN
entries no case needs any more. Exit 1 when a case is unexplained, 2 when
a reader refuses the base itself.

    .venv/bin/python bench/faults.py [--jobs N] [--prebuilt DIR] [-k TEXT] [--fixes]
    .venv/bin/python bench/faults.py --suite [-k EXPR]   (the tests marked faults, tallied)

The smoke build is ``--prebuilt`` (default $DSV41_AOT_TEST_PREBUILT), else
built here (minutes).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
os.environ.setdefault("DSV41_AOT_ALLOW_HIP_VERSION", "5.2")  # the host's ROCm 5.2 stand-in, as the suite accepts it

_JOB: dict = {}  # what the worker processes share by fork: the base, the cases, the scratch folder


def _run_case(i: int):
    import _tamper_readers as R

    t, form = _JOB["cases"][i]
    return i, R.run(_JOB["base"], t, form, Path(_JOB["scratch"]) / f"case-{i}")


def _fix_case(i: int):
    import _tamper_readers as R

    return i, R.fix_works(_JOB["base"], _JOB["fixes"][i], Path(_JOB["scratch"]) / f"fix-{i}")


def smoke(given: str | None, work: Path) -> Path:
    """A built and linked smoke prebuilt dir: the one given, else one built into ``work``."""
    if given:
        return Path(given)
    out = work / "smoke"
    for cmd in (["build", "--profile", "smoke", "--out", out, "--no-progress"], ["link", "--dir", out]):
        subprocess.run([sys.executable, "-m", "dsv41_aot.cli", *map(str, cmd)], cwd=REPO, check=True)
    return out


def matrix(args) -> int:
    import _tamper as T
    import _tamper_readers as R
    from dsv41_aot.aot import hiprec

    t0, load0 = time.perf_counter(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="dsv41-tamper-") as tmp:
        work = Path(tmp)
        os.environ["DSV41_AOT_BUILD_CACHE"] = str(work / "build-cache")  # the fixes' builds: each key once
        base = R.make_base(smoke(args.prebuilt or os.environ.get("DSV41_AOT_TEST_PREBUILT"), work), work / "base",
                           hiprec.build(work / "hip"), prove=args.fixes)
        refused = {(f, r): text for f, res in R.check_base(base, work / "check").items()
                   for r, (ok, text) in res.items() if not ok}
        for (f, r), text in refused.items():
            print(f"the base itself is refused by {r} [{f}]:\n{text.strip()[-1500:]}\n", file=sys.stderr)
        if refused:
            return 2
        tamperings = [t for t in T.generate(base.built, base.members) if not args.k or args.k in t.name]
        cases = [(t, f) for t in tamperings for f in R.forms_of(base, t)]
        _JOB.update(base=base, cases=cases, scratch=work / "cases")
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            done = dict(pool.imap_unordered(_run_case, range(len(cases))))
        return report(args, tamperings, cases, done, t0, load0)


def fixes(args, tamperings: list) -> int:
    """Run the first fix verify prints for each of ``tamperings`` (built form) word for word, and count those that
    leave a tree every reader accepts."""
    _JOB["fixes"] = tamperings
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        done = dict(pool.imap_unordered(_fix_case, range(len(tamperings))))
    import _tamper as T

    bad = [(tamperings[i], why) for i, why in sorted(done.items()) if why]
    known = [t for t, _ in bad if T.matches(T.FIX_OPEN, f"{t.kind} @built")]
    for t, why in bad:
        print(f"FIX FAILS{' (known open: ' + T.matches(T.FIX_OPEN, t.kind + ' @built')[:2] + ')' if t in known else ''}"
              f": {t.name} [built]: {why[:600]}")
    print(f"fixes: {len(tamperings)} first fixes verify printed (built form) run word for word: "
          f"{len(tamperings) - len(bad)} left a tree every reader accepts, {len(bad)} did not "
          f"({len(known)} known open: FIX_OPEN)")
    return len(bad) - len(known)


def report(args, tamperings, cases, done, t0, load0) -> int:
    import _tamper as T
    import _tamper_readers as R

    verdicts = [T.judge(t, f, done[i], R.QUIET) for i, (t, f) in enumerate(cases)]
    differ = [v for v in verdicts if v.differ]
    unnamed = [v for v in verdicts
               if v.status in ("UNNAMED", "NO FIX", "CRASH") or (not v.differ and v.status == "known open")]
    for v in sorted(differ + unnamed, key=lambda v: (v.status, v.tampering.name, v.form)):
        print(v.line())
    used = {p for v in verdicts if v.status == "known open" for p in T.KNOWN_OPEN
            if T.matches({p: 1}, f"{v.tampering.kind} @{v.form}",
                         *(f"unnamed {r} {v.tampering.kind} @{v.form}" for r in v.refused))}
    count = {s: sum(v.status == s for v in differ) for s in ("by design", "known open", "DISAGREE")}
    agree = sum(v.status in ("agree", "by design") for v in verdicts)  # by design: the readers that count agree
    print(f"\ntamperings {len(tamperings)}, readers {len(R.READERS)}, agree {agree}, disagree {len(verdicts) - agree}")
    print(f"  {len(verdicts)} cases (a tampering in one form), {len(differ)} of them with some reader's verdict "
          f"excused: {count['by design']} by design (BY_DESIGN: the others agree), {count['known open']} known "
          f"open, {count['DISAGREE']} unexplained; "
          f"{sum(v.status == 'UNNAMED' for v in verdicts)} refusals name neither the file nor the key "
          f"(+{sum(v.status == 'known open' and not v.differ for v in verdicts)} known open); "
          f"{sum(v.status == 'NO FIX' for v in verdicts)} refusals without the command that fixes them; "
          f"{sum(v.status == 'CRASH' for v in verdicts)} tracebacks")
    for p in sorted(set(T.KNOWN_OPEN) - used) if not args.k else ():
        print(f"  KNOWN_OPEN {p!r} is needed by no case: remove it")
    print("\nby design:")
    for p, (readers, why) in T.BY_DESIGN.items():
        print(f"  {p!r} ({', '.join(sorted(readers))}): {why}")
    print("defects found here (T), beside the fault report's Q1-Q15:")
    for d, why in T.DEFECTS.items():
        print(f"  {d}: {why}")
    failed = fixes(args, [v.tampering for v in verdicts if v.form == "built" and "verify --dir" in v.refused]) \
        if args.fixes else 0
    load1 = os.getloadavg()
    print(f"  wall {time.perf_counter() - t0:.0f} s with {args.jobs} worker(s) on {os.cpu_count()} cores; load "
          f"average {load0[0]:.1f} before, {load1[0]:.1f} after")
    return 1 if count["DISAGREE"] or failed or any(v.status in ("UNNAMED", "NO FIX", "CRASH") for v in verdicts) else 0


def suite(args) -> int:
    """The tests marked ``faults``, tallied from pytest's JUnit XML: held, got through, skipped."""
    with tempfile.TemporaryDirectory(prefix="dsv41-faults-") as tmp:
        xml = Path(tmp) / "faults.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "faults", "-p", "no:randomly", f"--junitxml={xml}", "tests"]
        if args.k:
            cmd += ["-k", args.k]
        proc = subprocess.run(cmd, cwd=REPO)
        if not xml.is_file():
            print(f"pytest wrote no report (exit {proc.returncode})", file=sys.stderr)
            return 2
        rows = []
        for case in ET.parse(xml).getroot().iter("testcase"):
            outcome = "held"
            if case.find("failure") is not None or case.find("error") is not None:
                outcome = "GOT THROUGH"
            elif case.find("skipped") is not None:
                outcome = "skipped"
            rows.append((case.get("classname", "").rsplit(".", 1)[-1], case.get("name", ""), outcome))
    width = max((len(f"{m}::{n}") for m, n, _ in rows), default=10)
    for module, name, outcome in rows:
        print(f"{module + '::' + name:{width}}  {outcome}")
    tried = sum(o != "skipped" for *_, o in rows)
    held = sum(o == "held" for *_, o in rows)
    print(f"\nfaults tried {tried}, held (survived or refused with the right error) {held}, "
          f"got through {tried - held}, skipped {len(rows) - tried}")
    return 0 if held == tried else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", action="store_true", help="tally the tests marked faults instead")
    ap.add_argument("-k", help="only the tamperings whose name holds this text (--suite: a pytest -k expression)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--fixes", action="store_true",
                    help="also run, word for word on a fresh copy, the first fix verify prints for each case of the "
                         "built form, and check every reader accepts the tree it leaves (builds; JIT for proofs: the "
                         "base is then proven by vLLM's JIT first)")
    ap.add_argument("--prebuilt", help="a built and linked smoke prebuilt dir (default $DSV41_AOT_TEST_PREBUILT)")
    args = ap.parse_args(argv)
    return suite(args) if args.suite else matrix(args)


if __name__ == "__main__":
    sys.exit(main())
