"""Coverage on the build side: the rules of which keys a deployment needs
are the shared core's (:mod:`dsv41_aot.facts.coverage`, also what ``dsv41-aot
doctor`` calls); this module checks them against a prebuilt directory or a
build matrix profile, and checks the matrix's own layer kinds against the
invariants vLLM asserts. The matrix is read only for ``--profile`` and its
routing presets (``--draft dspark``).

    dsv41-aot coverage --arch gfx950 --tp 4 --draft dspark          # every release
    dsv41-aot coverage --arch gfx950 --tp 4 --release 0.32.0 --profile full --json
"""

from __future__ import annotations

from pathlib import Path

from ..facts.coverage import (  # noqa: F401 (the rules, re-exported for callers of this module)
    TIMELINE, CoverageInputError, Deployment, NotDeployed, compare, deployment, held, layer_kinds, parse_draft,
)
from ..facts.coverage import required as _required
from ..facts.releases import release_facts, version_order
from ..manifest import MANIFEST, prebuilt_dir
from ..room import room_dir
from ..listing import built_releases
from ..room import Room


def required(dep: Deployment, sched: dict | None = None) -> list:
    """Every key vLLM ``dep.release`` can build for ``dep`` (the shared
    rules: ``sched``, the matrix, is not read)."""
    return _required(dep)


def schedule(path=None) -> dict:
    """{"matrix": the loaded matrix, "routing": {preset: fields} (each
    preset's fields from the newest release that gives them all)}, after
    the matrix's own layer kinds were checked, per release, against what
    that release's vLLM asserts: an index source is a compressed layer
    (runner.forward ``assert not index or ratio``), a layer runs whole only
    with the release's whole-layer ratios, a draft layer has no compressed
    keys (mono_decode._create), and only a release whose mono path runs
    draft layers whole lists draft layer kinds."""
    from . import matrix

    m = matrix.load(path)
    mpath = Path(m.path)
    routing: dict = {}
    for version, entry in m.releases.items():
        rel = release_facts(version)
        whole_drafts = any(d.draft_layers == "whole" for d in rel.arches.values())
        for name, entries in entry.layer_kinds.items():
            for e in entries:
                where = f"{mpath}: vLLM {version} layer_kinds.{name} {dict(e)}"
                ratio = int(e["ratio"])
                index = bool(e.get("index", rel.defaults["index"]))
                if index and not ratio:
                    raise CoverageInputError(f"{where}: an index source has compressed keys "
                                             f"(runner.py forward: assert not index or ratio)", fix=f"edit {mpath}")
                if ratio not in rel.whole_ratios:
                    raise CoverageInputError(f"{where}: vLLM {version} runs a layer whole only with compress ratio "
                                             f"{' or '.join(map(str, rel.whole_ratios))} (amd/mono_decode.py)",
                                             fix=f"edit {mpath}")
                if name == "draft" and (ratio or index):
                    raise CoverageInputError(f"{where}: vLLM runs no draft layer with compressed keys on the mono "
                                             f"path (mono_decode.py)", fix=f"edit {mpath}")
                if name == "draft" and not whole_drafts:
                    raise CoverageInputError(f"{where}: vLLM {version}'s mono path runs no draft layer whole "
                                             f"(mono_decode.py)", fix=f"edit {mpath}")
    for version in sorted(m.releases, key=version_order, reverse=True):
        for name, preset in m.releases[version].routing.items():
            if name not in routing and {"experts", "topk", "swa_width"} <= set(preset):
                routing[name] = dict(preset)
    return {"matrix": m, "routing": routing}


# ------------------------------------------------------------------ what is there


def available_in_dir(root: Path, arch: str, release: str, *,
                     missing_ok: bool = False) -> tuple[set, set | None, str]:
    """(keys in the room's manifest, keys its libs.json links -- None when
    nothing is linked --, what was checked) of ``root/arch/vllm-<release>``;
    with ``missing_ok`` a room that is not there holds nothing."""
    room = room_dir(Path(root) / arch, release)
    if not (room / MANIFEST).is_file():
        if missing_ok:
            return set(), set(), f"{room} (absent)"
        held_releases = built_releases(Path(root) / arch)
        raise CoverageInputError(
            f"no prebuilt kernels for {arch} of vLLM {release} at {room} (no manifest.json; {arch} holds "
            f"{', '.join('vLLM ' + v for v in held_releases) if held_releases else 'no release'})",
            fix=f"dsv41-aot build --arch {arch} --release {release} --out {root}, or pass --dir / --profile")
    have, linked = held(Room(root, arch, release))
    return have, linked, str(room)


def check(dep: Deployment, sched: dict, *, root=None, profile: str | None = None, missing_ok: bool = False) -> dict:
    """The coverage report of ``dep`` (``facts.coverage.compare``) against
    a prebuilt directory's room of ``dep.release`` or a matrix profile's
    keys of that release. A key of another release never satisfies one."""
    if profile is not None:
        have = {str(k) for k in sched["matrix"].select(profile) if k.release == dep.release}
        return compare(dep, have, have, f"profile {profile!r} of {sched['matrix'].path}")
    have, linked, against = available_in_dir(Path(root) if root is not None else prebuilt_dir(), dep.arch,
                                             dep.release, missing_ok=missing_ok)
    return compare(dep, have, linked, against)


def check_all(arch: str, tp: int, *, max_rows=None, draft_text: str | None = None, release: str | None = None,
              root=None, profile: str | None = None, matrix_path=None) -> tuple[list[dict], list[dict]]:
    """(reports, skipped) for the deployment under ``release``, or under
    every release of the matrix: a release that does not run the deployment
    is skipped ({"release", "arch", "tp", "reason"}), unless it was named
    (NotDeployed, exit 2). A prebuilt directory with no room of the arch at
    all is bad input; one without the room of some release (every release
    checked) misses all that release's keys."""
    sched = schedule(matrix_path)
    draft = parse_draft(draft_text, sched["routing"])
    releases = [release_facts(release).version] if release is not None else list(sched["matrix"].releases)
    skipped, deps = [], []
    for version in releases:
        try:
            deps.append(deployment(arch, tp, max_rows, draft, release=version))
        except NotDeployed as e:
            if release is not None:
                raise
            skipped.append({"release": version, "arch": arch, "tp": tp, "reason": str(e).split("\n")[0]})
    if not deps:
        raise NotDeployed(f"no vLLM release of the matrix runs {arch} at TP {tp}: "
                          f"{'; '.join(s['reason'] for s in skipped)}",
                          fix="pick a deployment one of them runs (see dsv41-aot coverage --help)")
    if profile is None:
        root = Path(root) if root is not None else prebuilt_dir()
        if release is None and not built_releases(root / arch):
            raise CoverageInputError(f"no prebuilt kernels for {arch} at {root / arch} (no vllm-<release>/manifest.json)",
                                     fix=f"dsv41-aot build --arch {arch} --out {root}, or pass --dir / --profile")
    reports = [check(dep, sched, root=root, profile=profile, missing_ok=release is None) for dep in deps]
    return reports, skipped
