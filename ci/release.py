"""The release stages: one subcommand per step of .github/workflows/wheels.yml.

docs/releases.md describes each stage (which job runs it, what it does,
when it fails); ``python ci/release.py --help`` lists the subcommands and
``SUBCOMMAND --help`` their options. ``wheel`` runs prewheel, build-wheel
(the suite's stand-in for the cibuildwheel step) and checkwheel, as
ci/wheels.sh does.

The workflow passes each cell's coordinates in the environment (``ARCH``,
``SHARD``, ``SHARDS``, ``PROFILE``) and GitHub passes the ref and the step
output file; each is also an option, so every stage runs the same on a
laptop. No release logic lives only in the YAML. The stages that only read
the checkout, and what every stage shares, are in ci/stages.py.

Exit codes: 0 ok, 1 a check failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ci.stages import (PY, StageError, check_tag, cli, cmd_cache_key, cmd_check_tag, cmd_facts,  # noqa: E402
                       cmd_source_date_epoch, must, package_version, run, source_date_epoch)


# ---------------------------------------------------------------- shard


def cmd_shard(args) -> int:
    from ci import build_shard

    shard = args.shard if "/" in str(args.shard) else f"{args.shard}/{args.shards}"
    # absolute: ci/build_shard.py runs its builds from the checkout's root
    argv = ["--arch", args.arch, "--shard", shard, "--out", str(Path(args.out).resolve())]
    if args.profile:
        argv += ["--profile", args.profile]
    seconds = sorted(str(p) for p in Path(args.seconds_dir).glob(f"{args.arch}-*.json"))  # recorded by a run before
    if seconds:
        argv += ["--seconds", *seconds]
    print(f"+ ci/build_shard.py {' '.join(argv)}", file=sys.stderr, flush=True)
    must(build_shard.main(argv), "ci/build_shard.py")
    return 0


# ---------------------------------------------------------------- merge


def shard_dirs(folder: Path) -> list:
    """The shard folders in ``folder``, or ``folder`` itself when it is one shard."""
    from ci.build_shard import PLANS

    if list(Path(folder).glob(PLANS)):  # download-artifact extracts a lone artifact into the path itself
        return [Path(folder)]
    dirs = sorted(p for p in Path(folder).iterdir() if p.is_dir() and not p.name.startswith("."))
    if not dirs:
        raise StageError(f"{folder} holds no shard folder (download the shard artifacts into it)", 2)
    return dirs


def copy_seconds(merged: Path, dest: Path) -> list:
    """Copy each room's timings.json into ``dest``, for the next run's shard balance."""
    from dsv41_aot.listing import built_rooms

    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for room in built_rooms(merged):
        src = room.timings_path
        if src.is_file():
            target = dest / f"{room.arch}-{room.release}.json"
            shutil.copyfile(src, target)
            out.append(target)
    return out


def cmd_merge(args) -> int:
    from ci import merge, prebuilt
    from dsv41_aot.listing import built_arches

    out, report = Path(args.out).resolve(), Path(args.report).resolve()  # dsv41-aot runs from the checkout's root
    shards = shard_dirs(Path(args.shards).resolve())
    must(merge.main(["--require-verified", "--out", str(out), *map(str, shards)]), "ci/merge.py")
    arches = [args.arch] if args.arch else [d.name for d in built_arches(out)]
    must(prebuilt.main([str(out), *arches]), "ci/prebuilt.py")
    report.mkdir(parents=True, exist_ok=True)
    name = "residency-" + "-".join(arches)
    with open(report / f"{name}.txt", "w") as txt:
        must(run(cli("inspect", "--dir", out, "--plot", report / f"{name}.png"), stdout=txt, cwd=ROOT),
              "dsv41-aot inspect --plot (a key that cannot be resident fails here)")
    with open(report / f"{name}.json", "w") as js:
        must(run(cli("inspect", "--dir", out, "--json"), stdout=js, cwd=ROOT), "dsv41-aot inspect --json")
    print("\n".join((report / f"{name}.txt").read_text().splitlines()[-40:]))
    for p in copy_seconds(out, report / "seconds"):
        print(f"compile seconds for the next balance: {p}")
    return 0


# ---------------------------------------------------------------- wheel


def cmd_prewheel(args) -> int:
    from ci import check_wheel, prebuilt

    must(prebuilt.main([args.prebuilt]), "ci/prebuilt.py")
    must(check_wheel.main(["--audit-prebuilt", args.prebuilt]), "ci/check_wheel.py --audit-prebuilt")
    return 0


def build_wheel(prebuilt: Path, out: Path, frontend: str = "build") -> Path:
    """Build the kernels wheel of ``prebuilt`` into ``out`` (emptied first); return it.

    It uses cibuildwheel's frontend (``build``, no isolation: nothing is
    fetched) on a copy of the sources, then the repair step's check.
    ``SOURCE_DATE_EPOCH`` defaults to this checkout's commit time (the copy
    is no git checkout), so two builds of one commit give the same sha256.
    """
    from ci.check_wheel import source_tree

    prebuilt, out = Path(prebuilt).resolve(), Path(out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = dict(os.environ, DSV41_AOT_PREBUILT=str(prebuilt))
    if not env.get("SOURCE_DATE_EPOCH"):
        epoch = source_date_epoch()
        if epoch is None:
            print(f"warning: {ROOT} is not a git checkout and SOURCE_DATE_EPOCH is unset: the wheel's timestamps "
                  "are the build's, so another build will not reproduce its sha256", file=sys.stderr)
        else:
            env["SOURCE_DATE_EPOCH"] = epoch
    with tempfile.TemporaryDirectory(prefix="dsv41-wheel-src-") as tmp:
        src = source_tree(Path(tmp) / "src")
        if frontend == "build":
            cmd = [PY, "-m", "build", "--wheel", "--no-isolation", "--outdir", out, src]
        else:
            cmd = [PY, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", out, src]
        must(run(cmd, env=env, stdout=sys.stderr), f"the wheel build ({frontend})")
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise StageError(f"{out}: {len(wheels)} wheels built, expected one")
    must(run([PY, ROOT / "ci" / "check_wheel.py", "--audit-only", wheels[0]]), "check_wheel.py --audit-only")
    return wheels[0]


def cmd_build_wheel(args) -> int:
    print(build_wheel(Path(args.prebuilt), Path(args.out), args.frontend))
    return 0


def twine_check(wheels: list) -> int:
    """Run ``twine check --strict``: the metadata and README an index shows."""
    exe = shutil.which("twine") or str(Path(PY).with_name("twine"))
    if not Path(exe).exists() and not shutil.which(exe):
        raise StageError("twine is not installed (pip install -e .[test])", 2)
    return run([exe, "check", "--strict", *wheels])


def cmd_checkwheel(args) -> int:
    from ci import check_wheel

    folder = Path(args.wheelhouse)
    wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else [folder]
    if len(wheels) != 1:
        raise StageError(f"{folder}: {len(wheels)} wheels, expected the one kernels wheel", 2)
    proofs = ["--require-proofs"] if args.require_proofs else []  # the verdict verify --wheel gives
    must(check_wheel.main(["--prebuilt", args.prebuilt, *proofs, str(wheels[0])]), "ci/check_wheel.py")
    must(twine_check(wheels), "twine check --strict")
    return 0


def cmd_wheel(args) -> int:
    args.prebuilt = str(Path(args.prebuilt).resolve())
    cmd_prewheel(args)
    wheel = build_wheel(Path(args.prebuilt), Path(args.out), args.frontend)
    args.wheelhouse = str(wheel.parent)
    return cmd_checkwheel(args)


# ---------------------------------------------------------------- attach


def release_assets(prebuilt: Path, residency: Path, out: Path) -> list:
    """Gather the GitHub release's assets into ``out`` (emptied first); return them.

    They are the residency pictures and summaries, each room's verified.json
    and SHA256SUMS.
    """
    from dsv41_aot.aot.jit import VERIFIED
    from dsv41_aot.listing import built_rooms

    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    files = []
    pictures = sorted(p for p in Path(residency).glob("residency-*") if p.suffix in (".png", ".txt", ".json"))
    if not any(p.suffix == ".png" for p in pictures):
        raise StageError(f"{residency}: no residency picture (residency-<arch>.png from the merge job)", 2)
    for p in pictures:
        shutil.copyfile(p, out / p.name)
        files.append(out / p.name)
    rooms = built_rooms(Path(prebuilt))
    if not rooms:
        raise StageError(f"{prebuilt}: no room (<arch>/vllm-<release>/)", 2)
    for room in rooms:
        src = room.verified_path
        if not src.is_file():
            raise StageError(f"{src.parent}: no {VERIFIED} (every released room carries its proofs; "
                             f"ci/merge.py --require-verified writes it)")
        target = out / f"verified-{room.arch}-{room.dir.name}.json"
        shutil.copyfile(src, target)
        files.append(target)
    sums = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in files)
    (out / "SHA256SUMS").write_text(sums)
    return files + [out / "SHA256SUMS"]


def gh_command(tag: str, files: list, exists: bool, repo: str | None) -> list:
    """The ``gh`` command that uploads ``files`` to the release of ``tag`` or creates it."""
    where = ["--repo", repo] if repo else []
    if exists:
        return ["gh", "release", "upload", tag, *map(str, files), "--clobber", *where]
    notes = (f"dsv41-aot {tag[1:]}: `pip install dsv41-aot=={tag[1:]}`. Attached: each arch's residency picture "
             f"and summaries, each room's verified.json (its proofs against vLLM's JIT), SHA256SUMS. "
             f"Checking a downloaded wheel: docs/releases.md.")
    return ["gh", "release", "create", tag, *map(str, files), "--verify-tag", "--title", tag, "--notes", notes,
            *where]


def cmd_attach(args) -> int:
    tag = args.tag or os.environ.get("GITHUB_REF_NAME")
    if not args.tag and os.environ.get("GITHUB_REF_TYPE") != "tag":
        raise StageError("not a tag: a GitHub release belongs to a tag (pass --tag TAG)", 2)
    check_tag("tag", tag, package_version())
    files = release_assets(Path(args.prebuilt), Path(args.residency), Path(args.out))
    for f in files:
        print(f"asset: {f.name} ({f.stat().st_size} bytes)")
    repo = os.environ.get("GITHUB_REPOSITORY")
    if args.dry_run:
        print("would run: " + " ".join(gh_command(tag, files, False, repo)))
        return 0
    gh = shutil.which("gh")
    if gh is None:
        raise StageError("gh (GitHub's CLI) is not on PATH", 2)
    view = subprocess.run([gh, "release", "view", tag, *(["--repo", repo] if repo else [])],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cmd = gh_command(tag, files, view.returncode == 0, repo)
    must(run([gh, *cmd[1:]]), " ".join(cmd[:3]))
    return 0


# ---------------------------------------------------------------- main


def parser() -> argparse.ArgumentParser:
    env = os.environ.get
    ap = argparse.ArgumentParser(prog="ci/release.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check-tag", help="a tag must be v + dsv41_aot.__version__ (else: nothing to check)")
    p.add_argument("--ref-type", default=env("GITHUB_REF_TYPE"), help="default: $GITHUB_REF_TYPE")
    p.add_argument("--ref-name", default=env("GITHUB_REF_NAME"), help="default: $GITHUB_REF_NAME")
    p.set_defaults(func=cmd_check_tag)

    p = sub.add_parser("facts", help="the arches and releases the later jobs run (to $GITHUB_OUTPUT)")
    p.set_defaults(func=cmd_facts)

    p = sub.add_parser("cache-key", help="the build cache's key and restore keys (to $GITHUB_OUTPUT)")
    p.add_argument("--arch", default=env("ARCH"), required=not env("ARCH"))
    p.add_argument("--shard", default=env("SHARD"), required=not env("SHARD"))
    p.set_defaults(func=cmd_cache_key)

    p = sub.add_parser("shard", help="build one shard of one arch's keys and prove them against vLLM's JIT")
    p.add_argument("--arch", default=env("ARCH"), required=not env("ARCH"))
    p.add_argument("--shard", default=env("SHARD"), required=not env("SHARD"), help="i (with --shards N) or i/N")
    p.add_argument("--shards", default=env("SHARDS", "1"), help="N (default: $SHARDS)")
    p.add_argument("--profile", default=env("PROFILE"), help="matrix profile (default: $PROFILE, else the matrix's)")
    p.add_argument("--out", required=True)
    p.add_argument("--seconds-dir", default=str(ROOT / "ci" / "seconds"),
                   help="recorded compile seconds, <arch>-<release>.json (default: ci/seconds/)")
    p.set_defaults(func=cmd_shard)

    p = sub.add_parser("merge", help="merge + link an arch's shards, check, residency picture, compile seconds")
    p.add_argument("--shards", required=True, help="folder holding one folder per shard")
    p.add_argument("--out", required=True, help="the merged prebuilt dir")
    p.add_argument("--report", required=True, help="residency-<arch>.png/.txt/.json and seconds/ go here")
    p.add_argument("--arch", default=env("ARCH"))
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("source-date-epoch", help="the checkout's commit time, SOURCE_DATE_EPOCH for a reproducible "
                                                 "wheel (to $GITHUB_OUTPUT)")
    p.set_defaults(func=cmd_source_date_epoch)

    p = sub.add_parser("prewheel", help="check every room, auditwheel on the raw libraries")
    p.add_argument("prebuilt")
    p.set_defaults(func=cmd_prewheel)

    for name, func, what in (("build-wheel", cmd_build_wheel, "build the wheel (the suite's cibuildwheel step)"),
                             ("wheel", cmd_wheel, "prewheel + build-wheel + checkwheel")):
        p = sub.add_parser(name, help=what)
        p.add_argument("prebuilt")
        p.add_argument("out")
        p.add_argument("--frontend", choices=("build", "pip"), default=env("DSV41_AOT_WHEEL_FRONTEND", "build"))
        if name == "wheel":
            p.add_argument("--require-proofs", action="store_true", help="as checkwheel --require-proofs")
        p.set_defaults(func=func)

    p = sub.add_parser("checkwheel", help="check_wheel.py against the prebuilt dir, twine check, and with "
                                          "--require-proofs dsv41-aot verify --wheel")
    p.add_argument("--prebuilt", required=True)
    p.add_argument("wheelhouse", help="the folder holding the one wheel (or the wheel)")
    p.add_argument("--require-proofs", action="store_true",
                   help="every key of every room must carry its proof against vLLM's JIT (verified.json)")
    p.set_defaults(func=cmd_checkwheel)

    p = sub.add_parser("attach", help="residency pictures, summaries and verified.json to the tag's GitHub release")
    p.add_argument("--prebuilt", required=True)
    p.add_argument("--residency", required=True)
    p.add_argument("--out", required=True, help="the assets are gathered here")
    p.add_argument("--tag", help="default: $GITHUB_REF_NAME (on a tag)")
    p.add_argument("--dry-run", action="store_true", help="gather and print the gh command; upload nothing")
    p.set_defaults(func=cmd_attach)
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except StageError as e:
        print(f"ci/release.py {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
