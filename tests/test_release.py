"""The release path, rehearsed end to end: tag, proven wheel, package index, ``pip install``, vLLM's plugin loader.

What a release must be able to rely on, and the tests that show it:

- The workflow (.github/workflows/wheels.yml) is safe to run on a tag:
  zizmor (offline) finds nothing, every action is pinned by commit to a SHA
  ci/ACTIONS.md sources, every job asks for the least permission it needs,
  a tag never writes the build cache, and only the publish job can publish.
- Every ``run:`` step is one call of a ci/ script, and each ci/release.py
  subcommand it names exists.
- The rehearsal runs those steps as a push of the tag ``v`` +
  ``dsv41_aot.__version__`` would, each job after the jobs it needs
  (tests/_workflow.py), on the smoke profile with two shards per arch and
  the session's build cache, so no key compiles again. The test moves the
  folders between jobs that the workflow's artifact steps name (a static
  test checks the names); ci/release.py build-wheel stands in for
  cibuildwheel, twine uploads the wheel to a real package index on
  127.0.0.1 (pypiserver, which never redirects to another index) in place
  of trusted publishing, and a stand-in ``gh`` records the release.
- A user's install: a fresh venv installs dsv41-aot from that index only,
  the index's access log shows the download, and vLLM's own
  ``vllm.plugins.load_general_plugins()`` finds the plugin by its entry
  point; vLLM's mono runner then gets a bound Launcher from the installed
  wheel for every smoke key of vLLM 0.33.0, one process per arch (bind
  only: no GPU).

The fresh venv's vLLM side is vLLM 0.33.0 (``--no-deps``: only its kernel
source and plugin loader run) and what those need: torch, typing_extensions
(torch imports it) and packaging for the plugin loader, flydsl and numpy for
the mono runner (measured: removing any one breaks the import). The project
venv already holds these six (torch 2.13.0 is the local CPU wheel), so the
fresh venv reaches them through one .pth naming a folder of links to them
and their dist-info, and nothing else: dsv41_aot, its metadata and its entry
point exist there only where pip put them from the index (the test checks
each).
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

import _workflow
from _smoke import SMOKE_RELEASE_KEYS
from ci import release, stages
from dsv41_aot.aot.cache import ENV_BUILD_CACHE
from dsv41_aot.manifest import folder_name
from dsv41_aot.facts.releases import NEWEST

REPO = _workflow.REPO
PY = sys.executable
VERSION = release.package_version()
TAG = f"v{VERSION}"
# the arches the workflow's matrices take: what its version job reads from dsv41-aot facts --json
ARCHES = tuple(json.loads(stages.facts_outputs(json.loads(subprocess.run(
    [PY, "-m", "dsv41_aot.cli", "facts", "--json"], cwd=REPO, check=True, capture_output=True, text=True).stdout))["arches"]))
PROBE = REPO / "tests" / "_index_probe.py"
# what import vllm.plugins + load_general_plugins() need (torch, typing_extensions, packaging), and the mono
# runner's import (flydsl, numpy): the fresh venv reaches these six through one .pth
VLLM_SIDE = ("vllm", "torch", "typing-extensions", "packaging", "flydsl", "numpy")
SHARDS = 2  # shard cells per arch in the rehearsal (the workflow runs 8)
# the folders the rehearsal moves between jobs, as the workflow's artifact steps name them
UPLOADS = {"shard": ["shard/"], "merge": ["merged/", "report/residency-*", "report/seconds/"],
           "wheel": ["wheelhouse/*.whl"]}
DOWNLOADS = {"merge": ["shards/"], "wheel": ["kernels_prebuilt/"], "publish": ["dist/"],
             "release": ["residency/", "kernels_prebuilt/"]}


def exe(name: str) -> str:
    return shutil.which(name) or str(Path(PY).with_name(name))


# ---------------------------------------------------------------- the workflow, read


@pytest.fixture(scope="module")
def doc():
    return _workflow.load()


def test_zizmor_finds_nothing_offline():
    """zizmor's default persona, offline: no unpinned action, no broad
    permission, no persisted credential, no cache a tag could be poisoned by."""
    z = exe("zizmor")
    if not Path(z).exists() and not shutil.which("zizmor"):
        pytest.fail("zizmor is not installed: pip install -e .[test]")
    r = subprocess.run([z, "--offline", "--format", "json", str(_workflow.WORKFLOW)], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout) == [], r.stdout
    r = subprocess.run([z, "--offline", str(_workflow.WORKFLOW)], capture_output=True, text=True, cwd=REPO,
                       timeout=120)
    assert r.returncode == 0 and "No findings to report" in r.stdout, r.stdout + r.stderr


def pinned_table() -> dict:
    """ci/ACTIONS.md's rows: action -> (version, sha)."""
    rows = {}
    for line in (REPO / "ci" / "ACTIONS.md").read_text().splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and len(cells[2]) == 40 and all(ch in "0123456789abcdef" for ch in cells[2]):
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def test_every_action_is_pinned_to_a_commit_listed_with_its_source(doc):
    table = pinned_table()
    text = _workflow.WORKFLOW.read_text()
    for job, step in _workflow.uses(doc):
        ref = step["uses"]
        action, _, sha = ref.partition("@")
        assert len(sha) == 40 and all(c in "0123456789abcdef" for c in sha), f"{job}: {ref} is not pinned by commit"
        assert action in table, f"{job}: {action} has no row in ci/ACTIONS.md"
        version, listed = table[action]
        assert sha == listed, f"{job}: {action}@{sha} but ci/ACTIONS.md lists {listed}"
        assert f"{ref} # {version}" in text, f"{job}: {ref} without its version comment # {version}"
    assert set(table) == {s["uses"].split("@")[0] for _, s in _workflow.uses(doc)}, "a row for an unused action"


def test_least_privilege_and_no_persisted_credentials(doc):
    assert doc["permissions"] == {}, "the workflow's default token must have no permission"
    for name, job in doc["jobs"].items():
        perms = job.get("permissions")
        assert isinstance(perms, dict) and perms, f"job {name} must say what its token may do"
        if name == "publish":
            assert perms == {"id-token": "write"}
        elif name == "release":
            assert perms == {"contents": "write"}
        else:
            assert perms == {"contents": "read"}, f"job {name}: {perms}"
    holders = [n for n, j in doc["jobs"].items() if "id-token" in j.get("permissions", {})]
    assert holders == ["publish"]
    for job, step in _workflow.uses(doc):
        if step["uses"].startswith("actions/checkout@"):
            assert step["with"]["persist-credentials"] is False, f"{job}: checkout persists credentials"


def test_publish_runs_on_v_tags_after_every_check_by_trusted_publishing(doc):
    assert doc["on"]["push"] == {"tags": ["v*"]}
    jobs = doc["jobs"]
    pub = jobs["publish"]
    assert set(pub["needs"]) == {"version", "wheel"}
    assert pub["if"] == "github.event_name == 'push' && startsWith(github.ref, 'refs/tags/v')"
    assert pub["environment"]["name"] == "pypi"
    steps = pub["steps"]
    assert not [s for s in steps if "run" in s], "the publish job runs nothing of its own"
    (publish,) = [s for s in steps if s.get("uses", "").startswith("pypa/gh-action-pypi-publish@")]
    assert publish["with"]["attestations"] is True
    assert not {"password", "user", "repository-url"} & set(publish["with"]), "trusted publishing: no token"
    (download,) = [s for s in steps if s.get("uses", "").startswith("actions/download-artifact@")]
    assert download["with"]["name"] == "wheel"  # the wheel the wheel job checked, nothing rebuilt
    # every check of the wheel is in the wheel job, which needs merge, which needs shard, which needs version
    checks = [s["run"] for s in jobs["wheel"]["steps"] if "run" in s]
    assert any("checkwheel" in c and "--require-proofs" in c for c in checks)
    assert jobs["wheel"]["needs"] == "merge" and jobs["merge"]["needs"] == "shard" and jobs["shard"]["needs"] == "version"
    assert jobs["release"]["needs"] == "publish" and jobs["release"]["if"] == pub["if"]


def test_a_tag_restores_the_build_cache_and_never_writes_it(doc):
    steps = doc["jobs"]["shard"]["steps"]
    actions = [s["uses"].split("@")[0] for s in steps if "uses" in s]
    assert "actions/cache" not in actions  # restore + save in one step cannot be made restore-only on a tag
    assert "actions/cache/restore" in actions
    for s in steps:
        if s.get("uses", "").startswith("actions/cache/save@"):
            assert "github.ref_type != 'tag'" in s["if"]
    restore = next(i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/cache/restore@"))
    build = next(i for i, s in enumerate(steps) if "release.py shard " in s.get("run", ""))
    assert restore < build  # the shard's build reads the restored cache
    # the folder restored is the one the build uses (the rehearsal gives the session's cache instead)
    assert steps[restore]["with"]["path"] == ".build-cache"
    assert doc["env"][ENV_BUILD_CACHE] == "${{ github.workspace }}/.build-cache"


def test_every_run_step_is_one_call_of_a_ci_script(doc):
    """No logic lives only in YAML: each run: is one command line calling a
    ci/ script (the cibuildwheel step is the one exception), with no shell
    control, pipes, substitutions or expressions; each ci/release.py
    subcommand it names exists."""
    import shlex

    import argparse

    (sub,) = [a for a in release.parser()._actions if isinstance(a, argparse._SubParsersAction)]
    subcommands = set(sub.choices)
    for job, name, command in _workflow.runs(doc):
        assert "\n" not in command.strip(), f"{job}: {name}: more than one line"
        assert not set(";&|`<>$(){}") & set(command), f"{job}: {name}: shell logic in YAML: {command}"
        argv = shlex.split(command)
        if command.strip() in _workflow.STAND_INS and argv[0].endswith("cibuildwheel"):
            continue
        script = argv[0] if argv[0].startswith("ci/") else argv[1]
        assert argv[0] in ("python", ".venv/bin/python") or argv[0].startswith("ci/"), command
        assert script.startswith("ci/") and (REPO / script).is_file(), command
        if script == "ci/release.py":
            assert argv[argv.index(script) + 1] in subcommands, command


def upstream(doc: dict, job: str) -> set:
    """Every job ``job`` waits for, directly or through the jobs it needs."""
    out = set()
    for n in _workflow.needs(doc, job):
        out |= {n} | upstream(doc, n)
    return out


def rehearsal_env(cache: Path) -> dict:
    """What the rehearsal gives the workflow's env: entries that are GitHub expressions, and fewer shards."""
    return {"PROFILE": "smoke", "SHARDS": str(SHARDS), ENV_BUILD_CACHE: str(cache), "GH_TOKEN": "rehearsal-token"}


def test_the_rehearsal_moves_the_artifacts_the_workflow_names(doc):
    """Each download-artifact step fetches what an upload-artifact step of
    a job it waits for stores (names matched with each matrix axis as *),
    into the folders the rehearsal fills; each upload takes the folders the
    rehearsal copies."""
    matrix = re.compile(r"\$\{\{ matrix\.\w+ \}\}")
    ups, downs, stored = {}, {}, {}
    for job, step in _workflow.uses(doc):
        action, w = step["uses"].split("@")[0], step.get("with", {})
        if action == "actions/upload-artifact":
            ups.setdefault(job, []).append(w["path"])
            stored[matrix.sub("*", w["name"])] = job
    for job, step in _workflow.uses(doc):
        action, w = step["uses"].split("@")[0], step.get("with", {})
        if action == "actions/download-artifact":
            downs.setdefault(job, []).append(w["path"])
            want = matrix.sub("*", w.get("name") or w["pattern"])
            by = [j for name, j in stored.items() if name == want or fnmatch.fnmatch(name, want)]
            assert by and set(by) <= upstream(doc, job), f"{job}: {want} is stored by {by or 'no job'}"
    assert ups == UPLOADS, f"upload-artifact paths {ups}: the rehearsal copies {UPLOADS}"
    assert downs == DOWNLOADS, f"download-artifact paths {downs}: the rehearsal fills {DOWNLOADS}"


def test_a_wrong_tag_fails_before_anything_is_built(tmp_path, doc):
    """Every other job waits for the version job, which fails on a tag that
    is not v + __version__, naming both; a branch passes. The rehearsal
    refuses to run a job before the jobs it needs."""
    assert all("version" in upstream(doc, name) for name in doc["jobs"] if name != "version")
    env = rehearsal_env(tmp_path / "cache")
    with pytest.raises(AssertionError) as e:
        _workflow.Rehearsal(root=tmp_path / "bad", tag="v0.0.0-not-this", env=env).job("version")
    assert "'v0.0.0-not-this' is not v + dsv41_aot.__version__" in str(e.value) and f"'{TAG}'" in str(e.value)
    run = _workflow.Rehearsal(root=tmp_path / "ok", tag=TAG, env=env)
    with pytest.raises(AssertionError, match=r"job merge runs before \['shard'\]"):
        run.job("merge", {"arch": ARCHES[0]})
    odd = copy.deepcopy(run.doc)  # an action the rehearsal has no answer for is refused, not skipped
    odd["jobs"]["version"]["steps"].append({"uses": "someone/else@" + "0" * 40})
    with pytest.raises(AssertionError, match="say in ACTIONS what the rehearsal does instead"):
        _workflow.Rehearsal(root=tmp_path / "odd", tag=TAG, env=env, doc=odd).job("version")
    ws = run.job("version")
    outputs = dict(line.split("=", 1) for p in ws.glob(".github-output-*") for line in p.read_text().splitlines())
    assert json.loads(outputs["arches"]) == list(ARCHES)
    r = subprocess.run([PY, "ci/release.py", "check-tag"], capture_output=True, text=True, cwd=REPO,
                       env=dict(os.environ, GITHUB_REF_TYPE="branch", GITHUB_REF_NAME="main"))
    assert r.returncode == 0 and "nothing to check" in r.stdout


def test_merge_takes_one_folder_per_shard_or_the_one_shard_itself(tmp_path):
    for i in (0, 1):
        (tmp_path / "many" / f"shard-gfx950-{i}").mkdir(parents=True)
    assert release.shard_dirs(tmp_path / "many") == [tmp_path / "many" / f"shard-gfx950-{i}" for i in (0, 1)]
    one = tmp_path / "one"  # download-artifact extracts a single matching artifact into its path
    (one / "gfx950").mkdir(parents=True)
    (one / "shard-gfx950-0of1.json").write_text("{}")
    assert release.shard_dirs(one) == [one]


def test_step_outputs_are_written_in_githubs_format(tmp_path):
    """One ``name=value`` line each; a multi-line value as ``name<<DELIM``, its lines, ``DELIM``."""
    out = tmp_path / "o"
    stages.write_outputs({"key": "k", "restore-keys": "a-\nb-"}, str(out))
    lines = out.read_text().splitlines()
    name, delim = lines[1].split("<<")
    assert lines[0] == "key=k" and name == "restore-keys" and lines[2:] == ["a-", "b-", delim] and delim
    assert stages.cache_keys("gfx950", "3", "abc") == ("dsv41-build-gfx950-3-abc",
                                                         ["dsv41-build-gfx950-3-", "dsv41-build-gfx950-"])


# ---------------------------------------------------------------- the rehearsal


class Index:
    """A real package index on 127.0.0.1 (pypiserver), uploads open, never
    redirecting to another index; its access log in a file."""

    def __init__(self, folder: Path):
        self.packages = folder / "packages"
        self.packages.mkdir(parents=True)
        self.access_log = folder / "access.log"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.out = open(folder / "server.out", "w")
        self.proc = subprocess.Popen([PY, "-m", "pypiserver", "run", "-i", "127.0.0.1", "-p", str(self.port),
                                      "--disable-fallback", "-a", ".", "-P", ".", "-v", "--log-file", str(self.access_log),
                                      str(self.packages)], stdout=self.out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/simple/", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"pypiserver did not start: {(folder / 'server.out').read_text()[-2000:]}")
                time.sleep(0.2)
        self.uploads = []

    def upload(self, dist: Path) -> None:
        """The publish step's stand-in: twine uploads the downloaded wheel
        artifact (trusted publishing and attestations need GitHub's OIDC)."""
        files = sorted(Path(dist).glob("*.whl"))
        assert len(files) == 1, f"{dist}: {files}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TWINE_")}
        r = subprocess.run([exe("twine"), "upload", "--non-interactive", "--disable-progress-bar",
                            "--repository-url", f"{self.url}/", "-u", "rehearsal", "-p", "rehearsal", *map(str, files)],
                           capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        self.uploads += files

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.out.close()


GH = """#!{py}
import json, os, sys
with open({log!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "token": os.environ.get("GH_TOKEN"), "cwd": os.getcwd()}}) + "\\n")
sys.exit(1 if sys.argv[1:3] == ["release", "view"] else 0)  # no release of the tag yet
"""


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory, smoke_dir):
    """The workflow's jobs, each after the jobs it needs, as a push of the tag
    runs them, into a real local index. ``smoke_dir`` first: the session's
    smoke build fills the build cache, so no key compiles again here."""
    root = tmp_path_factory.mktemp("release")
    index = Index(root / "index")
    ghbin = root / "ghbin"
    ghbin.mkdir()
    (ghbin / "gh").write_text(GH.format(py=PY, log=str(root / "gh-calls.jsonl")))
    (ghbin / "gh").chmod(0o755)
    run = _workflow.Rehearsal(root=root / "run", tag=TAG, env=rehearsal_env(Path(os.environ[ENV_BUILD_CACHE])),
                              path=[ghbin])
    store = root / "artifacts"  # what the artifact steps would carry (UPLOADS, DOWNLOADS)
    t0 = time.monotonic()
    try:
        ws = run.job("version")
        # the later matrices take its arches output (test_facts_cli.py checks the workflow says so)
        outputs = dict(line.split("=", 1) for p in ws.glob(".github-output-*") for line in p.read_text().splitlines())
        arches = json.loads(outputs["arches"])
        for arch in arches:
            for shard in range(SHARDS):
                ws = run.job("shard", {"arch": arch, "shard": shard})
                shutil.copytree(ws / "shard", store / "shards" / arch / f"shard-{arch}-{shard}")
        for arch in arches:
            ws = run.job("merge", {"arch": arch}, inputs={"shards": store / "shards" / arch})
            shutil.copytree(ws / "merged", store / "prebuilt", dirs_exist_ok=True)
            (store / "residency").mkdir(exist_ok=True)
            for p in (ws / "report").glob("residency-*"):
                shutil.copyfile(p, store / "residency" / p.name)
        ws = run.job("wheel", inputs={"kernels_prebuilt": store / "prebuilt"})
        run.job("publish")  # no run: step: its one action publishes what the wheel job checked
        index.upload(ws / "wheelhouse")
        run.job("release", inputs={"kernels_prebuilt": store / "prebuilt", "residency": store / "residency"})
        run.seconds = time.monotonic() - t0
        run.gh_calls = [json.loads(line) for line in (root / "gh-calls.jsonl").read_text().splitlines()]
        yield run, index
    finally:
        index.stop()


@pytest.mark.slow
def test_the_workflow_ran_every_step(rehearsal, doc):
    run, index = rehearsal
    assert {job for job, _ in run.done} == set(doc["jobs"])
    cells = {tuple(sorted(cell.items())) for job, cell in run.done if job == "shard"}
    assert cells == {(("arch", a), ("shard", i)) for a in ARCHES for i in range(SHARDS)}
    for job, name, command in _workflow.runs(doc):
        ran = _workflow.STAND_INS.get(command.strip(), (command,))[0]
        assert ran is None or (job, ran) in {(j, c) for j, _, c in run.log}, f"{job}: {name} did not run"
    assert len(index.uploads) == 1 and index.uploads[0].name == f"dsv41_aot-{VERSION}-py3-none-manylinux_2_28_x86_64.whl"
    # the shard cells built every smoke key once (each in one shard) and proved each against vLLM's JIT,
    # through the session's build cache: after the session's smoke build, no key compiles again
    shard_out = [out for (job, _, cmd), out in run.outputs.items() if job == "shard" and " shard " in cmd]
    built = [json.loads(doc) for out in shard_out for doc in re.findall(r"^\{\n.*?^\}$", out, re.M | re.S)]
    assert sum(b["keys"] for b in built) == sum(map(len, SMOKE_RELEASE_KEYS.values()))
    assert all(b["failed"] == 0 for b in built)
    if not os.environ.get("DSV41_AOT_TEST_PREBUILT"):  # a given smoke folder was copied, not compiled into the cache
        assert sum(b["compiled"] for b in built) == 0, built
    proven = [re.search(r"(\d+) keys checked \((\d+) against vLLM's JIT, (\d+) of those from the build cache\): 0 failed",
                        out) for out in shard_out]
    assert all(proven) and sum(int(m[2]) for m in proven) == sum(map(len, SMOKE_RELEASE_KEYS.values()))
    print(f"\nrehearsal: the workflow's steps ran in {run.seconds:.1f} s; {sum(b['compiled'] for b in built)} keys "
          f"compiled, {sum(int(m[3]) for m in proven)} of {sum(int(m[2]) for m in proven)} JIT proofs from the cache")


@pytest.mark.slow
def test_the_release_carries_pictures_summaries_and_each_rooms_proofs(rehearsal):
    run, _ = rehearsal
    (view, create) = run.gh_calls
    assert view["argv"][:3] == ["release", "view", TAG]
    argv = create["argv"]
    assert argv[:3] == ["release", "create", TAG] and "--verify-tag" in argv and create["token"] == "rehearsal-token"
    files = {Path(a).name for a in argv if "/" in a and Path(create["cwd"], a).is_file()}
    rooms = sorted({(k.split("@")[1].split(":")[0], r) for r, ks in SMOKE_RELEASE_KEYS.items() for k in ks})
    want = {f"residency-{a}.{ext}" for a in ARCHES for ext in ("png", "txt", "json")}
    want |= {f"verified-{a}-{folder_name(r)}.json" for a, r in rooms} | {"SHA256SUMS"}
    assert files == want
    assets = Path(create["cwd"]) / "release-assets"
    for a, r in rooms:
        proofs = json.loads((assets / f"verified-{a}-{folder_name(r)}.json").read_text())["keys"]
        assert sorted(proofs) == sorted(k for k in SMOKE_RELEASE_KEYS[r] if f"@{a}:" in k)


def fresh_venv(root: Path) -> Path:
    """A new venv with its own pip, and a .pth to a folder of links to the
    vLLM side's six distributions in this venv (package folders and
    dist-info), nothing else."""
    import importlib.metadata as md

    venv = root / "venv"
    subprocess.run([PY, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    farm = root / "vllm-side"
    farm.mkdir()
    for name in VLLM_SIDE:
        dist = md.distribution(name)
        base = Path(dist.locate_file(""))
        for top in sorted({Path(str(f)).parts[0] for f in dist.files}):
            if top in ("..", "__pycache__", "bin") or top.endswith(".pth"):
                continue
            if (base / top).exists() and not (farm / top).exists():
                (farm / top).symlink_to(base / top)
    assert not [p for p in farm.iterdir() if p.name.startswith(("dsv41", "__editable__"))]
    (site / "vllm_side.pth").write_text(f"{farm}\n")
    return py


def isolated_env() -> dict:
    """No pip configuration (this machine's adds other sources), nothing of
    the repository or the suite's dsv41-aot settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "DSV41_AOT_", "PYTHON", "FLYDSL_", "VIRTUAL_ENV"))}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


@pytest.fixture(scope="module")
def installed(rehearsal, tmp_path_factory):
    """``pip install dsv41-aot`` from the rehearsal's index only, into a fresh venv."""
    _, index = rehearsal
    root = tmp_path_factory.mktemp("user")
    py = fresh_venv(root)
    before = index.access_log.read_text()
    r = subprocess.run([str(py), "-m", "pip", "install", "--isolated", "--no-cache-dir", "--disable-pip-version-check",
                        "--index-url", f"{index.url}/simple/", f"dsv41-aot=={VERSION}"],
                       capture_output=True, text=True, env=isolated_env(), cwd=root, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    log = index.access_log.read_text()[len(before):]
    return py, r.stdout, log


@pytest.mark.slow
def test_pip_installs_from_the_index_only_and_the_server_logs_the_download(installed, rehearsal):
    _, out, log = installed
    _, index = rehearsal
    assert f"Looking in indexes: {index.url}/simple/" in out and "Looking in links" not in out, out
    wheel = index.uploads[0].name
    assert '"GET /simple/dsv41-aot/ HTTP/1.1" 200' in log, log
    assert '" 303 ' not in log and '" 302 ' not in log  # never sent to another index
    assert f'"GET /packages/{wheel} HTTP/1.1" 200' in log, log
    assert f"Successfully installed dsv41-aot-{VERSION}" in out


def probe(py: Path, arch: str) -> dict:
    keys = sorted(k for k in SMOKE_RELEASE_KEYS[NEWEST] if f"@{arch}:" in k)
    env = isolated_env()
    # one arch per process: vLLM's mono package fixes its target at import; no GPU here, so the plugin is
    # told the arch; this machine's HIP stand-in accepted as conftest accepts it
    env.update(ARCH=arch, FLYDSL_GPU_ARCH=arch, DSV41_AOT_ARCH=arch, DSV41_AOT_ALLOW_HIP_VERSION="5.2")
    r = subprocess.run([str(py), str(PROBE), json.dumps(keys)], capture_output=True, text=True, env=env,
                       cwd=py.parents[2], timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["stderr"], out["asked"] = r.stderr, keys
    return out


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHES)
def test_vllms_plugin_loader_finds_the_installed_plugin_and_the_runner_binds_every_smoke_key(installed, arch):
    py, _, _ = installed
    site = str(py.parents[1])
    out = probe(py, arch)
    # the one dsv41-aot is the wheel pip installed from the index: its files, metadata and entry point
    assert out["dists"]["dsv41-aot"].startswith(site) and out["dsv41_aot"].startswith(site), out["dists"]
    assert not out["dsv41_aot"].startswith(str(REPO))
    ours = [e for e in out["entry_points"] if e[2] == out["dists"]["dsv41-aot"]]
    assert ours == [["dsv41_aot", "dsv41_aot.vllm:register", out["dists"]["dsv41-aot"]]], out["entry_points"]
    # every other vllm.general_plugins entry point is vLLM's own (its distribution's), none a dsv41-aot's
    assert all(e[2] == out["dists"]["vllm"] and not e[1].startswith("dsv41") for e in out["entry_points"]
               if e not in ours), out["entry_points"]
    assert out["versions"]["dsv41-aot"] == VERSION and out["versions"]["vllm"] == NEWEST
    assert out["versions"]["torch"].startswith("2.13.0") and out["versions"]["flydsl"] == "0.4.2"
    # found and called by vLLM's own loader: on, strict, for the arch, the wheel's kernels
    assert out["loaded_by_vllm"] and out["installed"]["mode"] == "strict" and out["installed"]["hooked"]
    assert f"dsv41-aot vLLM plugin on: enabled (strict) for {arch}" in out["stderr"], out["stderr"]
    assert f"{site}" in out["stderr"]  # the room it serves is inside the installed package
    assert out["patched"] and out["gfx942"] == (arch == "gfx942")
    # every smoke key of vLLM 0.33.0 on this arch: a bound Launcher of that key
    assert out["asked"] and sorted(out["keys"]) == out["asked"]
    for key, got in out["keys"].items():
        assert got == {"origin": "aot", "key": key, "bound": True, "kernel_name": got.get("kernel_name")}, (key, got)
    layer, ffn = out["runner_calls"].values()
    assert [x["key"] for x in layer] == [f"k1@{arch}:s=4,tp=4,r=1", f"k2@{arch}:s=4,tp=4,r=1"]
    assert all(x["bound"] for x in layer) and ffn["key"] == f"ffn@{arch}:s=4,tp=4,r=0" and ffn["bound"]
    assert out["installed_after"]["served_jit"] == 0
    # the bands were dlopened from memory, none from the repository or a build folder
    assert out["bands_mapped"] and all(p.startswith("/memfd:") for p in out["bands_mapped"]), out["bands_mapped"]


@pytest.mark.slow
def test_a_user_downloads_the_wheel_and_checks_it_offline(rehearsal, installed, tmp_path):
    """``pip download dsv41-aot`` from the index, then the wheel's report:
    what it holds per (arch, release, TP), every key proven, every band
    checked; a band altered after the fact is named."""
    _, index = rehearsal
    py, _, _ = installed
    r = subprocess.run([str(py), "-m", "pip", "download", "--isolated", "--no-cache-dir", "--no-deps",
                        "--index-url", f"{index.url}/simple/", "-d", str(tmp_path), f"dsv41-aot=={VERSION}"],
                       capture_output=True, text=True, env=isolated_env(), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = tmp_path.glob("*.whl")
    # what a user runs: dsv41-aot verify --wheel (the release's checks run the same report: ci/check_wheel.py)
    r = subprocess.run([PY, "-m", "dsv41_aot.cli", "verify", "--wheel", str(wheel), "--json"],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["problems"] == [] and rep["unproven"] == [] and rep["version"] == VERSION
    held = {(x["arch"], x["release"]): x for x in rep["rooms"]}
    for release, keys in SMOKE_RELEASE_KEYS.items():
        for arch in ARCHES:
            mine = [k for k in keys if f"@{arch}:" in k]
            if mine:
                room = held[arch, release]
                assert room["keys"] == room["proven"] == len(mine) and room["tp"]["4"]["keys"] == len(mine)
    text = subprocess.run([PY, "-m", "dsv41_aot.cli", "verify", "--wheel", str(wheel)], capture_output=True,
                          text=True, cwd=REPO).stdout
    assert "gfx950 vLLM 0.33.0" in text and "TP4:" in text and "sha256 ok" in text and text.rstrip().endswith(": ok")
    # a band altered inside the wheel: named, and the report fails
    bad = tmp_path / "altered" / wheel.name
    bad.parent.mkdir()
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(bad, "w", zipfile.ZIP_DEFLATED) as zout:
        flipped = False
        for item in zin.infolist():
            data = zin.read(item)
            if not flipped and item.filename.endswith(".so.xz"):
                data = data[:100] + bytes([data[100] ^ 1]) + data[101:]
                flipped = item.filename
            zout.writestr(item, data)
    r = subprocess.run([PY, "-m", "dsv41_aot.cli", "verify", "--wheel", str(bad)], capture_output=True, text=True,
                       cwd=REPO)
    assert r.returncode == 1 and flipped.rsplit("/", 1)[1] in r.stdout and "FAILED" in r.stdout, r.stdout
