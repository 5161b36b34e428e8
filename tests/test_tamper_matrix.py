"""One verdict from every reader on each tampering: a seeded sample of the tamper matrix (issue 47).

The matrix (tests/_tamper.py) damages every record of a smoke build and its
kernels wheel in every way its parsers and layout allow, in each form that
can hold the record (built folder, shipped folder, wheel, installed
package); the readers (tests/_tamper_readers.py: verify --dir, verify
--wheel, check_wheel, the wheel gate, doctor, link, merge, the build's
up-to-date judgement and the loader, which binds and launches every key
through the recording HIP) must then all refuse or all accept, and each
refusal must name the key the damage is about, else its file, and print
the command that fixes it. The few disagreements a reader's purpose
explains stand in ``BY_DESIGN``; those of defects still open in
``KNOWN_OPEN``, by defect id.

Here a seeded sample runs: of every kind of damage (action and record), a
case in the wheel and one in a folder form (drawn by how many readers read
it there), and every reader at least once. The seed is
printed at the end of the run; ``DSV41_AOT_TAMPER_SEED=N`` replays it and
``DSV41_AOT_TAMPER_CASES=N`` adds N more cases. Where verify's first printed
fix compiles nothing (rm, link), it is run word for word on a fresh copy of
the case, and every reader must then accept the tree. ``bench/faults.py``
runs every case (``--fixes``: every fix).
"""

from __future__ import annotations

import os
import random

import pytest
from _tamper import generate, judge
from _tamper_readers import QUIET, READERS, check_base, first_fix, fix_works, make_base, readers_of, run, sample

SEED, MORE = "DSV41_AOT_TAMPER_SEED", "DSV41_AOT_TAMPER_CASES"
CHEAP = ("rm ", "dsv41-aot link ")  # fixes run here (a build or a JIT proof takes minutes: bench/faults.py --fixes)


@pytest.fixture(scope="module")
def base(smoke_dir, recording_hip, tmp_path_factory):
    """The smoke build with a proof of each key, as a folder, a shipped folder, a wheel and an installed package."""
    return make_base(smoke_dir, tmp_path_factory.mktemp("tamper-base"), recording_hip)


def test_every_reader_accepts_the_base_in_every_form(base, tmp_path):
    refused = {(form, r): text[-1500:] for form, results in check_base(base, tmp_path).items()
               for r, (ok, text) in results.items() if not ok}
    assert not refused, refused


@pytest.mark.faults
def test_every_reader_gives_one_verdict_on_a_seeded_sample_of_tamperings(base, tmp_path, summary_lines):
    seed = int(os.environ.get(SEED) or random.randrange(1 << 30))
    replay = f"{SEED}={seed}"
    tamperings = generate(base.built, base.members)
    cases = sample(base, tamperings, seed, int(os.environ.get(MORE) or 0))
    summary_lines.append(f"tamper matrix: {len(cases)} cases drawn with seed {seed}; replay them with {replay}")
    assert {t.family for t, _ in cases} == {t.family for t in tamperings}
    assert {r.name for t, form in cases for r in readers_of(t, form)} == {r.name for r in READERS}
    wrong, fixed = [], 0
    for i, (t, form) in enumerate(cases):
        results = run(base, t, form, tmp_path / f"case-{i}")
        verdict = judge(t, form, results, QUIET)
        if verdict.status in ("DISAGREE", "UNNAMED", "NO FIX", "CRASH"):
            texts = "\n".join(f"--- {r}: {text.strip()[-600:]}" for r, (ok, text) in sorted(results.items()))
            wrong.append(f"{verdict.line()}\n{texts}")
        fix = first_fix(results["verify --dir"][1]) if form == "built" and not results["verify --dir"][0] else None
        if fix and fix.startswith(CHEAP):  # compiles nothing: run word for word (bench/faults.py --fixes: every fix)
            fixed += 1
            if (why := fix_works(base, t, tmp_path / f"fix-{i}")) is not None:
                wrong.append(f"{t.name} [built]: {why}")
    summary_lines.append(f"tamper matrix: {fixed} of verify's first fixes (rm, link) run word for word")
    assert not wrong, f"{len(wrong)} of {len(cases)} cases ({replay} replays them):\n\n" + "\n\n".join(wrong)


# one case of each defect the matrix found (tests/_tamper.py DEFECTS), in a form where a reader disagreed: the
# readers that did, and what each must answer now (True: accept)
DEFECT_CASES = [
    ("T1", "field manifest.json entries.<key>.fields.tp @ gfx942/vllm-0.33.0/manifest.json", "built",
     {"gate": False, "merge": False}),
    ("T2", "field manifest.json entries.<key>.entry @ gfx942/vllm-0.33.0/manifest.json", "shipped",
     {"gate": False, "doctor": False, "verify --dir": False}),
    ("T3", "field manifest.json entries.<key>.source.linker @ gfx942/vllm-0.33.0/manifest.json", "built",
     {"merge": True}),
    ("T4", "field manifest.json entries.<key>.source.helpers.digest @ gfx942/vllm-0.33.0/manifest.json", "installed",
     {"loader": False}),
    ("T5", "remove manifest.json @ gfx942/vllm-0.33.0/manifest.json", "shipped", {"gate": False}),
    ("T5", "remove manifest.json @ gfx950/vllm-0.32.0/manifest.json", "shipped", {"gate": False}),
    ("T5", "remove manifest.json @ gfx942/vllm-0.33.0/manifest.json", "wheel", {"check_wheel": False}),
    ("T5", "remove manifest.json @ gfx950/vllm-0.32.0/manifest.json", "built", {"gate": False, "merge": False}),
    ("T6", "field manifest.json entries.<key>.code_object_sha256 @ gfx942/vllm-0.33.0/manifest.json", "installed",
     {"loader": False}),
    ("T6", "field manifest.json entries.<key>.symbol @ gfx950/vllm-0.33.0/manifest.json", "shipped",
     {"loader": False}),
]


@pytest.mark.faults
@pytest.mark.parametrize("defect, name, form, now", DEFECT_CASES, ids=[f"{d}-{f}" for d, _, f, _ in DEFECT_CASES])
def test_each_defect_the_matrix_found_gets_one_verdict(base, tmp_path, defect, name, form, now):
    (t,) = [t for t in generate(base.built, base.members) if t.name == name]
    verdict = judge(t, form, run(base, t, form, tmp_path / "case"), QUIET)
    assert verdict.status in ("agree", "by design"), verdict.line()
    assert {r: verdict.results[r][0] for r in now} == now, verdict.line()


@pytest.mark.slow
def test_the_fix_for_an_entry_whose_flydsl_was_edited_rebuilds_it(base, tmp_path):
    """T7: verify's fix, ``build --key``, rebuilds the entry even though a proof under this FlyDSL vouches for its
    code object: the object's own export says which FlyDSL made it, and the entry no longer does."""
    name = "field manifest.json entries.<key>.source.flydsl_version @ gfx950/vllm-0.33.0/manifest.json"
    (t,) = [t for t in generate(base.built, base.members) if t.name == name]
    refused = run(base, t, "built", tmp_path / "case", ["verify --dir"])
    assert not refused["verify --dir"][0]
    assert fix_works(base, t, tmp_path / "fix") is None
