"""The house's shape, checked on the source: the runtime half never imports
the build half (nor FlyDSL, torch, vLLM, yaml, tqdm), the shared core imports
neither half, no module imports the CLI, and the package has no import cycle.

Imports are read from each module's syntax tree (every ``import`` statement,
top level or inside a function), so a lazy import counts as much as an eager
one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "dsv41_aot"
HEAVY = ("flydsl", "torch", "vllm", "yaml", "tqdm", "matplotlib", "msgpack", "elftools", "numpy")
SHARED = ("dsv41_aot", "dsv41_aot.errors", "dsv41_aot.keys", "dsv41_aot.manifest", "dsv41_aot.room",
          "dsv41_aot.verdict", "dsv41_aot.listing", "dsv41_aot.pending", "dsv41_aot.commands", "dsv41_aot.linkrecord",
          "dsv41_aot.proof", "dsv41_aot.source", "dsv41_aot.elf",
          "dsv41_aot.facts", "dsv41_aot.facts.arches", "dsv41_aot.facts.kinds", "dsv41_aot.facts.releases",
          "dsv41_aot.deployment", "dsv41_aot.facts.flydsl")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (``from X import y``
    counts as X and, when X.y is a module of the package, X.y)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            subs = [f"{mod}.{a.name}" for a in node.names]
            subs = [s for s in subs if (PKG.parent / s.replace(".", "/")).with_suffix(".py").is_file()
                    or (PKG.parent / s.replace(".", "/") / "__init__.py").is_file()]
            out.update(subs)
            if node.module or len(subs) < len(node.names):  # ``from .. import x`` of modules only: not the package
                out.add(mod)
    return out


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}
# an import of a module's own ancestor package is left out: importing any
# submodule runs its parents first, which is no cycle of this module's making
GRAPH = {m: {i for i in imports_of(p) if i in MODULES and i != m and not m.startswith(i + ".")}
         for m, p in MODULES.items()}


def _crosses(mod: str, allowed_prefixes: tuple, what: str) -> list[str]:
    bad = []
    for imp in imports_of(MODULES[mod]):
        top = imp.split(".")[0]
        if top in HEAVY:
            bad.append(f"{mod} imports {imp} ({what} must not)")
        elif imp.startswith("dsv41_aot") and imp not in SHARED and not imp.startswith(allowed_prefixes):
            bad.append(f"{mod} imports {imp} ({what} may import only the shared core and {allowed_prefixes})")
    return bad


def test_the_two_halves_exist():
    assert {"dsv41_aot.runtime.loader", "dsv41_aot.runtime.hip", "dsv41_aot.runtime.vllm_plugin"} <= set(MODULES)
    assert {"dsv41_aot.aot.builder", "dsv41_aot.aot.compiler", "dsv41_aot.aot.link"} <= set(MODULES)


@pytest.mark.parametrize("mod", sorted(m for m in MODULES if m.startswith("dsv41_aot.runtime")))
def test_runtime_never_imports_the_build_half(mod):
    assert _crosses(mod, ("dsv41_aot.runtime",), "the runtime") == []


@pytest.mark.parametrize("mod", SHARED)
def test_shared_core_imports_neither_half(mod):
    allowed = ("dsv41_aot.runtime",) if mod == "dsv41_aot" else ()  # __init__'s lazy public API
    assert _crosses(mod, allowed, "the shared core") == []


def test_public_vllm_name_is_the_runtime_plugin():
    assert imports_of(MODULES["dsv41_aot.vllm"]) <= {"sys", "dsv41_aot.runtime", "dsv41_aot.runtime.vllm_plugin"}


def _cli(mod: str) -> bool:
    return mod == "dsv41_aot.cli" or mod.startswith("dsv41_aot.cli.")


def test_nothing_imports_the_cli():
    users = sorted(m for m, deps in GRAPH.items() if not _cli(m) and any(_cli(d) for d in deps))
    assert users == []


def test_the_cli_parses_and_prints_nothing_else_does():
    """Every command's argparse lives in the CLI package (dsv41_aot/cli/);
    the build half and the core do the work and return what to print."""
    parsers = sorted(m for m, p in MODULES.items() if not _cli(m) and "argparse" in imports_of(p))
    assert parsers == []
    assert {"dsv41_aot.cli.build", "dsv41_aot.cli.verify", "dsv41_aot.cli.link"} <= set(MODULES)


def test_no_import_cycles():
    """Tarjan's strongly connected components over the package's import
    graph: every component must be a single module."""
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert cycles == []


# the layers, lowest first: a module may import its own layer's and lower ones only
# (the facts know nothing of keys, rooms or manifests; the core nothing of
# either half; the halves nothing of the CLI, checked above)
LAYERS = (("dsv41_aot.errors",), ("dsv41_aot.facts",))


def _layer(mod: str) -> int:
    """The layer of ``mod``: its index in LAYERS, else one above them all."""
    return next((i for i, names in enumerate(LAYERS) if mod in names or mod.startswith(tuple(n + "." for n in names))),
                len(LAYERS))


@pytest.mark.parametrize("mod", sorted(m for m in MODULES if _layer(m) < len(LAYERS)))
def test_no_import_from_a_lower_layer_to_a_higher_one(mod):
    up = sorted(i for i in GRAPH[mod] if _layer(i) > _layer(mod))
    assert up == [], f"{mod} imports {up}, of a higher layer"


def test_the_checker_sees_a_crossing(tmp_path, monkeypatch):
    """The walker itself: a runtime module with a lazy build import is caught."""
    fake = PKG / "runtime" / "loader.py"
    src = fake.read_text() + "\n\ndef _x():\n    from ..aot import compiler\n"
    probe = tmp_path / "dsv41_aot" / "runtime" / "loader.py"
    probe.parent.mkdir(parents=True)
    probe.write_text(src)
    monkeypatch.setattr(__import__(__name__), "PKG", tmp_path / "dsv41_aot")
    mods = {"dsv41_aot.runtime.loader": probe}
    monkeypatch.setattr(__import__(__name__), "MODULES", mods)
    assert any("dsv41_aot.aot" in b for b in _crosses("dsv41_aot.runtime.loader", ("dsv41_aot.runtime",), "rt"))


# ---------------------------------------------------------------- one owner of a room's names and records

REPO = PKG.parent
ROOM_FOLDER_OWNER = PKG / "manifest.py"  # folder_name(): every other file calls it
ENTRY_OWNER = PKG / "manifest.py"  # Entry and its one parser, Manifest.parse
ENTRY_FIELDS = ("key", "kind", "arch", "fields", "symbol", "entry", "object", "sha256", "bytes",
                "code_object_sha256", "code_object_bytes", "abi", "source", "resources", "export_bytes")
# a manifest entry read as a dict: e["sha256"], entry["object"], man.entries[k]["symbol"]
ENTRY_READ = re.compile(r"""(?:\b(?:e|entry)|\.entries\[[^\]\n]+\]|\.entries\.get\([^)\n]+\))\[["'](?:%s)["']\]"""
                        % "|".join(ENTRY_FIELDS))
# a room folder spelled by hand: an f-string of "vllm-" and a brace (vLLM's own wheel and dist-info names aside)
FOLDER_SPELLED = re.compile(r"vllm-\{")
VLLM_OWN = (".whl", ".dist-info")  # names of vLLM's own wheel and metadata folder, not rooms


def _sources(*roots: str) -> list[Path]:
    return sorted(p for r in roots for p in (REPO / r).rglob("*.py")) + [REPO / "setup.py"]


def spelled_folders(paths) -> list[str]:
    return [f"{p.relative_to(REPO)}:{n}" for p in paths if p != ROOM_FOLDER_OWNER
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if FOLDER_SPELLED.search(line) and not any(w in line for w in VLLM_OWN)]


def entries_read_as_dicts(paths) -> list[str]:
    return [f"{p.relative_to(REPO)}:{n}" for p in paths if p != ENTRY_OWNER
            for n, line in enumerate(p.read_text().splitlines(), 1) if ENTRY_READ.search(line)]


def test_the_room_folder_name_is_spelled_once():
    """``vllm-<release>`` is built by manifest.folder_name alone; code,
    benches and tests call it (room.room_dir, Room.dir)."""
    assert spelled_folders(_sources("dsv41_aot", "ci", "bench", "tests")) == []


def test_no_manifest_entry_is_read_as_a_dict():
    """Manifest entries are manifest.Entry records: nothing outside their
    module reads one by a string subscript."""
    assert entries_read_as_dicts(_sources("dsv41_aot", "ci", "bench")) == []


def test_the_owner_checks_catch_a_slip(tmp_path):
    """The two checks above see a hand-spelled folder and a dict-read entry."""
    slip = tmp_path / "slip.py"
    folder = "vllm-" + "{"  # not spelled here: this file is checked too
    slip.write_text(f'path = root / f"{folder}release}}" / "x"\nsha = man.entries[key]["sha256"]\nobj = e["object"]\n'
                    f'wheel = f"{folder}v}}-cp312.whl"\ninfo = f"{folder}v}}.dist-info"\n')
    global REPO
    old, REPO = REPO, tmp_path
    try:
        assert spelled_folders([slip]) == ["slip.py:1"]
        assert entries_read_as_dicts([slip]) == ["slip.py:2", "slip.py:3"]
    finally:
        REPO = old


# ---------------------------------------------------------------- no private name crosses a module


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(path: Path) -> list[str]:
    """Where ``path`` takes another module's ``_private`` name: ``from .x
    import _y``, or ``x._y`` on a module of ours it imported. Names of
    other projects (FlyDSL's) are theirs to keep private, not ours."""
    tree = ast.parse(path.read_text(), str(path))
    ours = ("dsv41_aot", "ci")
    modules, bad = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in ours):
            bad += [f"{path}:{node.lineno}: imports {a.name}" for a in node.names if _private(a.name)]
            modules.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            modules.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] in ours)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and _private(node.attr)):
            bad.append(f"{path}:{node.lineno}: reaches {node.value.id}.{node.attr}")
    return bad


def test_no_module_takes_another_modules_private_name():
    paths = sorted(PKG.rglob("*.py")) + sorted((REPO / "ci").rglob("*.py"))
    assert [b for p in paths for b in private_imports(p)] == []


def test_the_private_name_check_catches_a_slip(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from .rooms import _Index\nfrom . import host\nfrom flydsl import _ok\n"
                     "def f():\n    return host._installed_vllm(), host.__name__\n")
    found = private_imports(probe)
    assert len(found) == 2 and "imports _Index" in found[0] and "reaches host._installed_vllm" in found[1]


# ---------------------------------------------------------------- one verdict on a room

VERDICT_OWNER = PKG / "verdict.py"  # verdict.problems: the one judge of a key's link and a band's exports
BYTE_SEARCH = ("find", "rfind", "index", "count", "startswith", "endswith")


def _attrs(node: ast.AST) -> set[str]:
    """The attribute names an expression reads (``e.entry.encode()``: entry, encode)."""
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def _looked_up(node: ast.AST) -> bool:
    """A value looked up by key: ``band.entries[key]``, ``linked.get(key)``."""
    return isinstance(node, ast.Subscript) or (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                                               and node.func.attr == "get")


def second_verdicts(paths) -> list[str]:
    """Functions outside verdict.py that judge a key's link (a looked-up value
    compared with an entry's ``.sha256``) or a band's exports (an entry name
    searched for in a library's bytes): ``path:line function``."""
    out = []
    for path in paths:
        if path == VERDICT_OWNER:
            continue
        for fn in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for n in ast.walk(fn):
                link = export = False
                if isinstance(n, ast.Compare):
                    sides = [n.left, *n.comparators]
                    if any(isinstance(op, (ast.Eq, ast.NotEq)) for op in n.ops):
                        link = any(isinstance(a, ast.Attribute) and a.attr == "sha256"
                                   and any(_looked_up(b) for b in sides if b is not a) for a in sides)
                    if any(isinstance(op, (ast.In, ast.NotIn)) for op in n.ops):
                        export = "entry" in _attrs(n.left) and not isinstance(n.left, ast.Attribute)
                elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in BYTE_SEARCH:
                    export = any("entry" in _attrs(a) for a in n.args)
                if link or export:
                    out.append(f"{path.relative_to(REPO)}:{n.lineno} {fn.name} judges a "
                               f"{'key' + chr(39) + 's link' if link else 'band' + chr(39) + 's exports'}")
    return out


def test_only_the_room_judges_links_and_exports():
    """Whether a key is linked from its own object and whether its band
    exports its entry is decided by verdict.problems alone: verify, link, the
    wheel gate, verify --wheel and ci/check_wheel.py ask it."""
    assert second_verdicts(_sources("dsv41_aot", "ci")) == []


def test_the_verdict_check_catches_a_slip(tmp_path):
    """A second judge planted outside verdict.py, the way the wheel checks once
    judged, is found: the link comparison and the byte search both."""
    slip = tmp_path / "slip.py"
    slip.write_text("def check(man, links, raw):\n"
                    "    for key, e in man.entries.items():\n"
                    "        if links.band_of[key].entries[key] != e.sha256:\n"
                    "            yield key\n"
                    "        if (e.entry.encode() + b'\\0') not in raw:\n"
                    "            yield key\n"
                    "        if raw.find(e.entry.encode()) < 0:\n"
                    "            yield key\n"
                    "        if e.sha256 == manifest.entries[key].sha256 or key in links.band_of:\n"
                    "            pass\n")
    global REPO
    old, REPO = REPO, tmp_path
    try:
        assert second_verdicts([slip]) == ["slip.py:3 check judges a key's link",
                                           "slip.py:5 check judges a band's exports",
                                           "slip.py:7 check judges a band's exports"]
    finally:
        REPO = old
