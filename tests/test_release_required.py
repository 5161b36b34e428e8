"""Below the CLI a vLLM release is always said, never assumed: no function
argument or dataclass field named ``release`` defaults to a release, and the
newest release (``NEWEST``) is named only where choosing it is the point."""

import ast
import dataclasses
from pathlib import Path

import pytest

from dsv41_aot.facts.releases import NEWEST
from dsv41_aot.keys import BuildKey
from dsv41_aot.room import Room

PACKAGE = Path(__file__).resolve().parent.parent / "dsv41_aot"

# where naming the newest release is a decision, and why
NEWEST_ALLOWED = {
    "facts/releases.py": "defines it",
    "facts/__init__.py": "re-exports the facts",
    "cli/verify.py": "the CLI resolves --key strings without --release once",
    "runtime/rooms.py": "the loader's pick when no vLLM is installed (docs/loader.md)",
    "runtime/doctor.py": "reports that same pick",
}


def release_defaults(tree: ast.AST) -> list[str]:
    """Each ``release`` argument or annotated field that has a default other
    than None, and each ``<x> or NEWEST`` (a None quietly meaning the newest)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults))
            pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            for arg, default in pairs:
                if arg.arg == "release" and not (isinstance(default, ast.Constant) and default.value is None):
                    found.append(f"line {node.lineno}: argument release={ast.unparse(default)}")
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "release":
            v = node.value
            if v is not None and not (isinstance(v, ast.Constant) and v.value is None) \
                    and "kw_only=True" not in ast.unparse(v).replace(" ", ""):
                found.append(f"line {node.lineno}: field release = {ast.unparse(v)}")
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) \
                and any(isinstance(v, ast.Name) and v.id == "NEWEST" for v in node.values):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_checker_sees_a_defaulted_release():
    src = ("def a(release='0.33.0'): pass\n"
           "def b(*, release=NEWEST): pass\n"
           "def c(release=None): return release or NEWEST\n"
           "class K:\n    release: str = NEWEST\n"
           "def ok(x, *, release: str, other=None): pass\n")
    found = release_defaults(ast.parse(src))
    assert sorted(f.split(":")[0] for f in found) == ["line 1", "line 2", "line 3", "line 5"]


@pytest.mark.parametrize("path", sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                                        if p.relative_to(PACKAGE).parts[0] != "cli"))
def test_no_release_is_assumed_below_the_cli(path):
    assert release_defaults(ast.parse((PACKAGE / path).read_text())) == []


def test_the_newest_release_is_named_only_where_it_is_the_choice():
    users = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
                   if any(isinstance(n, ast.Name) and n.id == "NEWEST" or
                          isinstance(n, ast.alias) and n.name == "NEWEST"
                          for n in ast.walk(ast.parse(p.read_text()))))
    assert set(users) <= set(NEWEST_ALLOWED), sorted(set(users) - set(NEWEST_ALLOWED))


def test_a_key_a_manifest_and_a_pin_need_their_release(tmp_path):
    with pytest.raises(TypeError):
        BuildKey("k1", "gfx950", 4, 4, 1)
    with pytest.raises(TypeError):
        BuildKey.parse("k1@gfx950:s=4,tp=4,r=1")
    with pytest.raises(TypeError):
        Room(tmp_path, "gfx950")
    assert not any(f.name == "release" and f.default is not dataclasses.MISSING for f in dataclasses.fields(BuildKey))
    assert BuildKey("k1", "gfx950", 4, 4, 1, release=NEWEST).release == NEWEST
