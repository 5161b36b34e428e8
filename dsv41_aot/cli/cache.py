"""``dsv41-aot cache``'s arguments and output; ``aot.cache`` does the work."""

from __future__ import annotations

from ..aot.cache import ENV_BUILD_CACHE, cache_dir, contents, identity_digest
from ..aot.output import print_json, tally
from ..errors import AotError


def add_args(p, what: str) -> None:
    """``--cache`` / ``--no-cache`` on a command that uses the build cache."""
    p.add_argument("--cache", metavar="DIR",
                   help=f"build cache of {what}, keyed by their full build identity and shared by every --out "
                        f"(default: ${ENV_BUILD_CACHE}; none when unset)")
    p.add_argument("--no-cache", action="store_true",
                   help="no build cache at all: build every key for real, and neither read nor write the cache "
                        f"(nor ${ENV_BUILD_CACHE})")


def register(sub) -> None:
    p = sub.add_parser("cache", help="the build cache: where it is, what it holds, its identity digest")
    p.add_argument("--cache", metavar="DIR", help=f"build cache folder (default: ${ENV_BUILD_CACHE})")
    p.add_argument("--matrix", help="build matrix file (default: build_matrix.yaml): the releases it builds")
    p.add_argument("--identity", action="store_true",
                   help="print only the identity digest (what a CI cache key names: .github/workflows/wheels.yml)")
    p.add_argument("--json", action="store_true", help="print one JSON summary")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..aot import toolchain

    folder = cache_dir(args.cache)
    if folder is not None and folder.exists() and not folder.is_dir():
        raise AotError(f"build cache {folder}: not a folder", fix=f"pass --cache DIR (or set {ENV_BUILD_CACHE}) to a "
                                                                 f"folder, or unset it")
    digest = identity_digest(toolchain.find(), args.matrix)
    if args.identity:
        print(digest)
        return 0
    if folder is not None and not folder.exists():  # a typo reads as an empty cache otherwise
        raise AotError(f"build cache {folder}: no such folder (no build has used it)",
                       fix="pass --cache DIR naming the folder a build's --cache wrote")
    counts, size = contents(folder)
    if args.json:
        print_json(tally(0, 0, [], cache=str(folder) if folder else None, identity=digest,
                         objects=counts["compile"], jit_proofs=counts["jit"], bytes=size))
    elif folder is None:
        print(f"no build cache (pass --cache DIR or set {ENV_BUILD_CACHE}); identity {digest}")
    else:
        print(f"{folder}: {counts['compile']} compiled objects, {counts['jit']} JIT code objects, "
              f"{size / 1e6:.1f} MB; identity {digest}")
    return 0
