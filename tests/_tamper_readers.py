"""The tamper matrix's base artifact and readers: each reader's verdict on one tampered case.

The base is a smoke build (10 keys, 2 arches, 2 releases) with a proof of
each key (``write_proofs``: made here, as a claim that plain readers take at
its word), in four forms: the built folder, a shipped copy (no objects/), its
kernels wheel and that wheel installed with ``pip install --target``. Every
reader accepts the base (``check_base``).

A reader is a function of a :class:`Case` returning (accepts, output text).
Readers are called in this process through their ``main(argv)`` where they
have one; the loader runs in a fresh process whose only HIP is the
recording HIP (the suite's stand-in for the AMD GPU). Two readers write:
``link`` accepts when it leaves the tree as it was (nothing relinked,
removed or rewritten), and the build when it finds every key up to date
(``aot.buildroom.up_to_date``, what ``build`` asks before compiling).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import traceback
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from _smoke import install_into
from _tamper import FORMS, KERNELS, FolderTree, Tampering, ZipTree

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- the base, in every form


@dataclass
class Base:
    """The smoke build every tampering starts from, in each form, and what its readers need."""

    built: Path
    shipped: Path
    wheel: Path
    site: Path  # pip install --target of the wheel
    hip: Path  # the recording HIP
    trees: dict  # release -> its vLLM mono package folder
    idents: dict  # release -> the source identity a build of it writes
    keys: dict  # (arch, release) -> the room's keys
    members: dict  # the wheel's members: name -> bytes
    infos: dict  # name -> zipfile.ZipInfo

    @property
    def installed(self) -> Path:
        return self.site / KERNELS


def write_proofs(root: Path) -> None:
    """Give each key of ``root`` a proof with evidence, as ``verify --against-jit --record`` writes one.

    Its evidence digests are made here, not by a JIT run: plain readers
    take a proof at its word (only --against-jit compares), which is all
    the base needs to pass ``--require-proofs`` and ``--require-verified``."""
    from dsv41_aot.listing import built_rooms
    from dsv41_aot.proof import Evidence, KeyProof, Proof

    for room in built_rooms(root):
        man = room.manifest()
        proofs = []
        for k, e in man.entries.items():
            digest = lambda w: hashlib.sha256(f"{w} {k} {e.code_object_sha256}".encode()).hexdigest()  # noqa: E731
            s = e.source
            jit = {"release": room.release, "vllm_version": s.vllm_version, "mono_sources": s.mono_sources,
                   "flydsl_version": s.flydsl_version}
            proofs.append(KeyProof(k, e.code_object_sha256, jit, Evidence(
                digest("artifact"), digest("module"), "2026-01-01T00:00:00Z", None, digest("launch"))))
        room.verified_path.write_bytes(Proof.of(room.arch, room.release, proofs, man.entries).to_bytes())


@contextlib.contextmanager
def _output_to(log: Path):
    """This process's stdout and stderr, and its children's, into ``log`` while the block runs."""
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "w") as f:
        os.dup2(f.fileno(), 1), os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])


def make_base(smoke: Path, work: Path, hip: Path, prove: bool = False) -> Base:
    """The base in every form, made in ``work`` from a built and linked smoke dir (copied, never changed).

    ``prove``: its proofs made by vLLM's JIT (``verify --against-jit
    --record``, minutes), for fixes that prove keys again to compare with."""
    from ci.release import build_wheel
    from dsv41_aot import source
    from dsv41_aot.aot import matrix, toolchain
    from dsv41_aot.aot.compiler import source_identity
    from dsv41_aot.listing import built_rooms

    built = work / "built"
    shutil.copytree(smoke, built, ignore=shutil.ignore_patterns(".build.lock", "verified.json"))
    if prove:
        rc, text = _cli(["verify", "--dir", built, "--against-jit", "--record", "--no-progress"])
        assert rc == 0, text[-3000:]
    else:
        write_proofs(built)
    shipped = work / "shipped"
    shutil.copytree(built, shipped, ignore=shutil.ignore_patterns("objects"))
    with _output_to(work / "wheel-build.log"):
        wheel = build_wheel(built, work / "dist")
    site = install_into(wheel, work / "site")
    rooms = built_rooms(built)
    keys = {(r.arch, r.release): sorted(r.manifest().entries) for r in rooms}
    releases = sorted({r.release for r in rooms})
    trees = source.release_trees(releases, matrix.load().releases)
    lld = toolchain.find().lld_version
    with zipfile.ZipFile(wheel) as z:
        infos = {i.filename: i for i in z.infolist()}
        members = {n: z.read(i) for n, i in infos.items()}
    return Base(built, shipped, wheel, site, hip, {r: str(t.mono_dir) for r, t in trees.items()},
                {r: source_identity(t, lld) for r, t in trees.items()}, keys, members, infos)


# ---------------------------------------------------------------- one case: a tampering in one form


@dataclass
class Case:
    base: Base
    tampering: Tampering
    form: str
    dir: Path  # the case's own folder
    root: Path | None = None  # the prebuilt dir (folder forms)
    wheel: Path | None = None


def tree_of(base: Base, form: str, dest: Path):
    """A fresh copy of the base in ``form`` under ``dest``, as a tree to damage."""
    if form == "wheel":
        return ZipTree(base.members, base.infos)
    if form == "installed":
        shutil.copytree(base.site, dest / "site", ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
        return FolderTree(dest / "site" / KERNELS, form)
    src = base.built if form == "built" else base.shipped
    shutil.copytree(src, dest / "prebuilt")
    return FolderTree(dest / "prebuilt", form)


def case(base: Base, t: Tampering, form: str, dest: Path) -> Case | None:
    """``t`` applied to a fresh copy of ``form`` in ``dest``; None when the form cannot hold it."""
    dest.mkdir(parents=True)
    tree = tree_of(base, form, dest)
    if not t.applies(tree):
        shutil.rmtree(dest)
        return None
    t.damage(tree)
    if form == "wheel":
        (dest / "dist").mkdir()
        return Case(base, t, form, dest, wheel=tree.save(dest / "dist" / base.wheel.name))
    return Case(base, t, form, dest, root=tree.root)


# ---------------------------------------------------------------- the readers


def call(main: Callable, argv: list, env: dict | None = None) -> tuple[int, str]:
    """``main(argv)`` in this process: its exit code and everything it printed (70 and a traceback for a crash)."""
    out = io.StringIO()
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                rc = main([str(a) for a in argv])
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 2
            except Exception:  # noqa: BLE001 - a crash is a verdict too (exit 70, as the CLI gives one)
                traceback.print_exc(file=out)
                rc = 70
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return rc, out.getvalue()


def _cli(argv, env=None):
    from dsv41_aot.cli import main

    return call(main, argv, env)


def verify_dir(c: Case):
    rc, text = _cli(["verify", "--dir", c.root])
    return rc == 0, text


def verify_wheel(c: Case):
    rc, text = _cli(["verify", "--wheel", c.wheel])
    return rc == 0, text


def check_wheel(c: Case):
    from ci import check_wheel as script

    rc, text = call(script.main, ["--no-auditwheel", "--require-proofs", c.wheel])
    return rc == 0, text


def gate(c: Case):
    from ci import prebuilt

    rc, text = call(prebuilt.main, [c.root])
    return rc == 0, text


def doctor(c: Case):
    """``dsv41-aot doctor`` with DSV41_AOT_PREBUILT at the case, once per arch of the base (DSV41_AOT_ARCH)."""
    from dsv41_aot.runtime import state

    ok, texts = True, []
    for arch in sorted({a for a, _ in c.base.keys}):
        with state.fresh():
            rc, text = _cli(["doctor"], {"DSV41_AOT_PREBUILT": str(c.root), "DSV41_AOT_ARCH": arch})
        ok = ok and rc == 0
        texts.append(f"[{arch}] exit {rc}\n{text}")
    return ok, "\n".join(texts)


def build(c: Case):
    """Whether ``build`` of the base's keys into the case finds each up to date (compiles nothing)."""
    from dsv41_aot.aot.buildroom import up_to_date
    from dsv41_aot.aot.integrity import check_entry
    from dsv41_aot.errors import AotError
    from dsv41_aot.keys import BuildKey
    from dsv41_aot.room import Room

    redo = []
    for (arch, release), keys in sorted(c.base.keys.items()):
        room = Room(c.root, arch, release)
        try:
            man = room.manifest()
        except AotError as e:  # the build sets it aside and recovers the entries it can
            redo.append(f"{room.name}: {e.message}")
            continue
        for k in keys:
            if not up_to_date(man, BuildKey.parse(k, release), c.base.idents[release]):
                why = (check_entry(man, k)[0].problems or ["its source identity is not this build's"]) \
                    if k in man.entries else ["no entry"]
                redo.append(f"{k} (vLLM {release}) is built again: {'; '.join(why)}")
    return not redo, "\n".join(redo)


def merge(c: Case):
    """``ci/merge.py --require-verified`` of the case as one shard (merge only: link is the link reader's)."""
    from ci import merge as script

    rc, text = call(script.main, [c.root, "--out", c.dir / "merged", "--require-verified", "--no-link"])
    return rc == 0, text


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*")) if p.name != ".build.lock"}


def link(c: Case):
    """``dsv41-aot link``: accepts when it leaves every file as it was."""
    before = _snapshot(c.root)
    rc, text = _cli(["link", "--dir", c.root])
    after = _snapshot(c.root)
    changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    what = [f"{'removed' if p not in after else 'wrote' if p in before else 'added'} {p}" for p in changed]
    return rc == 0 and not changed, "\n".join([f"exit {rc}", text, *what])


_LOADER = r"""
import json, os, sys
from pathlib import Path
from dsv41_aot.errors import AotError
from dsv41_aot.runtime import loader, state
from dsv41_aot.aot.hiprec import ARCH_NAMES, Stream, launch_values
job = json.loads(sys.stdin.read())
out = []
for arch, release, keys in job["rooms"]:
    with state.fresh():  # a serving process of that release's vLLM on that arch
        os.environ["RECORDING_HIP_ARCH"] = ARCH_NAMES[arch]
        loader.running_vllm(Path(job["trees"][release]))
        for k in keys:
            try:
                launcher = loader.load_key(k, prebuilt=job["root"])
                launcher.bind()
                launcher(*launch_values([s["ctype"] for s in launcher.abi if s["name"] != "stream"]), stream=Stream())
            except AotError as e:
                out.append(f"{type(e).__name__}: {e.message} (fix: {e.fix})")
            except Exception as e:  # a crash: named as one
                out.append(f"crash: {type(e).__name__}: {e}")
print(json.dumps(out))
"""


def loader(c: Case):
    """Each key of the base loaded, bound and launched once, by a process running its release's vLLM."""
    from dsv41_aot.aot import hiprec

    env = {k: v for k, v in os.environ.items() if not k.startswith(("DSV41_AOT_", "RECORDING_HIP_"))}
    env.update(hiprec.env(c.base.hip, None), PYTHONPATH=str(REPO), DSV41_AOT_CACHE=str(c.dir / "band-cache"))
    job = {"root": str(c.root), "trees": c.base.trees,
           "rooms": [[a, r, ks] for (a, r), ks in sorted(c.base.keys.items())]}
    p = subprocess.run([sys.executable, "-c", _LOADER], input=json.dumps(job), capture_output=True, text=True,
                       env=env, cwd=REPO, timeout=300)
    try:
        failures = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return False, f"crash: the loader process exited {p.returncode}: {p.stderr[-2000:]}"
    return not failures, "\n".join(failures)


@dataclass(frozen=True)
class Reader:
    """A reader: its verdict function, the forms it reads and the records it reads in them.

    ``newest``: it reads only the rooms of the installed vLLM's release (doctor)."""

    name: str
    run: Callable
    forms: tuple
    sees: frozenset
    newest: bool = False

    def reads(self, t: Tampering, form: str, newest: str) -> bool:
        if form not in self.forms or t.record not in self.sees:
            return False
        return not (self.newest and t.room is not None and not t.room.endswith(newest))


ROOM = frozenset({"manifest.json", "libs.json", "timings.json"})
WHOLE = ROOM | {"verified.json", ".build-pending.json", "band", "object", "lib", "objects", "foreign", "roomfile",
                "archfile", "rootfile", "RECORD", "METADATA", "WHEEL", "module"}
FOLDERS = ("built", "shipped", "installed")
READERS = (
    Reader("verify --dir", verify_dir, FOLDERS, ROOM | {"verified.json", ".build-pending.json", "band", "object", "lib",
                                                       "objects", "foreign", "roomfile", "archfile"}),
    Reader("verify --wheel", verify_wheel, ("wheel",), WHOLE),
    Reader("check_wheel", check_wheel, ("wheel",), WHOLE),
    Reader("gate", gate, ("built", "shipped"), ROOM | {"verified.json", "band", "object", "lib", "objects", "foreign"}),
    Reader("doctor", doctor, FOLDERS, ROOM | {"verified.json", "band", "foreign"}, newest=True),
    Reader("build", build, ("built",), ROOM - {"libs.json"} | {"object"}),
    Reader("merge", merge, ("built",), ROOM - {"libs.json"} | {"verified.json", "object"}),
    Reader("loader", loader, FOLDERS, ROOM | {"band", "foreign"}),
    Reader("link", link, ("built",), ROOM | {"band", "object", "lib"}),  # last: it writes
)


def readers_of(t: Tampering, form: str) -> list[Reader]:
    from dsv41_aot.facts.releases import NEWEST

    return [r for r in READERS if r.reads(t, form, NEWEST)]


def run(base: Base, t: Tampering, form: str, dest: Path, readers=None) -> dict | None:
    """Each reader's (accepts, text) on ``t`` in ``form`` (None: the form cannot hold it, or no reader reads it)."""
    chosen = [r for r in readers_of(t, form) if readers is None or r.name in readers]
    if not chosen:
        return None
    c = case(base, t, form, dest)
    if c is None:
        return None
    try:
        return {r.name: r.run(c) for r in chosen}
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def check_base(base: Base, dest: Path) -> dict:
    """Every reader's verdict on the base itself, each form (all must accept)."""
    from _tamper import Tampering as T

    nothing = T("none", "manifest.json", ".", lambda tree: None, needs=".")
    out = {}
    for form in FORMS:
        c = case(base, nothing, form, dest / form)
        out[form] = {r.name: r.run(c) for r in READERS if form in r.forms}
    return out


def forms_of(base: Base, t: Tampering) -> list[str]:
    """The forms of the base that hold what ``t`` damages and have a reader that reads it."""
    trees = {"built": FolderTree(base.built, "built"), "shipped": FolderTree(base.shipped, "shipped"),
             "wheel": ZipTree(base.members, base.infos), "installed": FolderTree(base.installed, "installed")}
    return [f for f in FORMS if t.applies(trees[f]) and readers_of(t, f)]


def sample(base: Base, tamperings: list, seed: int, more: int = 0) -> list[tuple]:
    """(tampering, form) cases drawn with ``seed``: of every family (action and record), one case in the wheel
    (cheap) and one in a folder form drawn by how many readers read it there; then one per reader none reached;
    then ``more``."""
    import random

    rng = random.Random(seed)
    cases = [(t, f) for t in tamperings for f in forms_of(base, t)]
    families: dict = {}
    for t, f in cases:
        families.setdefault(t.family, {}).setdefault(f, []).append((t, f))
    chosen = []
    for _, by_form in sorted(families.items()):
        folders = [f for f in sorted(by_form) if f != "wheel"]
        picked = ["wheel"] if "wheel" in by_form else []
        if folders:
            picked += rng.choices(folders, [len(readers_of(*by_form[f][0])) for f in folders])
        chosen += [rng.choice(by_form[f]) for f in picked]
    for r in READERS:
        if not any(r in readers_of(t, f) for t, f in chosen):
            chosen.append(rng.choice([c for c in cases if r in readers_of(*c)]))
    rest = [c for c in cases if c not in chosen]
    return chosen + rng.sample(rest, min(more, len(rest)))


QUIET = tuple(r.name for r in READERS if r.name in ("build", "link"))  # their refusal is an act: a rebuild, a relink


def first_fix(text: str) -> str | None:
    """The first ``fix:`` a reader printed."""
    return next((line.split("fix:", 1)[1].strip() for line in text.splitlines() if line.strip().startswith("fix:")),
                None)


def run_fix(fix: str, root: Path) -> str | None:
    """Run ``fix`` word for word, each command of it (``&&``): None when every one exits 0, else what failed.

    ``dsv41-aot`` runs in this process; ``rm`` as itself; anything else (pip) is not run here."""
    import shlex

    for command in fix.split(" && "):
        argv = shlex.split(command)
        if argv[:1] == ["dsv41-aot"]:
            rc, text = _cli(argv[1:])
        elif argv[:1] == ["rm"]:
            p = subprocess.run(argv, capture_output=True, text=True)
            rc, text = p.returncode, p.stdout + p.stderr
        else:
            return f"not run here: {command}"
        if rc != 0:
            return f"{command} -> exit {rc}: {text.strip()[-800:]}"
    return None


def fix_works(base: Base, t: Tampering, dest: Path) -> str | None:
    """In the built form: the first fix ``verify --dir`` prints for ``t``, run word for word on a fresh damaged
    copy, must leave a tree every reader accepts. None when it does (or verify accepts), else why not."""
    c = case(base, t, "built", dest)
    try:
        ok, text = verify_dir(c)
        fix = None if ok else first_fix(text)
        if ok:
            return None
        if fix is None:
            return "verify refused it and printed no fix"
        failed = run_fix(fix, c.root)
        if failed:
            return f"fix: {fix}: {failed}"
        left = {r.name: text for r in READERS if "built" in r.forms for ok, text in [r.run(c)] if not ok}
        return f"fix: {fix}: then refused by {', '.join(left)}: {next(iter(left.values()), '')[-600:]}" \
            if left else None
    finally:
        shutil.rmtree(dest, ignore_errors=True)
