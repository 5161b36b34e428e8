"""Every ``--json`` prints exactly one JSON document on stdout, also when
something fails, with one vocabulary (dsv41_aot/aot/output.py): ``keys``,
``ok``, ``failed`` (an int) and ``failures`` (a list of {key, error}).
Human lines (FAILED, warnings, progress) go to stderr."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _smoke import REPO, SMOKE_RELEASE_KEYS, cli, copy_of, libdir
from dsv41_aot.manifest import BAND_SUFFIX

ALL = sum(map(len, SMOKE_RELEASE_KEYS.values()))  # the smoke keys of every release (every room)


@pytest.fixture(scope="module")
def smoke(smoke_dir) -> Path:
    return smoke_dir


def run_json(*args, code: int) -> dict:
    """Run ``dsv41-aot ARGS --json``: its exit code must be ``code`` and its
    whole stdout one JSON object in the shared vocabulary."""
    proc = cli(*args, "--json")
    assert proc.returncode == code, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)  # the whole of stdout: one document, nothing before or after it
    assert isinstance(doc, dict)
    assert isinstance(doc["keys"], int) and isinstance(doc["ok"], int) and isinstance(doc["failed"], int)
    assert isinstance(doc["failures"], list) and doc["failed"] == len(doc["failures"])
    assert all(isinstance(f, dict) and {"key", "error"} <= set(f) for f in doc["failures"])
    assert (code == 0) == (doc["failed"] == 0)
    doc["_stderr"] = proc.stderr
    return doc


def test_build_list_and_bad_input():
    doc = run_json("build", "--list", "--profile", "smoke", code=0)
    assert doc["keys"] == ALL and len(doc["entries"]) == ALL
    # each entry names its release: a key string names a launch within it
    assert sorted((e["release"], e["key"]) for e in doc["entries"]) == \
        sorted((r, k) for r, keys in SMOKE_RELEASE_KEYS.items() for k in keys)
    doc = run_json("build", "--release", "0.31.0", "--list", "--key", "k1@gfx950:s=4,tp=4,r=1", code=2)
    assert "unknown vLLM release '0.31.0'" in doc["error"]
    doc = run_json("build", "--key", "k1@gfx950:bogus", "--out", "/tmp/never-written", code=2)
    assert doc["exit_code"] == 2 and "malformed key" in doc["error"] and doc["fix"]
    assert doc["failures"][0]["key"] is None and "malformed key" in doc["failures"][0]["error"]
    doc = run_json("build", "--no-such-flag", code=2)  # argparse's own refusal
    assert doc["command"] == "build" and doc["exit_code"] == 2


@pytest.mark.faults
@pytest.mark.parametrize("args,says", [
    (("build", "--any-key", "--list"), "without --key it would be ignored"),
    (("build", "--key", "k1@gfx950:s=4,tp=4,r=1", "--shard", "0/2", "--list"), "--key and --shard both choose"),
    (("build", "--out", "", "--key", "k1@gfx950:s=4,tp=4,r=1"), "an empty folder name"),
    (("fetch-vllm", "0.32.0", "--dest", "{file}"), "not a folder to unpack into"),
    (("fetch-vllm", "0.32.0", "--dest", "{file}/v"), "cannot unpack vLLM 0.32.0 into {file}/v"),
    (("build", "--jobs", "0", "--list"), "--jobs 0: must be at least 1"),
    (("build", "--jobs", "-1", "--list"), "--jobs -1: must be at least 1"),
    (("build", "--key-timeout", "-5", "--list"), "--key-timeout -5.0: must be a positive number"),
    (("build", "--key-timeout", "nan", "--list"), "--key-timeout nan: must be a positive number"),
    (("build", "--key", "k1@gfx950:s=4,tp=4,r=1", "--profile", "smoke", "--list"), "--key and --profile both choose"),
    (("inspect", "--plot", ""), "--plot '': an empty file name"),
])
def test_command_lines_that_would_be_ignored_or_misread_are_bad_input(tmp_path, args, says):
    """P12 of the fault report at 24a0152, Q9 and Q14 of the one at 3f0364f:
    each used to exit 0 (the options --list, or an empty --plot, left unread)
    or 70 (a --dest under a file)."""
    (tmp_path / "a-file").write_text("x")
    doc = run_json(*(a.replace("{file}", str(tmp_path / "a-file")) for a in args), code=2)
    assert says.replace("{file}", str(tmp_path / "a-file")) in doc["error"] and doc["fix"], doc
    assert not (REPO / "gfx950").exists()  # --out '' built nothing into the current folder


@pytest.mark.faults
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_fetch_vllm_into_a_read_only_file_system_is_bad_input_before_fetching(tmp_path, json_flag):
    """Q9 of the fault report at 3f0364f: exit 70 and a traceback (the scratch
    folder's mkdtemp). A read-only bind mount, in a mount namespace of the
    command's own (root writes any folder chmod makes read-only)."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("no unshare -rm here: cannot mount a read-only folder")
    ro = tmp_path / "ro"
    ro.mkdir()
    mount = f"mount --bind -o ro {shlex.quote(str(ro))} {shlex.quote(str(ro))} && exec \"$@\""
    p = subprocess.run(["unshare", "-rm", "sh", "-c", mount, "sh", sys.executable, "-m", "dsv41_aot.cli", "fetch-vllm",
                        "0.32.0", "--dest", str(ro / "v"), *json_flag], cwd=REPO, capture_output=True, text=True)
    said = f"error: cannot unpack vLLM 0.32.0 into {ro / 'v'} (Read-only file system)\n  fix: pass --dest DIR"
    assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, p.stdout + p.stderr
    assert "fetching" not in p.stderr and not list(ro.iterdir())  # refused before pip download, nothing left
    if json_flag:
        doc = json.loads(p.stdout)
        assert doc["exit_code"] == 2 and str(ro / "v") in doc["error"] and doc["fix"], doc


@pytest.mark.slow
@pytest.mark.parametrize("where", ["under a file", "a folder"])
def test_a_plot_that_cannot_be_written_is_bad_input(smoke, tmp_path, where):
    (tmp_path / "a-file").write_text("x")
    target = {"under a file": tmp_path / "a-file" / "x.png", "a folder": tmp_path}[where]
    doc = run_json("inspect", "--dir", smoke, "--plot", target, code=2)
    assert f"--plot {target}: cannot write the picture there" in doc["error"]


def test_a_reader_that_goes_away_is_no_internal_error():
    """``dsv41-aot build --list --profile full | head -1``: the list stops
    quietly, with the exit code of a command SIGPIPE ended, not a traceback."""
    p = subprocess.Popen([sys.executable, "-m", "dsv41_aot.cli", "build", "--list", "--profile", "full"], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.readline()
    p.stdout.close()  # as head does after its line
    err = p.stderr.read().decode()
    assert p.wait() == 141 and first.startswith(b"0.3"), (first, err)
    assert "Traceback" not in err and "internal error" not in err, err


@pytest.mark.slow
def test_build_with_a_failing_key_and_the_progress_bar(tmp_path):
    """The progress bar on (no --no-progress): the FAILED line goes to
    stderr, stdout stays one JSON document."""
    refused = "ffn@gfx942:s=33,tp=2,r=0"  # trips stages/moe.py's shared_units assert at build time
    doc = run_json("build", "--key", refused, "--any-key", "--out", tmp_path / "pb", "--jobs", "1", code=1)
    assert (doc["keys"], doc["ok"], doc["compiled"], doc["up_to_date"]) == (1, 0, 0, 0)
    assert doc["failures"][0]["key"] == refused and "moe.py" in doc["failures"][0]["error"]
    assert f"FAILED {refused}" in doc["_stderr"]


def test_verify_ok_and_failing(smoke, tmp_path):
    doc = run_json("verify", "--dir", smoke, code=0)
    assert doc["keys"] == doc["ok"] == ALL and len(doc["reports"]) == ALL
    d = copy_of(smoke, tmp_path / "p")
    lib = sorted(libdir(d, "gfx950").glob(f"*{BAND_SUFFIX}"))[0]
    lib.unlink()
    obj = sorted((d / "gfx942" / "objects").glob("*.o"))[0]
    obj.write_bytes(obj.read_bytes()[:-1])
    doc = run_json("verify", "--dir", d, code=1)
    by_file = {f["file"]: f for f in doc["failures"] if f["file"]}
    # the truncated object's key, and the keys the missing band serves, are not ok
    gone = by_file[str(lib)]["keys"]
    assert gone and doc["keys"] == ALL and doc["ok"] == ALL - 1 - len(gone) and doc["failed"] == 2
    assert by_file[str(lib)]["fix"] == f"dsv41-aot link --dir {d} --arch gfx950 --release {by_file[str(lib)]['release']}"
    (bad_key,) = [f for f in doc["failures"] if f["key"]]
    assert "@gfx942:" in bad_key["key"] and bad_key["fix"].startswith("dsv41-aot build --release 0.33.0 --out ")
    assert bad_key["fix"].endswith(f"--key {bad_key['key']}")
    run_json("verify", "--dir", tmp_path / "empty", code=2)


def test_link_list_inspect(smoke, tmp_path):
    d = copy_of(smoke, tmp_path / "p")
    doc = run_json("link", "--dir", d, code=0)
    assert doc["keys"] == doc["ok"] == ALL and doc["linked"] == 0
    # one summary a room (arch, release)
    assert [(a["arch"], a["release"]) for a in doc["arches"]] == [("gfx942", "0.33.0"), ("gfx950", "0.32.0"),
                                                                   ("gfx950", "0.33.0")]
    doc = run_json("link", "--dir", tmp_path / "nothing", code=2)
    assert "dsv41-aot build" in doc["fix"]
    doc = run_json("list", "--dir", d, code=0)
    assert doc["keys"] == len(doc["entries"]) == ALL
    assert sorted((e["release"], e["key"]) for e in doc["entries"]) == \
        sorted((r, k) for r, keys in SMOKE_RELEASE_KEYS.items() for k in keys)
    assert all("compile_seconds" not in e for e in doc["entries"])
    doc = run_json("list", "--dir", d, "--release", "0.32.0", code=0)
    assert sorted(e["key"] for e in doc["entries"]) == sorted(SMOKE_RELEASE_KEYS["0.32.0"])
    run_json("list", "--dir", tmp_path / "nothing", code=2)
    doc = run_json("inspect", "--dir", d, code=0)
    assert doc["keys"] == doc["ok"] == len(doc["rows"]) == ALL
    run_json("inspect", "--dir", tmp_path / "nothing", code=2)


def test_coverage(smoke):
    # a report per (release, deployment): vLLM 0.32.0 does not run on gfx942, so one
    doc = run_json("coverage", "--arch", "gfx942", "--tp", 4, "--profile", "full", code=0)
    assert [r["release"] for r in doc["reports"]] == ["0.33.0"]
    assert doc["keys"] == doc["ok"] == sum(len(r["required"]) for r in doc["reports"]) > 0
    doc = run_json("coverage", "--arch", "gfx950", "--tp", 4, "--profile", "full", code=0)
    assert sorted(r["release"] for r in doc["reports"]) == ["0.32.0", "0.33.0"]
    assert doc["keys"] == doc["ok"] == sum(len(r["required"]) for r in doc["reports"])
    doc = run_json("coverage", "--arch", "gfx942", "--tp", 4, "--max-rows", 4, "--dir", smoke, code=1)
    gaps = {(r["release"], k) for r in doc["reports"] for k in [*r["missing"], *r["unlinked"]]}
    assert doc["failed"] == len(gaps) > 0
    assert {(f["release"], f["key"]) for f in doc["failures"]} == gaps
    run_json("coverage", "--arch", "gfx942", "--tp", 4, "--dir", "/nonexistent-dsv41", code=2)


def test_an_internal_error_is_still_one_json_document(monkeypatch, capsys):
    """A bug (any exception that is no dsv41_aot error) under --json: one
    document saying "internal error", the traceback on stderr, and an exit
    code of its own (neither 1, checks failed, nor 2, bad input)."""
    from dsv41_aot import cli
    from dsv41_aot.aot.output import INTERNAL_ERROR
    from dsv41_aot.cli import build

    def broken(args):
        raise KeyError("a bug")

    monkeypatch.setattr(build, "cmd_list", broken)
    code = cli.main(["list", "--dir", "/nowhere", "--json"])
    out, err = capsys.readouterr()
    assert code == INTERNAL_ERROR and INTERNAL_ERROR not in (0, 1, 2)
    doc = json.loads(out)
    assert doc["error"].startswith("internal error: KeyError") and doc["exit_code"] == INTERNAL_ERROR
    assert doc["failed"] == 1 and doc["failures"][0]["key"] is None
    assert "Traceback" in err and "raise KeyError" in err
    # without --json: the same exit code, the traceback, no stdout
    assert cli.main(["list", "--dir", "/nowhere"]) == INTERNAL_ERROR
    out, err = capsys.readouterr()
    assert out == "" and "internal error: KeyError" in err
