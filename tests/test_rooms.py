"""Rooms (dsv41_aot/room.py): one owner for ``<arch>/vllm-<release>/``.

- A room of a release this dsv41-aot does not know (written by a newer one)
  survives build, link and verify byte for byte, with every object and band
  it names, and list / verify say it is there.
- Nothing but the room's parsers reads libs.json, manifest.json or
  verified.json.
"""

from __future__ import annotations

import ast
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from _smoke import REPO, copy_of, run_cli
from dsv41_aot import verdict
from dsv41_aot.room import Room
from dsv41_aot.listing import rooms_of

PKG = REPO / "dsv41_aot"


def _files(folder: Path) -> dict:
    return {p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_a_room_of_an_unknown_release_is_never_deleted(smoke_dir, tmp_path):
    d = copy_of(smoke_dir, tmp_path / "p")
    arch = d / "gfx950"
    (arch / "vllm-0.32.0").rename(arch / "vllm-0.34.0")  # as a newer dsv41-aot would leave it
    foreign = arch / "vllm-0.34.0"
    doc = json.loads((foreign / "libs.json").read_bytes())
    bands = {b["file"] for b in doc["libraries"]}
    objects = {e["object"] for e in json.loads((foreign / "manifest.json").read_bytes())["entries"].values()}
    before = _files(foreign)
    named = {n: hashlib.sha256((arch / "lib" / n).read_bytes()).hexdigest() for n in bands}
    named |= {o: hashlib.sha256((arch / o).read_bytes()).hexdigest() for o in objects}

    code, out, err = run_cli("build", "--release", "0.33.0", "--arch", "gfx950", "--out", d, "--no-progress")
    assert code == 0, err
    assert run_cli("link", "--dir", d)[0] == 0
    code, out, err = run_cli("verify", "--dir", d, check=False)
    assert code == 0, out + err
    assert "vllm-0.34.0 is a release this dsv41-aot does not know (it knows 0.32.0, 0.33.0); left as it is" in err
    code, out, err = run_cli("list", "--dir", d)
    assert "vllm-0.34.0" in out and "does not know" in out

    assert _files(foreign) == before
    assert {n: hashlib.sha256((arch / ("lib/" + n if n in bands else n)).read_bytes()).hexdigest()
            for n in named} == named
    # the room itself says what it is, and judges nothing of it
    (room,) = [r for r in rooms_of(arch) if r.release == "0.34.0"]
    assert not room.known and verdict.problems(room) == []
    assert [r.release for r in rooms_of(arch)] == ["0.33.0", "0.34.0"]


def _reads(tree: ast.AST) -> list[str]:
    """String constants naming the two room records in a module."""
    return sorted({n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                   and n.value in ("libs.json", "manifest.json")})


def test_only_the_rooms_parsers_read_libs_json_and_manifest_json():
    """Every module that names libs.json, manifest.json or verified.json as
    a file to read is the room's (room.py: LinkRecord.parse, Proof.parse;
    manifest.py: Manifest.parse, and LIBS_JSON / MANIFEST / VERIFIED, the
    names the others import), and nobody else json-loads them: each other
    use of the constants is a path, never a parse. Checked on the syntax
    tree: a json.load(s) call whose argument mentions one of them."""
    owners = {PKG / "room.py", PKG / "manifest.py"}
    offenders = []
    for path in sorted(list(PKG.rglob("*.py")) + list((REPO / "ci").glob("*.py")) + list((REPO / "bench").glob("*.py"))):
        if path in owners:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("load", "loads") \
                    and getattr(node.func.value, "id", None) == "json":
                text = ast.unparse(node)
                if any(name in text for name in ("LIBS_JSON", "MANIFEST", "libs.json", "manifest.json", "libs_path",
                                                 "manifest_path", "VERIFIED", "verified.json", "verified_path")):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: {text}")
    assert offenders == []


def test_the_parser_check_sees_a_second_parser(tmp_path):
    """The check itself: a module json-loading libs.json is caught."""
    tree = ast.parse('import json\nd = json.loads((room / "libs.json").read_bytes())\n')
    calls = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "loads"]
    assert calls and "libs.json" in calls[0]


def test_a_room_is_named_by_its_release_always():
    """No default release: a Room takes one, and says which."""
    import inspect

    sig = inspect.signature(Room)
    assert sig.parameters["release"].default is inspect.Parameter.empty


def test_an_arch_holding_only_an_unknown_releases_room_says_so(smoke_dir, tmp_path, fresh):
    """A prebuilt folder whose gfx950 holds only a newer dsv41-aot's room
    (vllm-0.34.0): the loader and doctor say the release is unknown (not
    "holds kernels for gfx950, not gfx950"), and the build their fix names
    is one this dsv41-aot accepts."""
    import os
    import shlex

    from dsv41_aot.errors import ReleaseMismatchError

    d = tmp_path / "p"
    (d / "gfx950").mkdir(parents=True)
    for name in ("lib", "objects"):
        shutil.copytree(smoke_dir / "gfx950" / name, d / "gfx950" / name)
    shutil.copytree(smoke_dir / "gfx950" / "vllm-0.33.0", d / "gfx950" / "vllm-0.34.0")
    with pytest.raises(ReleaseMismatchError, match=r"holds prebuilt kernels only for vLLM 0\.34\.0, a release this "
                                                   r"dsv41-aot does not know") as e:
        fresh.load_key("k1@gfx950:s=4,tp=4,r=1", prebuilt=d)
    assert "not gfx950" not in str(e.value)
    env = dict(os.environ, DSV41_AOT_PREBUILT=str(d), DSV41_AOT_ARCH="gfx950")
    code, out, _ = run_cli("doctor", check=False, env=env)
    assert "only for vLLM 0.34.0" in out and "not gfx950" not in out, out
    build = next(c for c in e.value.fix.split(" or build vLLM 0.33.0's: ")[1].split(" && ") if " build " in c)
    code, out, err = run_cli(*shlex.split(build)[1:], "--list", check=False)
    assert code == 0, err  # a release and arch this dsv41-aot builds


def test_a_foreign_room_whose_records_cannot_be_read_is_said(smoke_dir, tmp_path):
    """A foreign room whose libs.json cannot be read stops all collection of
    unnamed objects and bands in its arch (what it names is unknown):
    verify says so instead of doing it silently."""
    d = copy_of(smoke_dir, tmp_path / "p")
    arch = d / "gfx950"
    (arch / "vllm-0.32.0").rename(arch / "vllm-0.34.0")
    (arch / "vllm-0.34.0" / "libs.json").write_text("{")
    code, out, err = run_cli("verify", "--dir", d, check=False)
    assert "some room's records cannot be read" in err and str(arch) in err, err


@pytest.mark.faults
def test_a_room_relinked_under_a_running_process_says_restart(tmp_path):
    """P5 of the fault report at 24a0152: a band this process's record names
    is gone because the room was relinked since it read it. The fix used to
    be link (which found everything up to date); it is now a restart."""
    import dataclasses
    import lzma
    import os

    from _smoke import deployment

    from dsv41_aot.errors import IntegrityError
    from dsv41_aot.linkrecord import LinkRecord, band_file

    root = Path(shutil.copytree(deployment("gfx942-tp4"), tmp_path / "prebuilt"))
    running = Room(root, "gfx942", "0.33.0")
    old = running.links().bands[0]  # what the running process read
    # another process relinks the room: the band gets other bytes and so a new name, libs.json names it
    data = lzma.compress(running.read_band(old), format=lzma.FORMAT_XZ, preset=0)
    sha = hashlib.sha256(data).hexdigest()
    new = dataclasses.replace(old, file=band_file(old.chunk, sha), sha256=sha, bytes=len(data))
    (running.lib / new.file).write_bytes(data)
    os.unlink(running.lib / old.file)
    Room(root, "gfx942", "0.33.0").write_links(LinkRecord.of("gfx942", "0.33.0", [new, *running.links().bands[1:]]))
    with pytest.raises(IntegrityError) as e:
        running.read_band(old)
    assert "was relinked after this process read it" in e.value.message and e.value.fix.startswith("restart")
    assert Room(root, "gfx942", "0.33.0").read_band(new)  # a new process serves the new band
    # a band that is simply missing is still the room's own problem (a copied wheel's room: copied again)
    (running.lib / new.file).unlink()
    with pytest.raises(IntegrityError) as e:
        Room(root, "gfx942", "0.33.0").read_band(new)
    assert e.value.message.endswith("is missing") and e.value.fix.startswith(f"copy {root} again")


def test_an_unreadable_proof_is_proven_again_where_built_and_restored_where_shipped(smoke_dir, tmp_path):
    """An unreadable verified.json's fix: where the room was built, the JIT proof that writes it again; in a
    copy without objects/ (shipped), where nothing proves it, restoring the copy."""
    from dsv41_aot.errors import ManifestError

    for shipped in (False, True):
        d = copy_of(smoke_dir, tmp_path / f"p{int(shipped)}")
        if shipped:
            shutil.rmtree(d / "gfx950" / "objects")
        room = Room(d, "gfx950", "0.33.0")
        room.verified_path.write_text("{not json")
        with pytest.raises(ManifestError) as e:
            room.proof()
        assert e.value.fix == (room.fix_restore if shipped else room.prove_cmd), e.value.fix
        assert ("--against-jit --record" in e.value.fix) is not shipped


def test_the_default_prebuilt_dir_is_the_checkouts_kernels_prebuilt(monkeypatch, tmp_path):
    """Every command's and the loader's default folder: $DSV41_AOT_PREBUILT,
    else the installed package's kernels_prebuilt/ (a wheel's), else, in a
    checkout (which has none), the repository's kernels_prebuilt/."""
    from dsv41_aot import manifest

    monkeypatch.delenv(manifest.ENV_PREBUILT, raising=False)
    assert not manifest.PACKAGED.is_dir()  # a checkout: the wheel's folder is not here
    assert manifest.prebuilt_dir() == REPO / "kernels_prebuilt"
    monkeypatch.setenv(manifest.ENV_PREBUILT, str(tmp_path / "elsewhere" / ".." / "here"))
    assert manifest.prebuilt_dir() == tmp_path / "here"
