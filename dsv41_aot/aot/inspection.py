"""``dsv41-aot inspect``: how close each prebuilt launch is to not fitting.

Each row's figures are read again from the stored GPU code object and judged
against the arch's limits (``residency``). The text, ``--json`` and
``--plot`` outputs are described in docs/building.md.
"""

from __future__ import annotations

import io
import itertools
from pathlib import Path

from ..facts.arches import arch_facts
from ..facts.kinds import KINDS, kind_facts
from ..facts.releases import release_facts
from ..keys import BuildKey
from ..errors import OutputDirError
from ..manifest import atomic_write
from ..listing import built_rooms_or_error
from .codeobject import code_object_resources
from ..elf import exported_parts
from .residency import RESOURCES, UNITS, residency_problems, spill_notes, usage, waves_per_simd

LABELS = {"lds": "LDS", "vgprs": "VGPRs", "agprs": "AGPRs", "sgprs": "SGPRs"}
# AGPRs and SGPRs get a panel when some key uses this share of the limit
# (AGPRs: when any key uses any)
BINDS = 0.5


def inspect_dir(root, release: str | None = None) -> list[dict]:
    """One row per stored symbol of ``root`` (of ``release``'s rooms, if given)."""
    rows = []
    for room in built_rooms_or_error(Path(root), release):
        man = room.manifest()
        for key, e in sorted(man.entries.items()):
            man.check_object(key)
            _, code = exported_parts(man.object_path(key).read_bytes(), e.entry)
            res = code_object_resources(code)
            problems = residency_problems(res, man.arch, man.release)  # judged by the release's grid
            rows.append({
                "key": key, "kind": e.kind, "arch": man.arch, "release": man.release,
                "threads": release_facts(man.release).cta_threads, "tokens": e.fields["tokens"],
                "tp": e.fields["tp"], "series": series(BuildKey.parse(key, man.release)),
                "compile_seconds": man.timings.get(key), "bytes": e.bytes,
                "code_object_bytes": e.code_object_bytes, "resources": res,
                "usage": {r: list(v) for r, v in usage(res, man.arch, man.release).items()},
                "waves_per_simd": waves_per_simd(res, man.arch), "resident": not problems, "problems": problems,
                "spills": spill_notes(res),
            })
    return rows


def series(key: BuildKey) -> str:
    """The plot series of a key: its kind and variant, over all TP and fold."""
    parts = [key.kind, f"r{key.ratio}"] if kind_facts(key.kind).whole_layer else [key.kind]
    if key.index:
        parts.append("index")
    target = release_facts(key.release).defaults  # the key's own release's MonoBuild defaults
    if (key.experts, key.topk) != (target["experts"], target["topk"]):
        parts.append(f"e{key.experts}/k{key.topk}")
    return " ".join(parts)


def summary(rows: list[dict]) -> list[dict]:
    """Per (arch, release, kind): the key with least left of each resource, and spills."""
    out: dict = {}
    for r in rows:
        s = out.setdefault((r["arch"], r["release"], r["kind"]),
                           {"arch": r["arch"], "release": r["release"], "kind": r["kind"],
                            "threads": release_facts(r["release"]).cta_threads, "keys": 0, "resources": {},
                            "spills": [], "not_resident": []})
        s["keys"] += 1
        for name, (use, limit) in r["usage"].items():
            best = s["resources"].get(name)
            if best is None or limit - use < best["limit"] - best["use"]:
                s["resources"][name] = {"key": r["key"], "use": use, "limit": limit}
        if r["spills"]:
            s["spills"].append(r["key"])
        if not r["resident"]:
            s["not_resident"].append(r["key"])
    return [out[k] for k in sorted(out)]


def report(root, release: str | None = None) -> dict:
    """The ``--json`` document: ``threads``, limits per arch, rows, summary.

    ``threads`` is None when the releases' grids differ (each row has its own)."""
    rows = inspect_dir(root, release)
    arches = sorted({r["arch"] for r in rows})
    return {"threads": _one_threads(rows), "limits": {a: arch_facts(a).limits() for a in arches},
            "rows": rows, "summary": summary(rows)}


def _one_threads(entries: list[dict]) -> int | None:
    """The threads per CTA shared by every release in ``entries``, else None."""
    found = {release_facts(row["release"]).cta_threads for row in entries}
    return found.pop() if len(found) == 1 else None


def cta_text(entries: list[dict]) -> str:
    """How the text names a CTA: "one 512-thread CTA", or "one CTA" if sizes differ."""
    threads = _one_threads(entries)
    return f"one {threads}-thread CTA" if threads else "one CTA (its release's threads)"


def summary_lines(summ: list[dict]) -> list[str]:
    """The headroom summary as text lines, one line per resource."""
    lines = [f"headroom of {cta_text(summ)} per CU, per arch, vLLM release and kind (tightest key per resource):"]
    for s in summ:
        head = f"{s['arch']} {s['release']} {s['kind']} ({s['keys']} key{'s' if s['keys'] != 1 else ''})"
        for i, name in enumerate(RESOURCES):
            t = s["resources"][name]
            left = 100.0 * (t["limit"] - t["use"]) / t["limit"]
            lines.append(f"  {head if i == 0 else '':31} {LABELS[name]:6} {t['use']:>8,} of {t['limit']:>8,} {UNITS[name]:9}"
                         f" {left:5.1f}% left  {t['key']}")
        shown = ", ".join(s["spills"]) if s["spills"] else "none"
        lines.append(f"  {'':31} spills ({len(s['spills'])}): {shown}")
        if s["not_resident"]:
            lines.append(f"  {'':31} NOT RESIDENT ({len(s['not_resident'])}): {', '.join(s['not_resident'])}")
    return lines


# ---------------------------------------------------------------- the picture


def _panels(rows: list[dict]) -> list[str]:
    """The panels to draw: LDS and VGPRs, and AGPRs or SGPRs where they bind."""
    out = ["lds", "vgprs"]
    for name in ("agprs", "sgprs"):
        if any(r["usage"][name][0] > (0 if name == "agprs" else BINDS * r["usage"][name][1]) for r in rows):
            out.append(name)
    return out


def plot(rows: list[dict], path) -> None:
    """Draw the residency picture of ``rows`` into the PNG file ``path``.

    One row of panels per (arch, release); each panel plots one resource's
    use against step width, one line per series (the max over TP and fold)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.ticker
        import matplotlib.pyplot as plt
    except ImportError:
        from ..errors import ToolchainError

        raise ToolchainError("--plot needs matplotlib", fix="pip install 'dsv41-aot[build]'  (or: pip install matplotlib)") from None

    arches = sorted({(r["arch"], r["release"]) for r in rows})
    panels = _panels(rows)
    fig, axes = plt.subplots(len(arches), len(panels), figsize=(4.6 * len(panels) + 2.2, 3.6 * len(arches)), squeeze=False)
    # a colour map per launch kind, in facts/kinds.py's order
    shades = dict(zip(KINDS, (plt.cm.Blues, plt.cm.Oranges, plt.cm.Greens, plt.cm.Purples, plt.cm.Reds)))
    styles = ["-", "--", "-.", ":"]
    for i, (arch, release) in enumerate(arches):
        mine = [r for r in rows if (r["arch"], r["release"]) == (arch, release)]
        names = sorted({r["series"] for r in mine})  # sorted: a kind's series are adjacent
        by_kind = {kind: list(group) for kind, group in itertools.groupby(names, key=lambda n: n.split()[0])}
        for ax, res in zip(axes[i], panels):
            for kind, group in by_kind.items():
                cmap = shades.get(kind, plt.cm.Greys)
                for m, name in enumerate(group):
                    top: dict = {}
                    for r in mine:
                        if r["series"] == name:
                            top[r["tokens"]] = max(top.get(r["tokens"], 0), r["usage"][res][0])
                    xs = sorted(top)
                    ax.plot(xs, [top[x] for x in xs], color=cmap(0.45 + 0.5 * m / max(len(group) - 1, 1)),
                            linestyle=styles[m % len(styles)], marker="o", markersize=2.5 if len(xs) > 8 else 5,
                            linewidth=1.2, label=name)
            for limit in sorted({r["usage"][res][1] for r in mine}):
                ax.axhline(limit, color="red", linewidth=1.0, linestyle="--", label="the arch's limit")
                ax.annotate(f"limit {limit:,}", (0.99, limit), xycoords=("axes fraction", "data"), ha="right",
                            va="bottom", fontsize=7, color="red")
            spilled = [r for r in mine if r["spills"]]
            if spilled:
                ax.scatter([r["tokens"] for r in spilled], [r["usage"][res][0] for r in spilled], marker="x",
                           color="black", s=36, zorder=5, label=f"spills ({len(spilled)} keys)")
            ax.set_ylim(0, max(max(r["usage"][res]) for r in mine) * 1.08)  # the top use or limit
            ax.set_xlim(0, max(48, max(r["tokens"] for r in mine)) + 1)
            ax.set_title(f"{arch}, vLLM {release}: {LABELS[res]} ({UNITS[res]})", fontsize=10)
            ax.set_xlabel("step width (tokens)", fontsize=8)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
        handles, labels = axes[i][0].get_legend_handles_labels()
        seen = dict(zip(labels, handles))  # one entry per label
        axes[i][-1].legend(seen.values(), seen.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                           title=f"{arch}, vLLM {release}, {len(mine)} keys", title_fontsize=8)
    fig.suptitle(f"Residency of {cta_text(rows)} per CU: use against the arch's limit "
                 "(a line: a kind and variant, max over TP and fold at each width)", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    try:
        atomic_write(Path(path), buf.getvalue())
    except OSError as e:  # a folder, a path under a file, a read-only folder: bad input, named
        raise OutputDirError(f"--plot {path}: cannot write the picture there ({e.strerror or e})",
                             fix="pass --plot FILE.png in a folder you can write") from None
