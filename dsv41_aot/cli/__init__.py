"""``dsv41-aot``: every command a user runs.

Exit codes: 0 ok, 1 checks failed, 2 bad input (the command line, the
matrix, the environment). With ``--json`` a command prints one JSON
document on stdout, also on an error (``dsv41_aot.aot.output``). Each
command module here provides ``register(subparsers)``; its ``func(args) ->
int`` runs the command, and the work is the build half's or the core's.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from ..aot.output import INTERNAL_ERROR, error_doc, internal_error_doc, print_json
from ..errors import AotError


def add_dir(p, flag: str = "--dir") -> None:
    """The prebuilt directory option of a command, defaulting as the loader does."""
    from ..manifest import prebuilt_dir

    p.add_argument(flag, default=str(prebuilt_dir()), help="prebuilt directory (default: $DSV41_AOT_PREBUILT, else "
                                                           "kernels_prebuilt/)")


def add_worker_args(p, what: str, when: str = "") -> None:
    """The options of the worker processes that build a command's keys (each worker's ``what``), ``when`` they run."""
    p.add_argument("--jobs", "-j", type=int, default=None, help=f"{when}worker processes (default: CPU count)")
    p.add_argument("--key-timeout", type=float, default=None, metavar="SECONDS",
                   help=f"{when}fail a key whose {what} takes longer; its worker is replaced (default 600)")
    p.add_argument("--vllm-src", action="append", metavar="PATH",
                   help=f"{when}a vLLM tree (folder holding vllm/) to build its release's keys from (repeatable: one "
                        "per release); default: the installed vllm, then the tree cache (dsv41-aot fetch-vllm)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_shard_args(p, when: str = "") -> None:
    """The options that choose the matrix's keys and their shards as ``build`` does, ``when`` they apply."""
    p.add_argument("--profile", help=f"{when}matrix profile (default: the matrix's default_profile)")
    p.add_argument("--arch", action="append", help=f"{when}only keys of this arch (repeatable)")
    p.add_argument("--seconds", nargs="+", default=[], metavar="TIMINGS",
                   help="with --shard: <arch>/timings.json files (or manifest.json / arch folders beside them) "
                        "whose recorded compile seconds balance the shards")


# the command modules of this package, each with register(subparsers)
COMMANDS: tuple[str, ...] = ("build", "inspect", "verify", "link", "coverage", "cache", "doctor", "facts")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dsv41-aot", description="Ahead-of-time kernels for vLLM's DeepSeek-V4.1 mono decode layer")
    sub = ap.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"dsv41_aot.cli.{name}").register(sub)
    return ap


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:  # argparse's usage error (exit 2), already on stderr
        if e.code == 2 and "--json" in argv:
            print_json(error_doc(next((a for a in argv if not a.startswith("-")), ""), AotError("bad command line (see the usage above)",
                                                                  fix="dsv41-aot --help")))
        raise
    try:
        return args.func(args)
    except AotError as e:
        print(f"dsv41-aot {args.command}: error: {e}", file=sys.stderr)
        if getattr(args, "json", False):
            print_json(error_doc(args.command, e))
        return e.exit_code
    except KeyboardInterrupt:
        print(f"dsv41-aot {args.command}: interrupted (rerun to resume)", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (build --list | head): say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor at exit, when Python flushes stdout
        return 128 + signal.SIGPIPE  # what a shell reports for a command SIGPIPE ended
    except Exception as e:  # noqa: BLE001 - a bug: still one JSON document, and its own exit code
        import traceback

        traceback.print_exc()
        print(f"dsv41-aot {args.command}: internal error: {type(e).__name__}: {e} (a bug: please report it with "
              f"the traceback above)", file=sys.stderr)
        if getattr(args, "json", False):
            print_json(internal_error_doc(args.command, e))
        return INTERNAL_ERROR
