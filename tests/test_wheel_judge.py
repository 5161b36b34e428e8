"""The wheel's one judge, on variants of one real wheel: each gate's exit code and the member or key it names.

The wheel is built once (``ci/release.py build-wheel``, seconds) from one
band of the shared gfx942 TP4 deployment, which is sound and every key of
it proven. Each test rewrites it with zipfile, recomputing RECORD where the
case is not RECORD's, and runs the gates a user and the release run
(``dsv41-aot verify --wheel``, ``ci/check_wheel.py``) in this process: no
compile, no JIT, well under a second or two each. One slow test proves a key
of a damaged wheel against vLLM's JIT, to see the wheel judged as a whole too.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import warnings
import zipfile
from pathlib import Path

import pytest
from _smoke import REPO, build_wheel, deployment, forge_library, install_into, replace_code_object
from _smoke import cli as cli_process

from ci import check_wheel
from ci import prebuilt as gate
from dsv41_aot import cli
from dsv41_aot.aot.wheel import FIX, FIX_DOWNLOAD, FIX_PROVE
from dsv41_aot.keys import BuildKey
from dsv41_aot.linkrecord import soname
from dsv41_aot.manifest import folder_name, room_name
from dsv41_aot.room import Room

ARCH, RELEASE = "gfx942", "0.33.0"
PKG = "dsv41_aot/kernels_prebuilt/"
ROOM = f"{PKG}{ARCH}/{folder_name(RELEASE)}/"


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory) -> Path:
    """The shared gfx942 TP4 deployment cut to its smallest band and that band's keys, proofs and all (the
    wheel's ``--prebuilt``): a sound, proven room whose judging costs a tenth of the whole one's."""
    d = Path(shutil.copytree(deployment("gfx942-tp4"), tmp_path_factory.mktemp("judge") / "prebuilt"))
    room = d / ARCH / folder_name(RELEASE)
    libs = json.loads((room / "libs.json").read_text())
    keep = min(libs["libraries"], key=lambda lib: lib["raw_bytes"])
    for lib in libs["libraries"]:
        if lib is not keep:
            (d / ARCH / "lib" / lib["file"]).unlink()
    libs["libraries"] = [keep]
    (room / "libs.json").write_text(json.dumps(libs))
    for name, field in (("manifest.json", "entries"), ("verified.json", "keys")):
        doc = json.loads((room / name).read_text())
        doc[field] = {k: v for k, v in doc[field].items() if k in keep["entries"]}
        (room / name).write_text(json.dumps(doc))
    (room / "timings.json").unlink()
    return d


@pytest.fixture(scope="module")
def wheel(prebuilt, tmp_path_factory) -> Path:
    return build_wheel(prebuilt, tmp_path_factory.mktemp("wheelhouse"))


def _variant(wheel: Path, dest: Path, change=None, extra=(), drop=(), record: bool = True) -> Path:
    """A copy of ``wheel`` under its own name in ``dest``.

    Each member's bytes go through ``change(name, data)``, the members in
    ``drop`` are left out, the ``extra`` (name, bytes) pairs added (a name
    given twice is in the wheel twice); RECORD is recomputed from what the
    copy holds unless ``record`` is False (then it is the wheel's own)."""
    dest.mkdir()
    out = dest / wheel.name
    rows, record_name = [], None
    with zipfile.ZipFile(wheel) as z, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as w, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile's "Duplicate name"
        members = [(i.filename, z.read(i)) for i in z.infolist() if i.filename not in drop]
        for name, data in members + list(extra):
            data = change(name, data) if change else data
            if name.endswith(".dist-info/RECORD"):
                record_name = name
                if not record:
                    w.writestr(name, data)
                continue
            w.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{name},sha256={digest},{len(data)}")
        if record:
            w.writestr(record_name, "\n".join(rows + [f"{record_name},,"]) + "\n")
    return out


def _proofs(change):
    """A ``change`` for :func:`_variant`: the room's verified.json document through ``change(doc)``."""
    def rewrite(name, data):
        if name != ROOM + "verified.json":
            return data
        doc = json.loads(data)
        change(doc)
        return json.dumps(doc, indent=1, sort_keys=True).encode()
    return rewrite


def _gate(capsys, main, *argv) -> tuple[int, str]:
    """(exit code, stdout + stderr) of a gate's ``main`` run on ``argv`` in this process; check_wheel's output is
    held to its streams on the way (``_check_wheel_streams``)."""
    capsys.readouterr()
    argv = [str(a) for a in argv]
    code = main(argv)
    got = capsys.readouterr()
    if main is check_wheel.main:
        _check_wheel_streams(argv, got.out)
    return code, got.out + got.err


# check_wheel's verdict line for a wheel, the one line of its stdout without --json or an audit option
VERDICT_LINE = re.compile(r"\S+\.whl: \d+ bytes, .+: (ok|FAILED)")


def _check_wheel_streams(argv: list, out: str) -> None:
    """check_wheel's stdout is what a script reads: never an error, and when it judges wheels without --json, one
    verdict line per wheel; the problems, the unproven keys and the fix go to stderr."""
    assert not any(line.startswith("ci/check_wheel.py: error:") for line in out.splitlines()), out
    if not {"--json", "--audit-only", "--audit-prebuilt"} & set(argv):
        assert all(VERDICT_LINE.fullmatch(line) for line in out.splitlines()), out


def _verify(capsys, *argv):
    return _gate(capsys, cli.main, "verify", *argv)


def _verify_json(capsys, *argv) -> tuple[int, dict]:
    """(exit code, report) of ``dsv41-aot verify ARGV --json`` run in this process: the one document on stdout."""
    capsys.readouterr()
    code = cli.main(["verify", *map(str, argv), "--json"])
    return code, json.loads(capsys.readouterr().out)


def _check(capsys, *argv):
    return _gate(capsys, check_wheel.main, "--no-auditwheel", *argv)


def _keys(prebuilt: Path) -> list[str]:
    """The keys of the cut room, sorted."""
    return sorted(json.loads((prebuilt / ARCH / folder_name(RELEASE) / "manifest.json").read_text())["entries"])


def test_the_wheel_is_sound_and_proven(wheel, prebuilt, capsys):
    """The base every variant below changes one thing of. Its report counts
    the room's proofs and names the FlyDSL they were made under."""
    code, out = _verify(capsys, "--wheel", wheel)
    n = len(_keys(prebuilt))
    assert code == 0 and re.search(rf"{n} keys, {n} proven against vLLM's JIT; proven under FlyDSL \S+: {n}\n", out), out
    code, out = _check(capsys, "--require-proofs", "--prebuilt", prebuilt, wheel)
    # check_wheel.py's one line per wheel: its size and what it holds, room by room
    assert code == 0 and f"{wheel.name}: {wheel.stat().st_size} bytes, {n} keys of {room_name(ARCH, RELEASE)}: ok\n" \
        in out, out
    code, doc = _verify_json(capsys, "--wheel", wheel)
    assert code == 0 and doc["arches"] == [ARCH] and doc["fix"] is None
    assert [doc["name"].replace("-", "_"), doc["version"]] == wheel.name.split("-")[:2], doc  # METADATA, as named
    with zipfile.ZipFile(wheel) as z:  # what pip unpacks of the kernels, and what it downloads of them
        sizes = [(i.file_size, i.compress_size) for i in z.infolist() if i.filename.startswith(PKG)]
    assert (doc["kernel_bytes"], doc["kernel_compressed_bytes"]) == tuple(map(sum, zip(*sizes))), doc
    assert "fix:" not in out, out
    code, out = _verify(capsys, "--dir", prebuilt)  # the folder it was built from: its proofs, one line a room
    said = f"proofs {ARCH} vLLM {RELEASE}: {n} of {n} keys carry a proof against vLLM's JIT"
    assert code == 0 and any(line.startswith(said) for line in out.splitlines()), out


@pytest.mark.faults
def test_a_wheel_without_verified_json_says_so_and_every_key_is_unproven(wheel, prebuilt, tmp_path, capsys):
    bad = _variant(wheel, tmp_path / "bad", drop=(f"{ROOM}verified.json",))
    code, out = _verify(capsys, "--wheel", bad)
    n = len(_keys(prebuilt))
    assert code == 1 and f"{n} keys, 0 proven against vLLM's JIT (no verified.json)\n" in out, out
    assert f"unproven: {n} key(s)" in out, out


@pytest.mark.faults
def test_a_file_cut_short_is_no_wheel_and_exits_2_naming_it(wheel, tmp_path, capsys):
    """A download cut short: every gate names the file and says to fetch it again."""
    cut = tmp_path / wheel.name
    cut.write_bytes(wheel.read_bytes()[: wheel.stat().st_size // 2])
    for code, out in (_verify(capsys, "--wheel", cut), _check(capsys, cut)):
        assert code == 2 and f"{cut}: not a wheel: not a sound zip file (BadZipFile: " in out, out
        assert "download the wheel again" in out and "Traceback" not in out, out


@pytest.mark.faults
def test_a_member_whose_bytes_fail_their_crc_is_no_wheel_and_exits_2_naming_it(tmp_path, capsys):
    """A zip whose directory reads but one stored member's bytes changed in
    transit: every gate names the member and says to fetch the wheel again."""
    bad = tmp_path / "dsv41_aot-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(bad, "w", zipfile.ZIP_STORED) as z:
        z.writestr("dsv41_aot/__init__.py", b"# the package's bytes\n")
    bad.write_bytes(bad.read_bytes().replace(b"package's bytes", b"package's bytez", 1))
    for code, out in (_verify(capsys, "--wheel", bad), _check(capsys, bad)):
        assert code == 2 and f"{bad}: not a wheel: not a sound zip file (member dsv41_aot/__init__.py: its CRC " \
            "does not match its bytes)" in out, out
        assert "download the wheel again" in out and "Traceback" not in out, out


@pytest.mark.faults
@pytest.mark.parametrize("damage, why", [(b"\xff", "error: Error -3 while decompressing data: invalid block type"),
                                         (b"PK\x03\x05", "BadZipFile: Bad magic number for file header")])
def test_a_member_that_does_not_inflate_is_no_wheel_and_exits_2_naming_it(tmp_path, capsys, damage, why):
    """A deflated member whose stream is damaged (zlib fails before any CRC is
    known), or whose local header is: every gate names the member and why."""
    bad = tmp_path / "dsv41_aot-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(bad, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("dsv41_aot/__init__.py", b"# the package's bytes\n" * 20)
        info = z.getinfo("dsv41_aot/__init__.py")
    data = bad.read_bytes()
    at = info.header_offset + (30 + len(info.filename) if damage == b"\xff" else 0)
    bad.write_bytes(data[:at] + damage + data[at + len(damage):])
    for code, out in (_verify(capsys, "--wheel", bad), _check(capsys, bad)):
        assert code == 2 and f"{bad}: not a wheel: not a sound zip file (member dsv41_aot/__init__.py: {why})" \
            in out, out
        assert "download the wheel again" in out and "Traceback" not in out, out


@pytest.mark.faults
def test_metadata_with_a_byte_that_is_not_utf8_is_still_judged(wheel, tmp_path, capsys):
    """METADATA is read with undecodable bytes replaced: a stray byte in its
    summary (RECORD updated) leaves the name, version and requirements read
    and the wheel judged, never a traceback."""
    def change(name: str, data: bytes) -> bytes:
        return data.replace(b"\nSummary: ", b"\nSummary: \xff") if name.endswith(".dist-info/METADATA") else data

    odd = _variant(wheel, tmp_path / "odd", change)
    code, out = _verify(capsys, "--wheel", odd)
    assert code == 0 and f"{wheel.name}: dsv41-aot " in out, out


# ---------------------------------------------------------------- RECORD and the zip, as pip judges them


@pytest.mark.faults
def test_a_member_edited_to_the_same_size_differs_from_its_record_line(wheel, tmp_path, capsys):
    """S10: RECORD's sha256 is compared, not only the size."""
    member = "dsv41_aot/runtime/bands.py"
    bad = _variant(wheel, tmp_path / "bad", lambda n, d: d.replace(b"import", b"imp0rt", 1) if n == member else d,
                   record=False)
    for code, out in (_verify(capsys, "--wheel", bad), _check(capsys, bad)):
        assert code == 1 and f"{member} differs from its" in out, out


@pytest.mark.slow
def test_a_wheel_proven_against_the_jit_is_judged_as_a_whole_too(wheel, tmp_path, capsys):
    """``verify --wheel --against-jit`` proves the keys it picks from a
    scratch copy of the kernels and judges the wheel itself as well: a
    member that differs from its RECORD line fails the run though the
    proven key is sound (its JIT build: tests/test_shipped_proof.py's, in
    the session's build cache when that ran first; else about 5 s). The
    wheel also holds directory entries, as ``zip -r`` writes them: the
    scratch copy makes folders of them."""
    member, key = "dsv41_aot/runtime/bands.py", "k1@gfx942:s=42,tp=4,r=0"
    folders = [(f"{PKG}", b""), (f"{PKG}{ARCH}/", b""), (ROOM, b"")]
    bad = _variant(wheel, tmp_path / "bad", lambda n, d: d.replace(b"import", b"imp0rt", 1) if n == member else d,
                   extra=folders, record=False)
    code, report = _verify_json(capsys, "--wheel", bad, "--against-jit", "--key", key, "--no-progress")
    assert code == 1 and report["jit_checked"] == 1, report
    assert [r["key"] for r in report["reports"] if r["ok"] and "jit" in r["checks"]] == [key]
    # a wheel's room has no objects/: the key's code object was read from its band, and its report says so
    assert [r["key"] for r in report["reports"] if "band" in r["checks"]] == [key], report["reports"]
    (whole,) = [f for f in report["failures"] if f["what"] == "wheel"]
    assert f"{member} differs from its" in whole["error"] and whole["file"] == str(bad), whole
    # the wheel's own: no key or release, and it keeps the wheel from serving
    assert (whole["key"], whole["release"], whole["serving"]) == (None, None, True), whole


@pytest.mark.faults
def test_a_member_record_lists_and_the_wheel_lacks_is_named(wheel, tmp_path, capsys):
    """S11: a file RECORD lists but the wheel does not hold. Like every wheel that fails its judge, it is
    downloaded again or rebuilt: each gate prints that fix."""
    member = "dsv41_aot/cli/doctor.py"
    bad = _variant(wheel, tmp_path / "bad", drop=(member,), record=False)
    for code, out in (_verify(capsys, "--wheel", bad), _check(capsys, bad)):
        assert code == 1 and f"{member} is listed in" in out and "but not in the wheel" in out, out
        assert f"fix: {FIX_DOWNLOAD}" in out, out
    code, doc = _verify_json(capsys, "--wheel", bad)
    assert code == 1 and doc["fix"] == FIX_DOWNLOAD and {f["fix"] for f in doc["failures"]} == {FIX_DOWNLOAD}, doc


def test_a_kernels_wheel_tag_on_a_wheel_without_kernels_fails(wheel, tmp_path, capsys):
    """The plain wheel (runtime and build commands, no kernels) is py3-none-any: a wheel without kernels that
    claims the kernels wheel's platform tag fails, with the fix."""
    with zipfile.ZipFile(wheel) as z:
        kernels = [n for n in z.namelist() if n.startswith(PKG)]
    bad = _variant(wheel, tmp_path / "bad", drop=kernels)
    for code, out in (_verify(capsys, "--wheel", bad), _check(capsys, bad)):
        assert code == 1 and "a wheel without kernels tagged ['py3-none-manylinux_2_28_x86_64'], expected " \
                              "py3-none-any" in out and f"fix: {FIX_DOWNLOAD}" in out, out
    assert f"{bad.name}: {bad.stat().st_size} bytes, no kernels: FAILED\n" in out, out


def test_a_wheel_whose_room_cannot_be_read_says_so_in_its_summary(wheel, tmp_path, capsys):
    """check_wheel.py's one line per wheel counts keys room by room; a wheel whose only room's manifest is not JSON
    holds kernels but no room to count them in, and says that rather than "no kernels"."""
    bad = _variant(wheel, tmp_path / "bad", change=lambda name, data: b"{" if name == ROOM + "manifest.json" else data)
    code, out = _check(capsys, bad)
    assert code == 1 and f"{bad.name}: {bad.stat().st_size} bytes, no readable room: FAILED\n" in out, out
    assert f"{ROOM}manifest.json" in out and f"fix: {FIX_DOWNLOAD}" in out, out


def test_timings_in_the_wheel_are_named(wheel, tmp_path, capsys):
    """timings.json is what compiles took on the build machine: never shipped, whatever it holds."""
    member = ROOM + "timings.json"
    bad = _variant(wheel, tmp_path / "bad", extra=[(member, b"{}\n")])
    for code, out in (_verify(capsys, "--wheel", bad), _check(capsys, bad)):
        assert code == 1 and f"timings in the wheel (measured, never shipped): {member}" in out, out


@pytest.mark.parametrize("member", [f"{PKG}{ARCH}/stray.txt", f"{PKG}stray.txt"], ids=["arch folder", "kernels folder"])
def test_a_stray_file_in_an_arch_folder_is_named(wheel, tmp_path, capsys, member):
    """A file no room names, beside the arch's lib/ or beside the arch folders (RECORD lists it): the verdict on the
    folder that holds it names it by its path in the wheel."""
    bad = _variant(wheel, tmp_path / "bad", extra=[(member, b"left by a build\n")])
    for code, out in (_verify(capsys, "--wheel", bad), _check(capsys, bad)):
        assert code == 1 and f"{member} is a file no room names" in out, out


def test_check_wheel_json_is_one_verdict_per_wheel_and_names_its_failures(wheel, prebuilt, tmp_path, capsys):
    """check_wheel.py --json: a list of each wheel's verdict, in the order given, each counting its keys room by
    room; exit 1 when any failed."""
    bad = _variant(wheel, tmp_path / "bad", extra=[(ROOM + "timings.json", b"{}\n")])
    code, out = _check(capsys, "--json", wheel, bad)
    good, judged = json.loads(out)
    assert code == 1 and (good["wheel"], good["failed"], good["fix"]) == (wheel.name, False, None), out
    assert list(good["keys_by_room"].values()) == [len(_keys(prebuilt))], good["keys_by_room"]
    assert good["vllm"] == [RELEASE], good  # the releases it serves, under the range its vllm extra admits
    assert good["vllm_extra"] == gate.vllm_extra((REPO / "pyproject.toml").read_text()), good
    (room,) = good["rooms"]  # its keys per TP, each counted once, every one proven, its verified.json there
    assert room["verified_json"] is True, room
    tps = room["tp"].values()
    assert sum(t["keys"] for t in tps) == sum(sum(t["kinds"].values()) for t in tps) == room["keys"], room
    assert sum(t["proven"] for t in tps) == room["proven"] == room["keys"], room
    steps: dict = {}  # each TP's step widths: the range its verdict names
    for k in (BuildKey.parse(key, RELEASE) for key in _keys(prebuilt)):
        steps.setdefault(str(k.tp), []).append(k.tokens)
    assert {tp: t["tokens"] for tp, t in room["tp"].items()} == {tp: [min(s), max(s)] for tp, s in steps.items()}
    assert any(min(s) < max(s) for s in steps.values()), steps  # a range, not one width
    assert judged["failed"] and judged["fix"] == FIX_DOWNLOAD, out
    assert any("timings in the wheel" in p for p in judged["problems"]), out
    code, out = _check(capsys, "--json", wheel)
    assert code == 0 and [r["failed"] for r in json.loads(out)] == [False], out


def test_check_wheel_json_lists_what_auditwheel_found_outside_the_wheel(wheel, capsys):
    """With auditwheel (cibuildwheel's repair check), a verdict lists the libraries its bands need from outside
    the wheel besides the host's HIP: none for a sound wheel."""
    code, out = _gate(capsys, check_wheel.main, "--json", wheel)
    (r,) = json.loads(out)
    assert code == 0 and r["auditwheel_external"] == [] and not r["failed"], r


def test_check_wheel_without_a_wheel_is_bad_input(tmp_path, capsys):
    code, out = _check(capsys, tmp_path / "absent.whl")
    assert code == 2 and f"ci/check_wheel.py: error: no wheel at {tmp_path / 'absent.whl'}" in out, out
    with pytest.raises(SystemExit) as e:
        check_wheel.main(["--no-auditwheel"])
    assert e.value.code == 2 and capsys.readouterr().err.endswith(": error: name a wheel (or --audit-prebuilt DIR)\n")


def test_a_wheel_that_is_no_zip_is_an_error_on_stderr_and_nothing_on_stdout(tmp_path, capsys):
    """Bad input is said on stderr: stdout, which --json fills with verdicts, stays empty for a script to parse."""
    bad = tmp_path / "dsv41_aot-0.1.0-py3-none-manylinux_2_28_x86_64.whl"
    bad.write_bytes(b"not a zip file")
    capsys.readouterr()
    code = check_wheel.main(["--no-auditwheel", "--json", str(bad)])
    got = capsys.readouterr()
    assert code == 2 and got.out == "", got
    assert got.err.startswith(f"ci/check_wheel.py: error: {bad}: not a wheel: not a sound zip file"), got.err


def test_check_wheel_help_says_what_each_option_does(capsys):
    """The gate's --help names each option with its argument and says what it does."""
    with pytest.raises(SystemExit) as e:
        check_wheel.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0 and text.startswith("usage: "), text
    for option, says in (("--prebuilt PREBUILT", "the prebuilt dir the wheel was built from"),
                         ("--require-proofs", "fail unless every key is proven against vLLM's JIT"),
                         ("--audit-only", "only auditwheel on the raw libraries"),
                         ("--audit-prebuilt DIR", "auditwheel on the raw libraries of DIR's bands")):
        assert f" {option} {says} " in text, (option, text)


def test_audit_of_a_folder_without_bands_is_bad_input(tmp_path, capsys):
    code, out = _gate(capsys, check_wheel.main, "--audit-prebuilt", tmp_path)
    assert code == 2 and f"no linked bands under {tmp_path}" in out, out


def test_auditwheel_of_a_band_that_cannot_be_read_names_it_with_its_fix(prebuilt, wheel, tmp_path, capsys):
    """cibuildwheel's repair step and the prebuilt dir's audit never skip a band they cannot read: the wheel's
    is named with the wheel's rebuild, the prebuilt dir's with its room's own fix."""
    band = next((prebuilt / ARCH / "lib").glob("*.so.xz"))
    other = Path(shutil.copytree(prebuilt, tmp_path / "prebuilt"))
    (other / ARCH / "lib" / band.name).unlink()
    code, out = _gate(capsys, check_wheel.main, "--audit-prebuilt", other)
    fix = Room(other, ARCH, RELEASE).fix_relink
    assert code == 1 and f"{other / ARCH / 'lib' / band.name} is missing\n  fix: {fix}" in out, out
    bad = _variant(wheel, tmp_path / "wheel", drop=(f"{PKG}{ARCH}/lib/{band.name}",))
    code, out = _gate(capsys, check_wheel.main, "--audit-only", bad)
    assert code == 1 and f"{band.name} named by {ARCH}/{folder_name(RELEASE)}/libs.json is not in the wheel" in out
    assert f"fix: {FIX}" in out, out


@pytest.mark.faults
def test_a_member_in_the_wheel_twice_is_named(wheel, tmp_path, capsys):
    """S13: the same name twice (which copy installs depends on the installer)."""
    member = ROOM + "manifest.json"
    with zipfile.ZipFile(wheel) as z:
        data = z.read(member)
    bad = _variant(wheel, tmp_path / "bad", extra=[(member, data)])
    for code, out in (_verify(capsys, "--wheel", bad), _check(capsys, bad)):
        assert code == 1 and f"member {member!r} is in the wheel twice" in out, out
        assert f"fix: {FIX_DOWNLOAD}" in out, out


@pytest.mark.faults
@pytest.mark.parametrize("member", ["/etc/dsv41.txt", "dsv41_aot/../../escape.txt"], ids=["absolute", "dot-dot"])
def test_a_member_that_would_install_outside_the_tree_is_named(wheel, tmp_path, capsys, member):
    """A member pip would refuse (an absolute name, a `..` step): named, with the fix, by both gates."""
    bad = _variant(wheel, tmp_path / "bad", extra=[(member, b"x\n")])
    for code, out in (_verify(capsys, "--wheel", bad), _check(capsys, bad)):
        assert code == 1 and f"member {member!r} is absolute or takes a `..` step" in out, out
        assert f"fix: {FIX_DOWNLOAD}" in out, out


def _metadata(change):
    """A ``change`` for :func:`_variant`: the wheel's METADATA text through ``change(text)``."""
    return lambda name, data: change(data.decode()).encode() if name.endswith(".dist-info/METADATA") else data


def _served_release_unnamed(text: str) -> str:
    head, _, readme = text.partition("\n\n")
    return head + "\n\n" + readme.replace(f"vLLM {RELEASE}", "vLLM x.y.z")


def _no_vllm_extra(text: str) -> str:
    lines = text.split("\n")
    return "\n".join(ln for ln in lines if ln != "Provides-Extra: vllm" and not ln.startswith("Requires-Dist: vllm"))


# each: what is changed, how, and what both gates must print
METADATA_DEFECTS = {
    "a local version": (lambda t: re.sub(r"(?m)^Version: (.*)$", r"Version: \1+local", t),
                        ["local version label in ", "+local: an index refuses it", "is not dsv41_aot-"]),
    "no vllm extra": (_no_vllm_extra, ["no vllm extra: a kernels wheel must say which vLLM releases it serves"]),
    "an extra that does not admit a served release": (
        lambda t: re.sub(r"(?m)^Requires-Dist: vllm[^;]*;", "Requires-Dist: vllm<0.1;", t),
        [f"the vllm extra (vllm<0.1) does not admit vLLM {RELEASE}, which the wheel serves"]),
    "a README that does not name a served release": (
        _served_release_unnamed, [f"the README (long description) does not name vLLM {RELEASE}"]),
}


@pytest.mark.faults
@pytest.mark.parametrize("case", list(METADATA_DEFECTS))
def test_a_metadata_defect_is_named_by_both_gates(wheel, tmp_path, capsys, case):
    """What METADATA must say of a kernels wheel (a version an index takes and the file is named by, a vllm
    extra admitting, and a README naming, each release served): each defect named, with the fix."""
    change, said = METADATA_DEFECTS[case]
    bad = _variant(wheel, tmp_path / "bad", change=_metadata(change))
    for code, out in (_verify(capsys, "--wheel", bad), _check(capsys, bad)):
        assert code == 1 and all(s in out for s in said) and f"fix: {FIX_DOWNLOAD}" in out, out


@pytest.mark.faults
@pytest.mark.parametrize("member", ["LICENSE", "NOTICE"])
def test_a_licence_file_missing_from_dist_info_is_named(wheel, tmp_path, capsys, member):
    with zipfile.ZipFile(wheel) as z:
        (gone,) = [n for n in z.namelist() if ".dist-info/" in n and n.endswith(f"/{member}")]
    bad = _variant(wheel, tmp_path / "bad", drop=[gone])
    for code, out in (_verify(capsys, "--wheel", bad), _check(capsys, bad)):
        assert code == 1 and f"{member} missing from {gone.split('/')[0]}" in out, out


@pytest.mark.parametrize("name", ["libstray.so", "libstray.so.1"])
def test_a_raw_shared_library_in_the_wheel_is_named(wheel, tmp_path, capsys, name):
    """Bands ship compressed (.so.xz); a plain .so anywhere in the wheel is named, a versioned one too."""
    member = f"{PKG}{ARCH}/lib/{name}"
    bad = _variant(wheel, tmp_path / "bad", extra=[(member, b"\x7fELF")])
    for code, out in (_verify(capsys, "--wheel", bad), _check(capsys, bad)):
        assert code == 1 and f"raw shared libraries in the wheel: {member}" in out, out


@pytest.mark.faults
def test_a_wheel_whose_rooms_are_not_its_prebuilt_dir_s_is_named(wheel, prebuilt, tmp_path, capsys):
    """--prebuilt naming a dir that holds another room than the wheel: the rooms are named before any file."""
    other = Path(shutil.copytree(prebuilt, tmp_path / "other"))
    (other / ARCH / folder_name(RELEASE)).rename(other / ARCH / folder_name("0.32.0"))
    code, out = _check(capsys, "--prebuilt", other, wheel)
    assert code == 1 and f"the wheel holds rooms [('{ARCH}', '{RELEASE}')], the prebuilt dir {other} " \
                          f"[('{ARCH}', '0.32.0')]" in out, out


@pytest.mark.faults
def test_two_dist_info_folders_are_not_a_wheel(wheel, tmp_path, capsys):
    """S25: pip refuses a wheel with two .dist-info folders; no gate picks one."""
    with zipfile.ZipFile(wheel) as z:
        info = next(n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/WHEEL"))
        other = [(n.replace(info, "dsv41_aot-0.0.9.dist-info"), z.read(n)) for n in z.namelist()
                 if n.startswith(info + "/") and not n.endswith("RECORD")]
    bad = _variant(wheel, tmp_path / "bad", extra=other)
    for code, out in (_verify(capsys, "--wheel", bad), _check(capsys, bad)):
        assert code == 2 and "not a wheel" in out and info in out and "dsv41_aot-0.0.9.dist-info" in out, out


# ---------------------------------------------------------------- proofs: a sound wheel whose keys are not all proven


@pytest.mark.faults
@pytest.mark.parametrize("how", ["no proof", "no evidence", "another code object"])
def test_a_sound_wheel_with_an_unproven_key_fails_naming_it(wheel, prebuilt, tmp_path, capsys, how):
    """S14, S16, S23: a key without a proof, whose proof carries no JIT-only
    evidence, or whose proof names another code object fails ``verify
    --wheel`` and ``check_wheel.py --require-proofs``, each saying which;
    without --require-proofs the script passes it."""
    key = _keys(prebuilt)[0]

    def unprove(doc):
        if how == "no proof":
            del doc["keys"][key]
        elif how == "no evidence":  # a proof copied without what only a JIT run produces
            doc["keys"][key]["evidence"] = None
        else:  # a proof of some other build of the key
            doc["keys"][key]["code_object_sha256"] = "ab" * 32

    bad = _variant(wheel, tmp_path / "bad", _proofs(unprove))
    want = f"{key} (vLLM {RELEASE})" + {"no proof": "", "no evidence": ": its proof carries no JIT-only evidence",
                                         "another code object": ": its proof names another code object"}[how]
    code, doc = _verify_json(capsys, "--wheel", bad)
    assert code == 1 and doc["problems"] == [] and doc["unproven"] == [want], doc
    assert doc["fix"] == FIX_PROVE and doc["failures"][0]["fix"] == FIX_PROVE, doc
    code, out = _verify(capsys, "--wheel", bad)
    assert code == 1 and f"unproven: 1 key(s), e.g. {want}" in out and "29 proven" in out, out
    assert f"fix: {FIX_PROVE}" in out, out
    code, out = _check(capsys, "--require-proofs", bad)
    assert code == 1 and want in out and f"fix: {FIX_PROVE}" in out, out
    code, out = _check(capsys, bad)
    assert code == 0 and "fix:" not in out, out


# ---------------------------------------------------------------- the release's checks: --prebuilt, auditwheel


@pytest.mark.faults
def test_a_wheel_that_differs_from_its_prebuilt_dir_byte_for_byte_is_named(wheel, prebuilt, tmp_path, capsys):
    """S15: the same files, one of them with other bytes of the same size."""
    other = Path(shutil.copytree(prebuilt, tmp_path / "other"))
    path = other / ARCH / folder_name(RELEASE) / "verified.json"
    path.write_bytes(path.read_bytes().replace(b'"version": 2', b'"version":  2', 1).replace(b"\n}", b"}", 1))
    code, out = _check(capsys, "--prebuilt", other, wheel)
    assert code == 1 and f"{ROOM}verified.json differs from {path}" in out, out


EXTERNAL = ["libdsv41_ext.so.1", "libdsv41_ext2.so.1"]  # what _needs_external_library's band needs, in order


def _needs_external_library(prebuilt: Path, dest: Path) -> Path:
    """A copy of ``prebuilt`` whose one band's library needs two libraries the host lacks, EXTERNAL (linked by cc
    for the case, with the band's own SONAME and libs.json digests)."""
    other = Path(shutil.copytree(prebuilt, dest / "other"))
    path = other / ARCH / folder_name(RELEASE) / "libs.json"
    doc = json.loads(path.read_text())
    doc["libraries"] = doc["libraries"][:1]  # one band: auditwheel on one small library
    band = doc["libraries"][0]
    exts, so = [dest / name.rsplit(".", 1)[0] for name in EXTERNAL], dest / "band.so"
    for out, soname_, needs in (*((ext, name, []) for ext, name in zip(exts, EXTERNAL)),
                                (so, soname(band["chunk"], band["entries"]), exts)):
        r = subprocess.run(["cc", "-shared", "-nostdlib", "-o", out, f"-Wl,-soname,{soname_}", "-Wl,--no-as-needed",
                            *needs, "-x", "c", "-"], input="int dsv41_case;\n", capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    forge_library(other, ARCH, path, doc, band, so.read_bytes())
    return other


@pytest.mark.faults
def test_auditwheel_refuses_a_band_that_needs_an_external_library(prebuilt, tmp_path, capsys):
    """S17: only the host's libamdhip64 may be external to a band's library; verify, which runs no
    auditwheel, names the band's DT_NEEDED itself."""
    other = _needs_external_library(prebuilt, tmp_path)
    code, out = _gate(capsys, check_wheel.main, "--audit-prebuilt", other)
    assert code == 1 and f"external libraries besides libamdhip64: {', '.join(EXTERNAL)}\n" in out, out
    code, out = _verify(capsys, "--dir", other)
    assert code == 1 and f"records DT_NEEDED {EXTERNAL}: it would tie users to this build machine's " \
                          "libraries" in out, out


def test_no_auditwheel_judges_a_wheel_where_auditwheel_cannot_run(wheel, capsys, monkeypatch):
    """``--no-auditwheel`` runs no auditwheel: the wheel is judged on a machine without it. Without the flag, an
    auditwheel that cannot run fails the wheel, saying why."""
    def absent(libraries):
        raise RuntimeError("auditwheel show failed: auditwheel: not found")

    monkeypatch.setattr(check_wheel, "audit_raw", absent)
    code, out = _check(capsys, wheel)
    assert code == 0 and out.endswith(": ok\n"), out
    code, out = _gate(capsys, check_wheel.main, wheel)
    assert code == 1 and "auditwheel show failed: auditwheel: not found" in out, out


def test_an_auditwheel_that_fails_is_named_with_its_own_reason():
    """auditwheel says why it cannot read a wheel in its log, on stderr: that reason is the problem's text, not
    an empty "failed"."""
    ext, problems = check_wheel.audit_problems({"x/not-a-library.so": b"not an ELF file"})
    assert ext == [] and len(problems) == 1, problems
    assert problems[0].startswith("auditwheel show failed: ") and "does not look like a platform wheel" in problems[0]


@pytest.mark.faults
def test_the_repair_step_fails_when_any_of_its_wheels_needs_an_external_library(wheel, prebuilt, tmp_path, capsys):
    """cibuildwheel's repair step (``--audit-only``) over several wheels exits 1 when one fails, whichever it is."""
    other = _needs_external_library(prebuilt, tmp_path)  # its one band, in the wheel in place of the wheel's one
    libs = (other / ARCH / folder_name(RELEASE) / "libs.json").read_bytes()
    (band,) = (other / ARCH / "lib").iterdir()
    with zipfile.ZipFile(wheel) as z:
        old = [n for n in z.namelist() if n.startswith(f"{PKG}{ARCH}/lib/")]
    bad = _variant(wheel, tmp_path / "bad", change=lambda n, data: libs if n == ROOM + "libs.json" else data,
                   drop=old, extra=[(f"{PKG}{ARCH}/lib/{band.name}", band.read_bytes())])
    assert _gate(capsys, check_wheel.main, "--audit-only", wheel)[0] == 0
    for wheels in ((wheel, bad), (bad, wheel)):
        code, out = _gate(capsys, check_wheel.main, "--audit-only", *wheels)
        assert code == 1 and f"{bad.name}: auditwheel on 1 raw libraries: auditwheel: external libraries besides " \
                              f"libamdhip64: {', '.join(EXTERNAL)}" in out, out


# ---------------------------------------------------------------- a band's code, judged by every reader


@pytest.mark.faults
@pytest.mark.parametrize("symbol_too", [False, True], ids=["code object", "code object and symbol"])
def test_a_band_holding_another_keys_kernel_is_refused_by_every_reader(wheel, prebuilt, tmp_path, capsys,
                                                                       symbol_too):
    """Q1 (S8) of the fault report at 3f0364f: in K's band, K's GPU code object
    is swapped for another key's of the same size, every digest and the band's
    name updated. The launcher would ask HIP for K's kernel in it and not find
    it: verify (folder and wheel), check_wheel.py, the wheel gate and doctor
    all refuse it, naming K and its band, and verify serves every other key.
    With K's manifest entry naming the other key's kernel too, they refuse
    it as a kernel that is not K's own (``BuildKey.kernel_symbol``)."""
    key, other = "k1@gfx942:s=42,tp=4,r=2,i=1", "k1@gfx942:s=42,tp=4,r=1,i=1"  # code objects of one size
    d = Path(shutil.copytree(prebuilt, tmp_path / "swapped"))
    entries = Room(d, ARCH, RELEASE).manifest().entries
    band = replace_code_object(d, ARCH, RELEASE, key, lambda code, codes: codes[entries[other].code_object_sha256])
    said = f"not {entries[key].symbol}, the one its manifest names"
    if symbol_too:
        path = d / ARCH / folder_name(RELEASE) / "manifest.json"
        doc = json.loads(path.read_text())
        doc["entries"][key]["symbol"] = entries[other].symbol
        path.write_text(json.dumps(doc))
        said = f"as kernel {entries[other].symbol}, not its own {entries[key].symbol}"
    with zipfile.ZipFile(wheel) as z:
        kernels = [n for n in z.namelist() if n.startswith(PKG)]
    bad = _variant(wheel, tmp_path / "wheel", drop=kernels, extra=[
        (PKG + f.relative_to(d).as_posix(), f.read_bytes()) for f in sorted(d.rglob("*")) if f.is_file()])
    env = {k: v for k, v in os.environ.items() if k not in ("DSV41_AOT_MODE", "DSV41_AOT_DISABLE", "VLLM_PLUGINS")}
    doctor = cli_process("doctor", env=dict(env, DSV41_AOT_PREBUILT=str(d), DSV41_AOT_ARCH=ARCH))
    readers = {"verify --dir": _verify(capsys, "--dir", d), "verify --wheel": _verify(capsys, "--wheel", bad),
               "check_wheel.py": _check(capsys, "--require-proofs", bad), "ci/prebuilt.py": _gate(capsys, gate.main, d),
               "doctor": (doctor.returncode, doctor.stdout + doctor.stderr)}
    for reader, (code, out) in readers.items():
        assert code == 1 and said in out, (reader, out[-3000:])
        assert key in out and band.name in out and "Traceback" not in out, (reader, out[-3000:])
    _, doc = _verify_json(capsys, "--dir", d)
    assert {f["key"] for f in doc["failures"]} == {key} and doc["ok"] == doc["keys"] - 1


@pytest.mark.faults
def test_a_code_object_that_defines_no_kernel_is_refused_saying_so(prebuilt, tmp_path, capsys):
    """K's own code object with its kernel descriptors renamed (``.kd`` ->
    ``.kx``, every digest updated): it defines no kernel HIP could find."""
    key = _keys(prebuilt)[0]
    d = Path(shutil.copytree(prebuilt, tmp_path / "nokernel"))
    band = replace_code_object(d, ARCH, RELEASE, key, lambda code, codes: code.replace(b".kd\0", b".kx\0"))
    code, out = _verify(capsys, "--dir", d)
    symbol = Room(d, ARCH, RELEASE).manifest().entries[key].symbol
    assert code == 1 and f"{band.name} holds {key}'s GPU code object" in out, out
    assert f"defines kernel none, not {symbol}" in out, out


@pytest.mark.faults
def test_a_band_whose_name_is_not_its_content_hash_is_refused_naming_it(prebuilt, tmp_path, capsys):
    """Q1 of the fault report at 3f0364f: link names each band by its xz
    sha256; a band renamed (its record too) is refused, naming the file."""
    d = Path(shutil.copytree(prebuilt, tmp_path / "renamed"))
    room = Room(d, ARCH, RELEASE)
    (band,) = room.links().bands
    doc = json.loads(room.libs_path.read_text())
    name = doc["libraries"][0]["file"] = band.file.replace(band.sha256[:16], "0" * 16)
    room.libs_path.write_text(json.dumps(doc))
    (room.lib / band.file).rename(room.lib / name)
    code, report = _verify_json(capsys, "--dir", d)
    assert code == 1 and len(report["failures"]) == len(band.entries) + 1
    assert all(f"{name}: its name is not {band.file}" in f["error"] for f in report["failures"])


# ---------------------------------------------------------------- verify --wheel's options


@pytest.mark.parametrize("option", [["--sample", "2"], ["--record"], ["--shard", "0/2"],
                                    ["--key", "k1@gfx942:s=3,tp=4,r=0"], ["--release", RELEASE]])
def test_an_option_that_picks_keys_is_refused_without_against_jit(wheel, capsys, option):
    """Q7: the offline verdict judges the whole wheel; an option it would ignore is bad input, as with --dir."""
    code, out = _verify(capsys, "--wheel", wheel, *option)
    assert code == 2 and option[0] in out and "--against-jit" in out and "Traceback" not in out, out


@pytest.mark.faults
@pytest.mark.parametrize("option", [["--key", "k1@gfx950:s=4,tp=4,r=1"], ["--release", "0.32.0"],
                                    ["--shard", "0/2"]])
def test_keys_the_wheel_does_not_hold_are_named_by_the_wheel(wheel, capsys, option):
    """Q6: with --against-jit, keys the wheel lacks are bad input naming the
    wheel, never verify's scratch copy, with no fix that builds into it."""
    code, out = _verify(capsys, "--wheel", wheel, "--against-jit", "--no-progress", *option)
    assert code == 2 and (f"{wheel} does not hold" in out or f"{wheel} holds no vLLM 0.32.0" in out), out
    assert "dsv41-verify-shipped" not in out and "--out" not in out, out
    assert f"fix: ask only for what it holds (dsv41-aot verify --wheel {wheel} lists it)" in out


@pytest.mark.faults
def test_a_proof_of_a_damaged_wheel_names_the_wheel_when_tmpdir_is_a_symlink(wheel, prebuilt, tmp_path, capsys,
                                                                             monkeypatch):
    """verify --wheel --against-jit works on a scratch copy; each failure names the wheel's member instead, even
    where the temporary folder is reached through a symlink (resolved, it is another path), and its fix is the
    wheel's: a sound wheel, never a copy of the copy."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "link"))

    def flip(name, data):
        return data[:100] + bytes([data[100] ^ 1]) + data[101:] if name.startswith(f"{PKG}{ARCH}/lib/") else data

    bad = _variant(wheel, tmp_path / "bad", flip)
    key = _keys(prebuilt)[0]
    code, doc = _verify_json(capsys, "--wheel", bad, "--against-jit", "--no-progress", "--key", key)
    said = json.dumps(doc)
    assert code == 1 and doc["jit_checked"] == 0 and "dsv41-verify-shipped" not in said, said
    (band,) = [f for f in doc["failures"] if f["what"] == "band"]
    assert band["file"].startswith(f"{bad}!/{ARCH}/lib/") and key in band["keys"], band
    assert {f["what"] for f in doc["failures"]} >= {"band", "wheel"}, said
    assert doc["fixes"] == [FIX_DOWNLOAD, f"dsv41-aot verify --wheel {bad} (its failures name what to fix first)"]


@pytest.mark.faults
def test_keys_an_installed_package_does_not_hold_are_named_by_its_folder(wheel, tmp_path, capsys):
    """The same for the kernels pip installed (``verify --dir`` of them with --record works on a copy): the
    folder asked about is named, and the fix lists what it holds."""
    folder = install_into(wheel, tmp_path / "site") / PKG.rstrip("/")
    key = "k1@gfx950:s=4,tp=4,r=1"
    code, out = _verify(capsys, "--dir", folder, "--against-jit", "--record", "--no-progress", "--key", key)
    assert code == 2 and f"{folder} does not hold 1 of the keys asked for: {key}" in out, out
    assert "dsv41-verify-shipped" not in out and "--out" not in out, out
    assert f"fix: ask only for what it holds (dsv41-aot verify --dir {folder} lists it)" in out, out


def test_a_vllm_extra_that_is_no_version_specifier_is_refused_with_one_that_is():
    """The range a wheel serves is read as PEP 440; one that does not read names an example to write instead."""
    from dsv41_aot.aot.wheel import admits
    from dsv41_aot.errors import ManifestError

    assert admits(">=0.32.0,<0.34", "0.33.0") and not admits(">=0.32.0,<0.33", "0.33.0")
    with pytest.raises(ManifestError) as e:
        admits("about 0.33", "0.33.0")
    assert "'about 0.33'" in e.value.message and e.value.fix == "write the vllm extra as e.g. vllm>=0.32.0,<0.34"
