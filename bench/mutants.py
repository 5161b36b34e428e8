"""Mutation testing of the trust modules (mutmut): each module's score and every survivor.

A mutant is one small change to one function of a trust module (``<`` made
``<=``, a constant moved by one, a condition negated, an argument dropped).
The tests that check the module run against it, and one of them should fail.
A mutant they all pass (a survivor) is a bug no test would notice. The trust
modules and the test files that check each one are
``[tool.dsv41-aot.mutation]`` in pyproject.toml; docs/mutation.md says how to
read a survivor.

    .venv/bin/python bench/mutants.py                                  # every trust module
    .venv/bin/python bench/mutants.py --modules elf.py runtime/host.py
    .venv/bin/python bench/mutants.py --changed [REV]                  # the ones changed since REV (main)
    .venv/bin/python bench/mutants.py --sample 40 --seed 1             # a quick estimate
    .venv/bin/python bench/mutants.py --map                            # measure which tests reach which module
    .venv/bin/python bench/mutants.py --unreached [--modules ...]      # lines no mutant's tests run

It runs in a scratch copy of the checkout; ``--workdir DIR`` keeps it, for
``mutmut browse`` / ``mutmut show NAME`` in DIR. Exit 0: no survivor; 1:
survivors; 2: bad input or mutmut could not run.

mutmut's stats run (which tests reach which function) cannot serve these
tests, which mostly run the CLI in a subprocess: the bench writes that record
itself, every test of a module for each of its functions (docs/mutation.md).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fnmatch
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from dsv41_aot.aot.cache import ENV_BUILD_CACHE  # noqa: E402

MUTMUT = Path(sys.executable).parent / "mutmut"
SHARED = "DSV41_AOT_TEST_SHARED"  # tests/conftest.py: the test session's folder
TAMPER_SEED = "DSV41_AOT_TAMPER_SEED"  # tests/test_tamper_matrix.py: the seed of its sample
PREBUILT = "DSV41_AOT_TEST_PREBUILT"  # tests/_smoke.py: a built smoke dir, copied instead of compiled
CAUGHT = {"killed", "timeout"}  # a mutant that hangs the tests is caught too: the run fails


def fail(msg: str):  # bad input, or a tool that could not run
    print(msg, file=sys.stderr)
    sys.exit(2)


def settings() -> tuple[dict, dict]:
    """pyproject.toml's ``[tool.dsv41-aot.mutation]`` and ``[tool.mutmut]``."""
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]
    return tool["dsv41-aot"]["mutation"], tool.get("mutmut", {})


def git(*args: str) -> list[str]:
    out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    if out.returncode:
        fail(f"git {' '.join(args)}: {out.stderr.strip()}")
    return [line for line in out.stdout.split("\0" if "-z" in args else "\n") if line]


def checkout_files() -> list[str]:
    """The checkout's files as a commit would see them: tracked and new, not ignored."""
    return [f for f in git("ls-files", "-z", "--cached", "--others", "--exclude-standard") if (REPO / f).is_file()]


def trust_modules(cfg: dict) -> dict[str, list[str]]:
    """Each trust module file of the checkout and the test files that check it."""
    out: dict[str, set] = {}
    for f in checkout_files():
        for patterns, tests in cfg["tests"].items():
            if any(fnmatch.fnmatch(f, p) for p in patterns.split()):
                out.setdefault(f, set()).update(tests)
    return {f: sorted(t) for f, t in sorted(out.items())}


def chosen(args, trust: dict) -> list[str]:
    if args.changed is not None:  # since the branch left REV, uncommitted edits included
        (base,) = git("merge-base", args.changed, "HEAD")
        return sorted(set(git("diff", "--name-only", base, "--")) & set(trust))
    if not args.modules:
        return sorted(trust)
    out = []
    for m in args.modules:
        hits = [f for f in trust if f == m or f.endswith("/" + m.lstrip("./"))]
        if len(hits) != 1:
            why = "is not a trust module" if not hits else f"names {len(hits)} of them"
            fail(f"--modules {m} {why}; the trust modules ([tool.dsv41-aot.mutation] in pyproject.toml):\n  "
                 + "\n  ".join(trust))
        out += hits
    return sorted(set(out))


def named(nodeid: str, names: list) -> bool:
    """Whether a test id is one of ``names`` (test files or test ids)."""
    return any(nodeid == n or nodeid.startswith((n + "::", n + "[")) for n in names)


class Keep:
    """pytest plugin: the tests a mutant may run: the fast ones (not slow) and
    the slow ones listed as cheap (those of the smoke build only when a
    prebuilt smoke dir stands in for it)."""

    def __init__(self, cfg: dict, prebuilt: bool):
        self.slow_ok, self.prebuilt, self.ids = cfg.get("cheap_slow_tests", []), prebuilt, []
        self.never = cfg.get("never_under_a_mutant", [])

    def pytest_collection_modifyitems(self, items):
        for item in items:
            smoke = "smoke_dir" in getattr(item, "fixturenames", ())  # tests/conftest.py marks these slow too
            slow = bool(item.get_closest_marker("slow")) or smoke
            ok = not slow or (named(item.nodeid, self.slow_ok) and (self.prebuilt or not smoke))
            if ok and not named(item.nodeid, self.never) and not item.get_closest_marker("rocm"):
                self.ids.append(item.nodeid)


def collect(files: list[str], out: str) -> int:
    """(In a child process.) Write the ids of the tests of ``files`` a mutant may run."""
    import pytest

    keep = Keep(settings()[0], bool(os.environ.get(PREBUILT)))
    code = pytest.main(["--collect-only", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", *files], plugins=[keep])
    Path(out).write_text(json.dumps(keep.ids))
    return int(code)


def test_ids(files: list[str], work: Path) -> list[str]:
    out = work / "test-ids.json"
    r = subprocess.run([sys.executable, __file__, "--collect-into", str(out), *files], cwd=REPO,
                       capture_output=True, text=True)
    if r.returncode:
        fail(f"collecting {' '.join(files)} failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return json.loads(out.read_text())


def scratch(work: Path, files: list[str], ids: list[str], base: dict) -> None:
    """A copy of the checkout in ``work`` whose pyproject.toml tells mutmut this run."""
    tree = checkout_files()
    for f in tree:
        (work / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, work / f)
    sources = {Path(p).parts[0] for p in base.get("source_paths", [])}
    top = sorted({Path(f).parts[0] for f in tree} - sources - {"tests"})
    table = dict(base, only_mutate=files, pytest_add_cli_args_test_selection=ids, also_copy=top)
    text = re.sub(r"(?m)^\[tool\.mutmut\]\n(?:(?!\[).*\n)*", "", (work / "pyproject.toml").read_text())
    text += "\n[tool.mutmut]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items())
    (work / "pyproject.toml").write_text(text)


def mutmut(work: Path, env: dict, *args: str, expect: str = "") -> None:
    """Run ``mutmut ARGS`` in ``work``, its output appended to work/mutmut.log;
    exit 2 with the log's end unless it exits 0 (or prints ``expect``)."""
    log = work / "mutmut.log"
    with open(log, "a") as f:
        f.write(f"\n$ mutmut {' '.join(args[:8])}{' ...' if len(args) > 8 else ''}\n")
        f.flush()
        before = f.tell()
        # its own process group: a mutant's test that mutmut stops at its time
        # limit can leave a CLI subprocess behind (a loop that never ends),
        # which goes with the group when mutmut is done
        proc = subprocess.Popen([str(MUTMUT), *args], cwd=work, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    if code and not (expect and expect in log.read_bytes()[before:].decode(errors="replace")):
        tail = log.read_text(errors="replace").splitlines()[-40:]
        fail(f"mutmut {args[0]} failed (exit {code}); the end of {log}:\n" + "\n".join(tail))


def statuses(work: Path, env: dict) -> dict[str, str]:
    r = subprocess.run([str(MUTMUT), "results", "--all", "true"], cwd=work, env=env, capture_output=True, text=True)
    if r.returncode:
        fail(f"mutmut results failed (exit {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return dict(line.strip().rsplit(": ", 1) for line in r.stdout.splitlines() if ": " in line)


def module_of(name: str, files: list[str]) -> str:
    """The trust module file of mutant ``name`` (``dsv41_aot.elf.x_f__mutmut_3``)."""
    return max((f for f in files if name.startswith(f[:-3].replace("/", ".") + ".")), key=len)


def timings(work: Path, env: dict, ids: list[str], jobs: int) -> dict[str, float]:
    """Each test's seconds (setup to teardown), from one run of them all on the
    mutated copy with no mutant selected: the proof that they pass there, too.
    With ``jobs`` above 1 the run is spread over that many pytest-xdist
    workers, each test file whole on one (as ci/test.sh runs them): the
    seconds only order each mutant's tests, and mutmut's own clean run
    follows, one test at a time, before any mutant."""
    workers = ["-n", str(jobs), "--dist", "loadfile"] if jobs > 1 else []
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                        *workers, "--durations=0", "--durations-min=0", *ids], cwd=work / "mutants",
                       env=dict(env, MUTANT_UNDER_TEST=""), capture_output=True, text=True)
    if r.returncode:
        fail(f"the tests fail on the copy with no mutant (exit {r.returncode}):\n{r.stdout[-4000:]}{r.stderr[-2000:]}")
    seconds = dict.fromkeys(ids, 0.0)
    for m in re.finditer(r"(?m)^([\d.]+)s (?:setup|call|teardown) +(\S.*?)\s*$", r.stdout):
        if m[2] in seconds:
            seconds[m[2]] += float(m[1])
    return seconds


def where(work: Path, name: str, diff: str) -> tuple[str, str]:
    """``file:line`` of a mutant and its change (``old -> new``), from ``mutmut show``'s diff,
    whose line numbers count from the function's first line."""
    lines = diff.splitlines()
    path = next((ln[4:].strip() for ln in lines if ln.startswith("--- ")), "?")
    old = [ln[1:] for ln in lines if ln.startswith("-") and not ln.startswith("---")]
    new = [ln[1:] for ln in lines if ln.startswith("+") and not ln.startswith("+++")]
    change = " / ".join(s.strip() for s in old) + "  ->  " + " / ".join(s.strip() for s in new)
    hunk = next((ln for ln in lines if ln.startswith("@@")), None)
    source = (work / path).read_text().splitlines() if (work / path).is_file() else []
    found = [i + 1 for i, s in enumerate(source) if old and s.strip() == old[0].strip()]
    if not hunk or not found:
        return path, change
    rel = int(hunk.split()[1].lstrip("-").split(",")[0])  # the hunk's first line, in the function
    for ln in lines[lines.index(hunk) + 1:]:
        if ln.startswith("-"):
            break
        rel += ln.startswith(" ")
    function = name.rsplit("__mutmut_", 1)[0].rsplit(".", 1)[-1].split("ǁ")[-1].removeprefix("x_")
    starts = [min([n.lineno] + [d.lineno for d in n.decorator_list]) for n in ast.walk(ast.parse("\n".join(source)))
              if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function]
    # the line of that text nearest to where the function's text puts it
    guess = [s + rel - 1 for s in starts] or [found[0]]
    line = min(found, key=lambda i: min(abs(i - g) for g in guess))
    return f"{path}:{line}", change


def function_bodies(path: Path) -> list[set]:
    """The lines of each function's body statements (methods and inner functions too)."""
    return [{s.lineno for b in n.body for s in ast.walk(b) if isinstance(s, ast.stmt)}
            for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def covered(work: Path, env: dict, name: str, pytest_args: list[str]) -> dict:
    """Coverage of the trust code (dsv41_aot/, ci/) over one pytest run, subprocesses included, in ``work``:
    coverage's JSON report's ``files`` (each file's executed and missing lines)."""
    rc = work / "coveragerc"
    rc.write_text(f"[run]\npatch = subprocess\nsource = {REPO}/dsv41_aot, {REPO}/ci\n")
    env = dict(env, COVERAGE_FILE=str(work / f"{name}.coverage"))
    out = work / f"{name}.json"
    for step in (["run", "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", *pytest_args],
                 ["combine", "-q"], ["json", "-q", "-o", str(out)]):
        subprocess.run([sys.executable, "-m", "coverage", step[0], f"--rcfile={rc}", *step[1:]], cwd=REPO,
                       env=env, capture_output=True)
    return json.loads(out.read_text())["files"]


def measure_map(args) -> int:
    """Print, per trust module, the test files whose tests run its functions'
    bodies (coverage, the tests' subprocesses included): what
    ``[tool.dsv41-aot.mutation.tests]`` should say."""
    cfg, _ = settings()
    trust = list(trust_modules(cfg))
    test_files = sorted(f for f in checkout_files() if re.fullmatch(r"tests/test_\w+\.py", f))
    work = Path(tempfile.mkdtemp(prefix="dsv41-mutants-map-"))
    start = time.monotonic()
    try:
        ids = test_ids(test_files, work)
        bodies = {f: function_bodies(REPO / f) for f in trust}
        reach: dict[str, dict[str, int]] = {f: {} for f in trust}
        for tf in test_files:
            mine = [i for i in ids if i.split("::")[0] == tf]
            if not mine:
                continue
            t0 = time.monotonic()
            files = covered(work, dict(os.environ), Path(tf).stem, mine)
            ran = {str(Path(k).resolve()): set(v["executed_lines"]) for k, v in files.items()}
            for f in trust:
                hit = sum(bool(lines & ran.get(str(REPO / f), set())) for lines in bodies[f])
                if hit:
                    reach[f][tf] = hit
            print(f"  {tf}: {len(mine)} tests, {time.monotonic() - t0:.0f} s", file=sys.stderr)
        for f in trust:
            print(f"# {f}: {len(bodies[f])} functions; " + ", ".join(f"{Path(t).stem} {n}" for t, n in
                                                                     sorted(reach[f].items(), key=lambda x: -x[1])))
            print(f'"{f}" = {json.dumps(sorted(reach[f]))}')
        print(f"# measured in {time.monotonic() - start:.0f} s", file=sys.stderr)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def tests_env(prebuilt: str | None) -> dict:
    """The environment the tests run in under the bench: this one's, less a mutant's and a fast run's
    variables, with the prebuilt smoke dir, the tamper matrix's seed and the full deployments beside the
    checkout named."""
    # bytecode is kept, as ci/test.sh keeps it (each mutant is chosen at run time, not compiled in)
    drop = ("MUTANT_UNDER_TEST", "DSV41_AOT_TEST_FAST", PREBUILT, "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if prebuilt:
        env[PREBUILT] = str(Path(prebuilt).resolve())
    env.setdefault(TAMPER_SEED, "0")  # tests/test_tamper_matrix.py draws the same sample under every mutant
    # the full deployments, found beside this checkout: a scratch copy has no ../shared, so their tests would
    # skip (and every mutant they check survive)
    sys.path.insert(0, str(REPO / "tests"))
    from _smoke import DEPLOYMENTS

    for _, var, folder, _ in DEPLOYMENTS.values():
        if var not in env and folder.is_dir():
            env[var] = str(folder)
    return env


def one_session(env: dict, work: Path) -> None:
    """Give every pytest run of the bench one test-session folder and build cache, in ``work`` (mutmut runs
    pytest several times in one process; the suite's own folder would be gone after the first session)."""
    env[SHARED] = str(work / "session")
    env[ENV_BUILD_CACHE] = str(work / "session" / "cache")
    (work / "session").mkdir()


def unreached(args) -> int:
    """Print the lines of the chosen trust modules' functions that no test run under a mutant executes.

    Every mutant of such a line survives: each wants a test, or is dead code. One coverage run of the
    modules' tests together (their subprocesses included): a line of one module that only another's test
    files reach counts as reached, so one module at a time gives its exact list."""
    cfg, _ = settings()
    trust = trust_modules(cfg)
    files = chosen(args, trust)
    work = Path(tempfile.mkdtemp(prefix="dsv41-mutants-unreached-"))
    start = time.monotonic()
    try:
        env = tests_env(args.prebuilt or os.environ.get(PREBUILT))
        ids = test_ids(sorted({t for f in files for t in trust[f]}), work)
        one_session(env, work)
        workers = ["-n", str(args.jobs), "--dist", "loadfile"] if args.jobs > 1 else []
        measured = covered(work, env, "tests", [*workers, *ids])
        # coverage's missing lines: the statements it measures (a docstring is none) that never ran
        missed = {str(Path(k).resolve()): set(v["missing_lines"]) for k, v in measured.items()}
        total = 0
        for f in files:
            source = (REPO / f).read_text().splitlines()
            lines = sorted(set().union(*function_bodies(REPO / f)) & missed.get(str(REPO / f), set()))
            total += len(lines)
            print(f"{f}: {len(lines)} line(s) no test under a mutant runs")
            for n in lines:
                print(f"  {f}:{n}  {source[n - 1].strip()}")
        print(f"{len(ids)} tests; {total} line(s) unreached; {time.monotonic() - start:.0f} s", file=sys.stderr)
        return 1 if total else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args) -> int:
    cfg, base = settings()
    trust = trust_modules(cfg)
    files = chosen(args, trust)
    if not files:
        print(f"no trust module changed since {args.changed}" if args.changed is not None else "no trust module chosen")
        return 0
    if not MUTMUT.is_file():
        fail(f"{MUTMUT} is missing: pip install -e '.[mutation]'")
    prebuilt = args.prebuilt or os.environ.get(PREBUILT)
    if not prebuilt:
        print(f"note: {PREBUILT} is not set, so no test of the smoke build runs (it would compile per mutant)")
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="dsv41-mutants-"))
    if args.workdir and work.exists() and any(work.iterdir()):
        fail(f"--workdir {work} is not empty")
    work.mkdir(parents=True, exist_ok=True)
    start, load = time.monotonic(), os.getloadavg()
    try:
        env = tests_env(prebuilt)
        test_files = sorted({t for f in files for t in trust[f]})
        ids = test_ids(test_files, work) if test_files else []
        tests_of = {f: [i for i in ids if i.split("::")[0] in trust[f]] for f in files}
        untested = [f for f in files if not tests_of[f]]
        if untested:
            print("not mutated, as no test of it runs under a mutant ([tool.dsv41-aot.mutation.tests] in "
                  "pyproject.toml; bench/mutants.py --map): " + ", ".join(untested))
            files = [f for f in files if tests_of[f]]
            if not files:
                return 1
        print(f"{len(files)} module(s), {len(ids)} tests: " + ", ".join(f"{f} ({len(tests_of[f])})" for f in files))
        scratch(work, files, ids, base)
        one_session(env, work)
        jobs = ("--max-children", str(args.jobs))
        stats_file = work / "mutants" / "mutmut-stats.json"
        stats_file.parent.mkdir()
        stats_file.write_text(json.dumps({"tests_by_mangled_function_name": {},
                                          "duration_by_test": dict.fromkeys(ids, 1.0), "stats_time": 0.0}))
        # a run that selects no mutant makes them all, then stops
        mutmut(work, env, "run", *jobs, "no-mutant-has-this-name", expect="nothing matches")
        names = sorted(statuses(work, env))
        stats = json.loads(stats_file.read_text())
        stats["duration_by_test"] = timings(work, env, ids, args.jobs)
        stats["tests_by_mangled_function_name"] = {n.rsplit("__mutmut_", 1)[0]: tests_of[module_of(n, files)]
                                                   for n in names}
        stats_file.write_text(json.dumps(stats, indent=1))
        print(f"{len(names)} mutants; the tests take {sum(stats['duration_by_test'].values()):.0f} s with none")
        if args.sample:
            names = sorted(random.Random(args.seed).sample(names, min(args.sample, len(names))))
            print(f"sample: {len(names)} mutants (seed {args.seed})")
            mutmut(work, env, "run", *jobs, *names)
        else:
            mutmut(work, env, "run", *jobs)
        status = statuses(work, env)
        return max(report(work, env, files, names, status, start, load, cfg.get("equivalent", [])),
                   1 if untested else 0)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


def known_equivalent(equivalents: list[dict], at: str, change: str) -> str | None:
    """Why a survivor is equivalent, when pyproject.toml names it (its file and change, as the report prints
    them), else None."""
    path = at.rsplit(":", 1)[0]
    return next((e["why"] for e in equivalents if e["file"] == path and e["change"] == change), None)


def report(work: Path, env: dict, files: list[str], names: list[str], status: dict, start: float, load,
           equivalents: list[dict]) -> int:
    """Print each module's score and every mutant not caught; 1 if any is not a known equivalent.

    A mutant ``[[tool.dsv41-aot.mutation.equivalent]]`` names (no input tells it from the code) is
    listed apart with its reason and left out of its module's score."""
    uncaught = []  # (name, status, file:line, change, why it is equivalent or None)
    for n in names:
        s = status.get(n, "not checked")
        if s not in CAUGHT:
            shown = subprocess.run([str(MUTMUT), "show", n], cwd=work, env=env, capture_output=True, text=True).stdout
            at, change = where(work, n, shown)
            why = known_equivalent(equivalents, at, change) if s == "survived" else None
            uncaught.append((n, s, at, change, why))
    equivalent = {n for n, *_, why in uncaught if why}
    print(f"\n{'module':36} {'killed':>6} {'timeout':>7} {'total':>5} {'equiv':>5} {'score':>5}  survived  other")
    for f, mine in [(f, [n for n in names if module_of(n, files) == f]) for f in files] + [("all", names)]:
        got = [status.get(n, "not checked") for n in mine]
        count = {k: got.count(k) for k in ("killed", "timeout", "survived")}
        same = len(equivalent.intersection(mine))
        judged = len(got) - same
        score = f"{100 * (count['killed'] + count['timeout']) / judged:.0f}%" if judged else "-"
        print(f"{f:36} {count['killed']:6} {count['timeout']:7} {len(got):5} {same:5} {score:>5}  "
              f"{count['survived'] - same:8}  {len(got) - sum(count.values()):5}")
    left = [u for u in uncaught if not u[4]]
    if left:
        print("\nnot caught (file:line  old -> new  [mutant: status]):")
        for n, s, at, change, _ in left:
            print(f"  {at}  {change}  [{n}: {s}]")
    if equivalent:
        print("\nequivalent, as pyproject.toml's [[tool.dsv41-aot.mutation.equivalent]] says (file:line  change: why):")
        for n, s, at, change, why in uncaught:
            if why:
                print(f"  {at}  {change}: {why}  [{n}]")
    print(f"\nwall {time.monotonic() - start:.0f} s; load average {load[0]:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end")
    return 1 if left else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--modules", nargs="+", metavar="FILE",
                       help="trust modules to mutate (a path, or its end: elf.py)")
    which.add_argument("--changed", nargs="?", const="main", metavar="REV",
                       help="the trust modules `git diff REV` touches (default REV: main)")
    ap.add_argument("--sample", type=int, metavar="N", help="run N mutants drawn at random (a quick estimate)")
    ap.add_argument("--seed", type=int, default=0, help="the draw's seed (default 0)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="mutants tested side by side, or --unreached's pytest workers (default 1)")
    ap.add_argument("--prebuilt", help=f"a built smoke dir for the smoke-build tests (default: ${PREBUILT})")
    ap.add_argument("--workdir", help="run in this (new or empty) folder and keep it")
    which.add_argument("--map", action="store_true",
                       help="measure which test files run each trust module's functions (coverage, subprocesses too)")
    ap.add_argument("--unreached", action="store_true",
                    help="print the trust modules' lines no test under a mutant runs (coverage; with --modules or "
                         "--changed, theirs)")
    ap.add_argument("--collect-into", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args(argv)
    if args.collect_into:
        return collect(rest, args.collect_into)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.prebuilt:
        os.environ[PREBUILT] = str(Path(args.prebuilt).resolve())
    return measure_map(args) if args.map else unreached(args) if args.unreached else run(args)


if __name__ == "__main__":
    sys.exit(main())
