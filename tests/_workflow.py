"""The wheels workflow (.github/workflows/wheels.yml) read as data, and a runner of its run: steps.

tests/test_release.py uses it to rehearse a release: it calls ``job()`` for
each job, in an order the jobs' ``needs:`` allow, and moves the folders one
job uploads to the jobs that download them. ``job()`` runs that job's
``run:`` lines as the workflow writes them, in order, with bash, in a fresh
workspace, so a step the workflow adds or changes is a step the rehearsal
runs. Everything that is GitHub's rather than this project's (actions,
expressions, artifact transport) is left to the test, which says what it
does instead; nothing here interprets it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / ".github" / "workflows" / "wheels.yml"

# run: lines the rehearsal does not run as written: what runs instead (None: nothing), and why
STAND_INS = {
    "ci/bootstrap.sh": (None, "ci/test.sh ran ci/bootstrap.sh before pytest: its venv is the one every step uses"),
    ".venv/bin/cibuildwheel --platform linux --output-dir wheelhouse .": (
        ".venv/bin/python ci/release.py build-wheel kernels_prebuilt wheelhouse",
        "cibuildwheel needs Docker and the manylinux_2_28 image; build-wheel builds the same wheel with the "
        "frontend cibuildwheel uses, then runs its repair step's audit"),
}
# the actions the workflow uses, and what the rehearsal does in their place; job() refuses any other
ACTIONS = {
    "actions/checkout": "a fresh workspace linking CHECKOUT and the suite's venv",
    "actions/setup-python": "`python` on PATH is a venv of the base interpreter with nothing installed",
    "actions/cache/restore": "the build cache variable names the session's build cache",
    "actions/cache/save": "nothing: the session's cache was written in place",
    "actions/upload-artifact": "the test copies the folders (tests/test_release.py UPLOADS)",
    "actions/download-artifact": "the test copies the folders (tests/test_release.py DOWNLOADS)",
    "pypa/gh-action-pypi-publish": "the test uploads the wheel to its index with twine",
}
# the checkout's entries the steps read, linked into each workspace
CHECKOUT = ("ci", "dsv41_aot", "build_matrix.yaml", "pyproject.toml", "setup.py", "README.md", "LICENSE", "NOTICE")
_MATRIX = re.compile(r"\$\{\{ matrix\.(\w+) \}\}")
_STEP_OUTPUT = re.compile(r"\$\{\{ steps\.([\w-]+)\.outputs\.([\w-]+) \}\}")


def load(path: Path = WORKFLOW) -> dict:
    """The workflow as a dict, with its ``on:`` key under "on" (YAML 1.1 reads a bare ``on`` as True)."""
    doc = yaml.safe_load(path.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))
    return doc


def needs(doc: dict, job: str) -> list:
    """The jobs ``job`` waits for (``needs:`` is one name or a list)."""
    value = doc["jobs"][job].get("needs", [])
    return [value] if isinstance(value, str) else list(value)


def runs(doc: dict) -> list:
    """(job, step name, command) of every run: step, in the workflow's order."""
    return [(j, s.get("name", ""), s["run"]) for j, job in doc["jobs"].items() for s in job["steps"] if "run" in s]


def uses(doc: dict) -> list:
    """(job, step) of every uses: step."""
    return [(j, s) for j, job in doc["jobs"].items() for s in job["steps"] if "uses" in s]


@dataclass
class Rehearsal:
    """One rehearsed run of the workflow, as a push of ``tag`` would start it.

    ``env`` gives the values of the workflow's, jobs' and steps' ``env:``
    entries that the rehearsal changes (``SHARDS``) or that are GitHub
    expressions; ``${{ matrix.<axis> }}`` takes the cell's value. A step
    whose ``env:`` holds any other expression fails, so none goes unanswered.
    """

    root: Path
    tag: str
    env: dict
    path: list = field(default_factory=list)  # folders put first on PATH (a stand-in gh)
    doc: dict = field(default_factory=load)
    done: list = field(default_factory=list)  # (job, cell) in the order they ran
    log: list = field(default_factory=list)  # (job, cell, command that ran)
    outputs: dict = field(default_factory=dict)  # (job, cell items, command) -> what it printed

    def __post_init__(self):
        # setup-python's `python`: an interpreter with the standard library and nothing installed
        self.bare = self.root / "setup-python"
        if not (self.bare / "bin" / "python").exists():
            subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip",
                            str(self.bare)], check=True, timeout=120)

    def job(self, name: str, cell: dict | None = None, inputs: dict | None = None) -> Path:
        """Run one cell of job ``name``: its run: steps in order, in a new workspace; return the workspace.

        ``inputs`` maps a folder of the workspace to the folder copied
        there first (what the job's download-artifact steps would fetch).
        Fails if a job ``name`` needs has not run, or if a step fails.
        """
        cell = cell or {}
        ran = {j for j, _ in self.done}
        missing = [n for n in needs(self.doc, name) if n not in ran]
        assert not missing, f"job {name} runs before {missing}, which it needs"
        spec = self.doc["jobs"][name]
        unknown = [s["uses"] for s in spec["steps"] if "uses" in s and s["uses"].split("@")[0] not in ACTIONS]
        assert not unknown, f"job {name} uses {unknown}: say in ACTIONS what the rehearsal does instead"
        ws = self.root / "ws" / "-".join([name, *map(str, cell.values())])
        shutil.rmtree(ws, ignore_errors=True)
        ws.mkdir(parents=True)
        for entry in CHECKOUT:  # actions/checkout: what the steps read; what they write stays in ws
            (ws / entry).symlink_to(REPO / entry)
        (ws / ".venv").symlink_to(Path(sys.prefix))  # ci/bootstrap.sh's venv: the one running the suite
        for folder, source in (inputs or {}).items():
            shutil.copytree(source, ws / folder, dirs_exist_ok=True)
        base = {**(self.doc.get("env") or {}), **(spec.get("env") or {})}
        steps: dict = {}  # step id -> the outputs it wrote to $GITHUB_OUTPUT (name=value lines)
        for i, step in enumerate(s for s in spec["steps"] if "run" in s):
            command, _ = STAND_INS.get(step["run"].strip(), (step["run"], ""))
            if command is None:
                continue
            env = self._env({**base, **(step.get("env") or {})}, cell, name, steps)
            out = ws / f".github-output-{i}"
            env["GITHUB_OUTPUT"] = str(out)
            r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", command], cwd=ws, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
            self.log.append((name, cell, command))
            self.outputs[name, tuple(sorted(cell.items())), command] = r.stdout
            assert r.returncode == 0, f"{name} {cell}: {command!r} failed (exit {r.returncode})\n{r.stdout[-6000:]}"
            if "id" in step:
                lines = out.read_text().splitlines() if out.is_file() else []
                steps[step["id"]] = dict(line.split("=", 1) for line in lines if "=" in line)
        self.done.append((name, cell))
        return ws

    def _env(self, declared: dict, cell: dict, job: str, steps: dict) -> dict:
        """The process environment of one step: this one's, less GitHub's, plus what the workflow declares
        (a matrix value, or an output an earlier step of the job wrote: ``steps``)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RUNNER_"))}
        for k, v in declared.items():
            m = _MATRIX.fullmatch(str(v))
            o = _STEP_OUTPUT.fullmatch(str(v))
            if k in self.env:
                v = self.env[k]
            elif m:
                v = cell[m[1]]
            elif o:
                assert o[2] in steps.get(o[1], {}), f"{job}: env {k}: no earlier step {o[1]!r} wrote output {o[2]!r}"
                v = steps[o[1]][o[2]]
            else:
                assert "${{" not in str(v), f"{job}: env {k}: {v!r} is an expression the rehearsal gives no value"
            env[k] = str(v)
        env.update(GITHUB_REF_TYPE="tag", GITHUB_REF_NAME=self.tag, GITHUB_REF=f"refs/tags/{self.tag}",
                   GITHUB_EVENT_NAME="push", GITHUB_REPOSITORY="rehearsal/dsv41-aot", CI="true")
        env["PATH"] = os.pathsep.join([*map(str, self.path), str(self.bare / "bin"), os.environ.get("PATH", "")])
        return env
