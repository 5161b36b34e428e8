"""``dsv41-aot coverage``: a deployment's keys checked against a build.

Which keys a deployment needs is :mod:`dsv41_aot.deployment`'s; this
module checks them against a prebuilt directory or a matrix profile.

    dsv41-aot coverage --arch gfx950 --tp 4 --draft dspark          # every release
    dsv41-aot coverage --arch gfx950 --tp 4 --release 0.32.0 --profile full --json
"""

from __future__ import annotations

from pathlib import Path

from .. import commands
from ..deployment import CoverageInputError, Deployment, NotDeployed, compare, deployment, held, parse_draft
from ..facts.releases import release_facts
from ..listing import built_releases
from ..manifest import MANIFEST, PREFIX, prebuilt_dir
from ..room import Room


def check(dep: Deployment, m, root, profile: str | None, missing_ok: bool) -> dict:
    """The coverage report of ``dep``: against its room in ``root``, or a profile.

    A key of another release never satisfies one. A room missing from
    ``root`` misses every key when ``missing_ok``, else it is bad input."""
    if profile is not None:
        have = {str(k) for k in m.select(profile) if k.release == dep.release}
        return compare(dep, have, have, f"profile {profile!r} of {m.path}")
    room = Room(root, dep.arch, dep.release)
    if not room.manifest_path.is_file():
        if missing_ok:
            return compare(dep, set(), set(), f"{room.dir} (absent)")
        held_releases = built_releases(room.arch_dir)
        raise CoverageInputError(
            f"no prebuilt kernels for {dep.arch} of vLLM {dep.release} at {room.dir} (no {MANIFEST}; {dep.arch} holds "
            f"{', '.join('vLLM ' + v for v in held_releases) if held_releases else 'no release'})",
            fix=f"{commands.build(root, arch=dep.arch, release=dep.release)}, or pass --dir / --profile")
    have, linked = held(room)
    return compare(dep, have, linked, str(room.dir))


def check_all(arch: str, tp: int, *, max_rows=None, draft_text: str | None = None, release: str | None = None,
              root=None, profile: str | None = None, matrix_path=None) -> tuple[list[dict], list[dict]]:
    """(reports, skipped) for a deployment under ``release``, or every release.

    A release that does not run the deployment is skipped unless it was
    named (then NotDeployed, exit 2). A prebuilt directory with no room of
    the arch is bad input; a missing room of one release misses its keys."""
    from . import matrix

    m = matrix.load(matrix_path)
    draft = parse_draft(draft_text, m.drafts)
    releases = [release_facts(release).version] if release is not None else list(m.releases)
    skipped, deps = [], []
    for version in releases:
        try:
            deps.append(deployment(arch, tp, max_rows, draft, release=version))
        except NotDeployed as e:
            if release is not None:
                raise
            skipped.append({"release": version, "arch": arch, "tp": tp, "reason": e.message})
    if not deps:
        raise NotDeployed(f"no vLLM release of the matrix runs {arch} at TP {tp}: "
                          f"{'; '.join(s['reason'] for s in skipped)}",
                          fix="pick a deployment one of them runs (see dsv41-aot coverage --help)")
    if profile is None:
        root = Path(root) if root is not None else prebuilt_dir()
        if release is None and not built_releases(root / arch):
            raise CoverageInputError(f"no prebuilt kernels for {arch} at {root / arch} (no {PREFIX}<release>/{MANIFEST})",
                                     fix=f"{commands.build(root, arch=arch)}, or pass --dir / --profile")
    reports = [check(dep, m, root, profile, release is None) for dep in deps]
    return reports, skipped
