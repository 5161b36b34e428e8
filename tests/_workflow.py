"""Run .github/workflows/wheels.yml's own steps here, in order, as a
tag-triggered run would (tests/test_release.py).

Each job cell gets a workspace (``actions/checkout``: the entries of the
checkout the steps read, ``CHECKOUT``, linked, and ``.venv`` the venv running
the suite, so ``ci/...`` and ``.venv/bin/python`` are this repository's and
what a step writes stays in the workspace) and runs its steps:

- ``run:`` is executed as written, with bash (GitHub's ``bash -e {0}``), in
  the workspace, with the workflow's, job's and step's ``env`` (their
  ``${{ }}`` expressions evaluated), ``python`` on PATH an interpreter with
  nothing installed (setup-python's), the ``GITHUB_*`` variables of a tag push
  and a ``GITHUB_OUTPUT`` file whose ``name=value`` lines become the step's
  outputs. Two steps are stood in for, by name in ``STAND_INS``, each with
  its reason: ``ci/bootstrap.sh`` (ci/test.sh ran it before pytest started:
  the venv it made is the one every step uses) and the cibuildwheel step
  (Docker: ``ci/release.py build-wheel`` builds the same wheel).
- ``uses:`` of the actions the workflow uses: checkout (the workspace),
  setup-python (nothing more), ``cache/restore``
  (the build cache folder appears at its path: the session's build cache),
  ``cache/save`` (nothing: the cache was written in place),
  ``upload-artifact`` / ``download-artifact`` (folders under the run's
  artifact store, with their ``path`` / ``pattern`` / ``merge-multiple``
  semantics) and ``pypa/gh-action-pypi-publish`` (``publish``, a callable the
  caller gives: twine to the rehearsal's index). Any other action, any
  expression or ``if:`` this runner does not know fails the run, so the
  workflow cannot grow a step the rehearsal silently skips.

Jobs run in an order their ``needs`` allow. When a job's cells have run, its
``outputs:`` are evaluated (the job's context and that cell's step outputs)
and kept in ``Run.job_outputs``; a job that needs it reads them as
``needs.<job>.outputs.<name>``, in expressions and in a matrix axis written
``${{ fromJSON(...) }}`` (the axis is that JSON list). As on GitHub, a job
sees the outputs of the jobs it needs directly, no others.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / ".github" / "workflows" / "wheels.yml"

# run: steps the rehearsal does not execute as written, and what stands in
STAND_INS = {
    "ci/bootstrap.sh": (None, "ci/test.sh ran ci/bootstrap.sh before pytest: its venv is the one every step uses"),
    ".venv/bin/cibuildwheel --platform linux --output-dir wheelhouse .": (
        ".venv/bin/python ci/release.py build-wheel kernels_prebuilt wheelhouse",
        "cibuildwheel needs Docker and the manylinux_2_28 image; build-wheel builds the same wheel with the "
        "frontend cibuildwheel uses, then its repair step's audit"),
}
# the checkout's entries the steps read (linked into each workspace)
CHECKOUT = ("ci", "dsv41_aot", "build_matrix.yaml", "pyproject.toml", "setup.py", "README.md", "LICENSE", "NOTICE")
_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
_FROM_JSON = re.compile(r"fromJSON\((.*)\)")


def load(path: Path = WORKFLOW) -> dict:
    doc = yaml.safe_load(path.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as True
    return doc


def runs(doc: dict) -> list:
    """(job, step name, command) of every run: step."""
    return [(j, s.get("name", ""), s["run"]) for j, job in doc["jobs"].items() for s in job["steps"] if "run" in s]


def uses(doc: dict) -> list:
    """(job, step) of every uses: step."""
    return [(j, s) for j, job in doc["jobs"].items() for s in job["steps"] if "uses" in s]


@dataclass
class Run:
    """One rehearsed workflow run: a tag push of ``tag``."""

    root: Path
    tag: str
    env: dict  # overrides of the workflow's env (PROFILE, SHARDS)
    matrix: dict  # job -> {axis: values} overrides (fewer shards)
    build_cache: Path
    publish: object = None  # callable(packages_dir: Path) for the PyPI publish step
    extra_env: dict = field(default_factory=dict)  # e.g. PATH with a stand-in gh
    doc: dict = field(default_factory=load)
    log: list = field(default_factory=list)  # (job, cell, step name, what ran)
    outputs: dict = field(default_factory=dict)  # (job, cell items, command) -> what the step printed
    job_outputs: dict = field(default_factory=dict)  # job -> its outputs: evaluated, after its cells ran

    def __post_init__(self):
        self.artifacts = self.root / "artifacts"
        self.artifacts.mkdir(parents=True, exist_ok=True)
        # setup-python: `python` is an interpreter with the standard library and nothing installed (a venv
        # of the base interpreter without pip), as a job that runs no ci/bootstrap.sh has
        bare = self.root / "setup-python"
        if not (bare / "bin" / "python").exists():
            subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip",
                            str(bare)], check=True, timeout=120)
        self.bin = bare / "bin"

    # ------------------------------------------------------------ expressions

    def _github(self, ws: Path) -> dict:
        return {"github.workspace": str(ws), "github.ref_type": "tag", "github.ref_name": self.tag,
                "github.ref": f"refs/tags/{self.tag}", "github.event_name": "push", "github.token": "rehearsal-token",
                "github.event.inputs.profile || 'full'": "full", "github.workflow": "wheels"}

    def needs(self, job: str) -> list:
        """The jobs ``job`` needs (``needs:`` is one name or a list)."""
        needs = self.doc["jobs"][job].get("needs", [])
        return [needs] if isinstance(needs, str) else list(needs)

    def needs_context(self, job: str) -> dict:
        """``needs.<n>.outputs.<k>`` of every job ``job`` needs (its direct
        dependencies only, as on GitHub), from the outputs they left."""
        return {f"needs.{n}.outputs.{k}": v for n in self.needs(job) for k, v in self.job_outputs.get(n, {}).items()}

    def expr(self, text, ctx: dict) -> str:
        if not isinstance(text, str):
            return text

        def one(m):
            e = m.group(1)
            if e in ctx:
                return str(ctx[e])
            raise AssertionError(f"the rehearsal does not know the expression ${{{{ {e} }}}} in {text!r}")
        return _EXPR.sub(one, text)

    def condition(self, cond, ctx: dict) -> bool:
        """The few ``if:`` the workflow has, as a tag push evaluates them."""
        if cond is None:
            return True
        known = {
            "github.ref_type != 'tag' && steps.restore.outputs.cache-hit != 'true'": False,
            "github.event_name == 'push' && startsWith(github.ref, 'refs/tags/v')": self.tag.startswith("v"),
        }
        if cond not in known:
            raise AssertionError(f"the rehearsal does not know the condition {cond!r}")
        return known[cond]

    # ------------------------------------------------------------ jobs

    def cells(self, job: str) -> list:
        m = dict((self.doc["jobs"][job].get("strategy") or {}).get("matrix") or {})
        m.update(self.matrix.get(job, {}))
        ctx = self.needs_context(job)
        for axis, values in m.items():
            if isinstance(values, str):  # `${{ fromJSON(X) }}`, X a needed job's output: the list it holds
                whole = _EXPR.fullmatch(values)
                inner = _FROM_JSON.fullmatch(whole.group(1)) if whole else None
                if not inner or inner.group(1).strip() not in ctx:
                    raise AssertionError(f"{job}: the rehearsal does not know the matrix axis {axis}: {values!r} "
                                         f"(it knows ${{{{ fromJSON(X) }}}} with X one of {sorted(ctx)})")
                m[axis] = json.loads(ctx[inner.group(1).strip()])
                assert isinstance(m[axis], list), f"{job}: matrix axis {axis}: {values!r} is {m[axis]!r}, not a list"
        axes = sorted(m)
        return [dict(zip(axes, values)) for values in product(*(m[a] for a in axes))] or [{}]

    def order(self) -> list:
        """The jobs in an order their ``needs`` allow."""
        jobs, done = self.doc["jobs"], []
        while len(done) < len(jobs):
            for name in jobs:
                if name not in done and all(n in done for n in self.needs(name)):
                    done.append(name)
        return done

    def run_all(self) -> None:
        for job in self.order():
            self.run_job(job)

    def run_job(self, job: str) -> None:
        spec = self.doc["jobs"][job]
        self.job_outputs[job] = {}
        for cell in self.cells(job):
            ws = self.root / "ws" / "-".join([job, *map(str, cell.values())])
            ctx = {**self._github(ws), **self.needs_context(job), **{f"matrix.{k}": v for k, v in cell.items()}}
            if not self.condition(spec.get("if"), ctx):
                self.log.append((job, cell, None, "skipped (if)"))
                continue
            env = {k: self.expr(v, ctx) for k, v in self.doc.get("env", {}).items()}
            env.update(self.env)
            env.update({k: self.expr(v, ctx) for k, v in (spec.get("env") or {}).items()})
            ctx.update({f"env.{k}": v for k, v in env.items()})
            steps: dict = {}
            for step in spec["steps"]:
                self._step(job, cell, ws, step, env, ctx, steps)
            # a matrix job's outputs: each cell sets them, the last one's stand (GitHub keeps one of them)
            done = {**ctx, **steps_context(steps)}
            self.job_outputs[job].update({k: self.expr(v, done) for k, v in (spec.get("outputs") or {}).items()})

    def _step(self, job, cell, ws: Path, step: dict, env: dict, ctx: dict, steps: dict) -> None:
        ctx = {**ctx, **steps_context(steps)}
        name = step.get("name") or step.get("uses") or step.get("run")
        if not self.condition(step.get("if"), ctx):
            self.log.append((job, cell, name, "skipped (if)"))
            return
        with_ = {k: self.expr(v, ctx) for k, v in (step.get("with") or {}).items()}
        step_env = {**env, **{k: self.expr(v, ctx) for k, v in (step.get("env") or {}).items()}}
        if "run" in step:
            steps[step.get("id", f"_{len(steps)}")] = self._run(job, cell, ws, name, step["run"], step_env)
            return
        action = step["uses"].split("@")[0]
        if action == "actions/checkout":
            assert with_.get("persist-credentials") is False, f"{job}: a checkout keeps its credentials"
            shutil.rmtree(ws, ignore_errors=True)
            ws.mkdir(parents=True)
            for entry in CHECKOUT:  # what the steps read; everything they write stays in the workspace
                (ws / entry).symlink_to(REPO / entry)
            (ws / ".venv").symlink_to(Path(sys.prefix))  # ci/bootstrap.sh's venv: the one running the suite
        elif action == "actions/setup-python":
            pass  # PATH starts with self.bin (an interpreter with nothing installed)
        elif action == "actions/cache/restore":
            target = ws / with_["path"]
            if not target.exists():
                target.symlink_to(self.build_cache)
            steps[step.get("id", "_restore")] = {"cache-hit": "false", "cache-matched-key": ""}
        elif action == "actions/cache/save":
            pass  # restored in place: what the steps stored is in the session's cache already
        elif action == "actions/upload-artifact":
            self._upload(ws, with_)
        elif action == "actions/download-artifact":
            self._download(ws, with_)
        elif action == "pypa/gh-action-pypi-publish":
            assert self.publish is not None, "no stand-in for the publish step"
            self.publish(ws / with_.get("packages-dir", "dist"))
        else:
            raise AssertionError(f"the rehearsal does not know the action {action}")
        self.log.append((job, cell, name, action))

    def _run(self, job, cell, ws: Path, name: str, command: str, env: dict) -> dict:
        assert "${{" not in command, f"{job}: {name}: an expression inside run: (pass it through env:)"
        stand_in = STAND_INS.get(command.strip())
        if stand_in is not None:
            command, why = stand_in
            self.log.append((job, cell, name, f"stand-in: {command or 'nothing'} ({why})"))
            if command is None:
                return {}
        outputs = ws / f".github-output-{len(self.log)}"
        outputs.write_text("")
        full = dict(os.environ)
        for var in [v for v in full if v.startswith(("GITHUB_", "RUNNER_"))]:
            del full[var]
        full.update(env)
        full.update(self.extra_env)
        full.update(GITHUB_WORKSPACE=str(ws), GITHUB_REF_TYPE="tag", GITHUB_REF_NAME=self.tag,
                    GITHUB_REF=f"refs/tags/{self.tag}", GITHUB_EVENT_NAME="push", GITHUB_OUTPUT=str(outputs),
                    GITHUB_REPOSITORY="rehearsal/dsv41-aot", CI="true")
        full["PATH"] = os.pathsep.join([*self.extra_env.get("PATH", "").split(os.pathsep), str(self.bin),
                                        os.environ.get("PATH", "")]).strip(os.pathsep)
        r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", command], cwd=ws, env=full,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
        self.log.append((job, cell, name, command))
        self.outputs[job, tuple(sorted(cell.items())), command] = r.stdout
        if r.returncode:
            raise AssertionError(f"{job} {cell}: step {name!r} failed (exit {r.returncode}): {command}\n"
                                 f"{r.stdout[-6000:]}")
        return parse_outputs(outputs.read_text())

    # ------------------------------------------------------------ artifacts

    def _upload(self, ws: Path, with_: dict) -> None:
        dest = self.artifacts / with_["name"]
        assert not dest.exists(), f"artifact {with_['name']} uploaded twice"
        patterns = [p.strip() for p in str(with_["path"]).splitlines() if p.strip() and not p.strip().startswith("#")]
        hidden = with_.get("include-hidden-files", False)
        files = []
        for pat in patterns:
            pat = pat.split(" #")[0].strip()
            base = ws / pat
            if base.is_dir():
                files += [(p, p.relative_to(base)) for p in sorted(base.rglob("*")) if p.is_file()]
            else:
                matched = sorted(Path(p) for p in glob.glob(str(base)))
                files += [(p, Path(p.name)) for p in matched if p.is_file()]
        if not hidden:
            files = [(p, rel) for p, rel in files if not any(part.startswith(".") for part in rel.parts)]
        if not files and with_.get("if-no-files-found") == "error":
            raise AssertionError(f"artifact {with_['name']}: no file matches {patterns}")
        for src, rel in files:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest / rel)

    def _download(self, ws: Path, with_: dict) -> None:
        target = ws / with_.get("path", ".")
        if "name" in with_:
            chosen = [self.artifacts / with_["name"]]
        else:
            chosen = sorted(p for p in self.artifacts.iterdir() if fnmatch.fnmatch(p.name, with_["pattern"]))
        # download-artifact v8: one folder an artifact, unless by name, merge-multiple, or one artifact matched
        merge = "name" in with_ or with_.get("merge-multiple", False) or len(chosen) == 1
        assert chosen and all(c.is_dir() for c in chosen), f"no artifact for {with_}"
        for art in chosen:
            shutil.copytree(art, target if merge else target / art.name, dirs_exist_ok=True)


def steps_context(steps: dict) -> dict:
    """``steps.<id>.outputs.<name>`` of the steps that ran (id -> outputs)."""
    return {f"steps.{sid}.outputs.{k}": v for sid, outs in steps.items() for k, v in outs.items()}


def parse_outputs(text: str) -> dict:
    """A GITHUB_OUTPUT file: ``name=value`` and ``name<<DELIM`` ... ``DELIM``."""
    out, lines, i = {}, text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            j = lines.index(delim, i + 1)
            out[name] = "\n".join(lines[i + 1:j])
            i = j + 1
        elif "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
            i += 1
        else:
            i += 1
    return out
