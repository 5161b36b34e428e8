"""What a GPU code object asks of a CU, and whether one mono CTA fits.

The mono launches are persistent: 256 CTAs of 512 threads, all resident at
once, handing work over through mailboxes. A CTA that cannot be resident one
per CU deadlocks on the GPU, so every symbol's figures are read from its code
object at build time and checked here (``dsv41-aot inspect`` prints them).

Figures come from two places in the AMDGPU ELF (code object v5):

- the ``NT_AMDGPU_METADATA`` note (owner ``AMDGPU``, type 32), a MessagePack
  map whose ``amdhsa.kernels[0]`` holds register counts, LDS and scratch
  bytes, the kernarg layout; decoded by the small ``unpackb`` below;
- the kernel descriptor (``<kernel>.kd``, 64 bytes), whose
  ``COMPUTE_PGM_RSRC1`` / ``RSRC3`` fields are what the hardware allocates:
  VGPR granules and, on gfx90a and later, the AGPR offset ``accum_offset``.

This module is named ``resources`` rather than ``inspect`` so that it can
never shadow the standard library's ``inspect`` module; the CLI command it
registers is still ``dsv41-aot inspect``.

Standard library only (the check runs inside build workers and in the CLI).
"""

from __future__ import annotations

import struct

from ..facts.arches import arch_facts
from .elf import Elf, ElfError

NT_AMDGPU_METADATA = 32

# Per-CU limits come from the arch table (dsv41_aot/facts/arches.py).
MONO_THREADS = 512  # vLLM 0.33.0 mono launches: 512 threads a CTA


class MsgpackError(ValueError):
    """Bytes that are not the MessagePack document the AMDGPU note holds."""


# ---------------------------------------------------------------- MessagePack


def unpackb(data: bytes):
    """Decode one MessagePack value (the subset AMDGPU metadata uses, plus
    the rest of the format's fixed types so nothing valid is refused)."""
    value, end = _unpack(memoryview(data), 0)
    if end != len(data):
        raise MsgpackError(f"{len(data) - end} trailing bytes after the MessagePack value")
    return value


def _take(buf, pos: int, n: int) -> tuple[bytes, int]:
    if pos + n > len(buf):
        raise MsgpackError(f"truncated MessagePack value at byte {pos}")
    return bytes(buf[pos : pos + n]), pos + n


def _num(buf, pos: int, fmt: str):
    raw, pos = _take(buf, pos, struct.calcsize(fmt))
    return struct.unpack(fmt, raw)[0], pos


def _seq(buf, pos: int, n: int):
    out = []
    for _ in range(n):
        v, pos = _unpack(buf, pos)
        out.append(v)
    return out, pos


def _map(buf, pos: int, n: int):
    out = {}
    for _ in range(n):
        k, pos = _unpack(buf, pos)
        v, pos = _unpack(buf, pos)
        out[k] = v
    return out, pos


_SIZED = {  # tag -> (length format, what follows)
    0xC4: (">B", "bin"), 0xC5: (">H", "bin"), 0xC6: (">I", "bin"),
    0xD9: (">B", "str"), 0xDA: (">H", "str"), 0xDB: (">I", "str"),
    0xDC: (">H", "array"), 0xDD: (">I", "array"),
    0xDE: (">H", "map"), 0xDF: (">I", "map"),
}
_SCALARS = {
    0xCA: ">f", 0xCB: ">d", 0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
    0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q",
}
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
_EXT = {0xC7: ">B", 0xC8: ">H", 0xC9: ">I"}


def _unpack(buf, pos: int):
    if pos >= len(buf):
        raise MsgpackError(f"truncated MessagePack value at byte {pos}")
    tag = buf[pos]
    pos += 1
    if tag <= 0x7F:
        return tag, pos
    if tag >= 0xE0:
        return tag - 0x100, pos
    if 0x80 <= tag <= 0x8F:
        return _map(buf, pos, tag & 0x0F)
    if 0x90 <= tag <= 0x9F:
        return _seq(buf, pos, tag & 0x0F)
    if 0xA0 <= tag <= 0xBF:
        raw, pos = _take(buf, pos, tag & 0x1F)
        return raw.decode(), pos
    if tag == 0xC0:
        return None, pos
    if tag in (0xC2, 0xC3):
        return tag == 0xC3, pos
    if tag in _SCALARS:
        return _num(buf, pos, _SCALARS[tag])
    if tag in _SIZED:
        fmt, what = _SIZED[tag]
        n, pos = _num(buf, pos, fmt)
        if what == "array":
            return _seq(buf, pos, n)
        if what == "map":
            return _map(buf, pos, n)
        raw, pos = _take(buf, pos, n)
        return (raw.decode() if what == "str" else raw), pos
    if tag in _FIXEXT or tag in _EXT:
        n = _FIXEXT[tag] if tag in _FIXEXT else None
        if n is None:
            n, pos = _num(buf, pos, _EXT[tag])
        ext_type, pos = _num(buf, pos, ">b")
        raw, pos = _take(buf, pos, n)
        return (ext_type, raw), pos
    raise MsgpackError(f"unused MessagePack tag 0x{tag:02x} at byte {pos - 1}")


# ---------------------------------------------------------------- code object


def amdgpu_metadata(code: bytes) -> dict:
    """The decoded NT_AMDGPU_METADATA note of a GPU code object."""
    for owner, ntype, desc in Elf(code).notes():
        if owner == "AMDGPU" and ntype == NT_AMDGPU_METADATA:
            doc = unpackb(desc)
            if not isinstance(doc, dict):
                raise MsgpackError("AMDGPU metadata note is not a map")
            return doc
    raise ElfError("GPU code object has no AMDGPU metadata note (NT_AMDGPU_METADATA)")


def kernel_descriptor(code: bytes, kd_symbol: str) -> dict:
    """Allocation figures from the 64-byte kernel descriptor ``kd_symbol``
    (AMDGPUUsage, "Kernel Descriptor" for code object v3+)."""
    elf = Elf(code)
    sym = next((s for s in elf.symbols() if s.name == kd_symbol), None)
    if sym is None or not 0 < sym.shndx < len(elf.sections):
        raise ElfError(f"GPU code object has no kernel descriptor {kd_symbol}")
    sec = elf.sections[sym.shndx]
    off = sym.value - elf.sections[sym.shndx].addr
    kd = elf.section_bytes(sec)[off : off + 64]
    if len(kd) != 64:
        raise ElfError(f"kernel descriptor {kd_symbol} is cut short")
    lds, scratch, kernarg = struct.unpack_from("<III", kd, 0)
    rsrc3, rsrc1, rsrc2 = struct.unpack_from("<III", kd, 44)
    return {
        "lds_bytes": lds,
        "scratch_bytes": scratch,
        "kernarg_bytes": kernarg,
        # GRANULATED_WORKITEM_VGPR_COUNT: (granules - 1), granule 8 on gfx90a+
        "vgpr_granules": (rsrc1 & 0x3F) + 1,
        # ACCUM_OFFSET (gfx90a+): first AGPR, in units of 4, minus 1
        "accum_offset": ((rsrc3 & 0x3F) + 1) * 4,
        "rsrc1": rsrc1,
        "rsrc2": rsrc2,
        "rsrc3": rsrc3,
    }


def code_object_resources(code: bytes) -> dict:
    """The figures of the (single) kernel in GPU code object ``code``: what
    the manifest stores as an entry's ``resources``. JSON-ready."""
    doc = amdgpu_metadata(code)
    kernels = doc.get("amdhsa.kernels") or []
    if len(kernels) != 1:
        raise ElfError(f"GPU code object holds {len(kernels)} kernels, a mono launch has exactly 1")
    k = kernels[0]

    def need(field):
        if field not in k:
            raise ElfError(f"AMDGPU metadata of {k.get('.name', '?')} lacks {field}")
        return k[field]

    res = {
        "name": need(".name"),
        "symbol": need(".symbol"),
        "target": doc.get("amdhsa.target", ""),
        "vgpr_count": need(".vgpr_count"),
        "agpr_count": k.get(".agpr_count", 0),
        "sgpr_count": need(".sgpr_count"),
        "vgpr_spill_count": k.get(".vgpr_spill_count", 0),
        "sgpr_spill_count": k.get(".sgpr_spill_count", 0),
        "lds_bytes": need(".group_segment_fixed_size"),
        "scratch_bytes": need(".private_segment_fixed_size"),
        "dynamic_stack": bool(k.get(".uses_dynamic_stack", False)),
        "kernarg_bytes": need(".kernarg_segment_size"),
        "wavefront_size": need(".wavefront_size"),
        "max_flat_workgroup_size": need(".max_flat_workgroup_size"),
        "args": [
            {"offset": a[".offset"], "size": a[".size"], "value_kind": a[".value_kind"]}
            for a in k.get(".args", [])
        ],
    }
    kd = kernel_descriptor(code, res["symbol"])
    res["vgpr_alloc"] = kd["vgpr_granules"] * 8
    res["accum_offset"] = kd["accum_offset"]
    for figure in ("lds_bytes", "scratch_bytes", "kernarg_bytes"):
        if kd[figure] != res[figure]:
            raise ElfError(
                f"{res['name']}: kernel descriptor says {figure}={kd[figure]}, metadata note says {res[figure]}"
            )
    return res


def _round_up(n: int, granule: int) -> int:
    return -(-n // granule) * granule


def manifest_figures(res: dict) -> dict:
    """What a manifest entry keeps of ``code_object_resources``: every figure
    but the per-argument kernarg layout (``verify`` reads that from the code
    object itself), which would triple the manifest the runtime parses."""
    out = {k: v for k, v in res.items() if k != "args"}
    out["kernarg_count"] = len(res["args"])
    return out


def residency_problems(res: dict, arch: str, threads: int = MONO_THREADS) -> list[str]:
    """Why one CTA of ``threads`` threads of this kernel cannot be resident on
    one CU of ``arch`` (empty when it can). Each reason names the figure and
    the limit. Scratch use (a register spill) is a problem too: the mono
    launches are built never to spill."""
    lim = arch_facts(arch).limits()
    out = []
    wave = res["wavefront_size"]
    waves = -(-threads // wave)
    per_simd = -(-waves // lim["simds"])  # the CTA's waves spread over the CU's SIMDs
    if res["max_flat_workgroup_size"] < threads:
        out.append(f"max_flat_workgroup_size {res['max_flat_workgroup_size']} < {threads} threads a CTA")
    lds = _round_up(res["lds_bytes"], lim["lds_granule"])
    if lds > lim["lds_bytes"]:
        out.append(
            f"LDS {res['lds_bytes']} bytes ({lds} allocated in {lim['lds_granule']}-byte granules)"
            f" > {lim['lds_bytes']} bytes a CU on {arch}"
        )
    if res["scratch_bytes"] or res["dynamic_stack"]:
        out.append(
            f"scratch (private segment) {res['scratch_bytes']} bytes a lane"
            f"{' and a dynamic stack' if res['dynamic_stack'] else ''} > 0: the kernel spills"
            f" (VGPR spills {res['vgpr_spill_count']}, SGPR spills {res['sgpr_spill_count']})"
        )
    # .vgpr_count is the unified total, arch VGPRs (rounded up to 4) + AGPRs
    arch_vgprs = res["vgpr_count"] - res["agpr_count"]
    if arch_vgprs > lim["max_arch_vgprs"]:
        out.append(f"{arch_vgprs} arch VGPRs > {lim['max_arch_vgprs']} a wave can address")
    if res["agpr_count"] > lim["max_agprs"]:
        out.append(f"{res['agpr_count']} AGPRs > {lim['max_agprs']} a wave can address")
    alloc = max(res.get("vgpr_alloc", 0), _round_up(max(res["vgpr_count"], 1), lim["vgpr_granule"]))
    budget = lim["vgprs_per_simd"] // per_simd
    if alloc > budget:
        out.append(
            f"VGPRs {res['vgpr_count']} (AGPRs {res['agpr_count']}; {alloc} allocated in granules of"
            f" {lim['vgpr_granule']}) > {budget} a wave: {waves} waves of {wave} are {per_simd} a SIMD"
            f" sharing {lim['vgprs_per_simd']} registers a lane on {arch}"
        )
    sgprs = _round_up(max(res["sgpr_count"], 1), lim["sgpr_granule"])
    if sgprs * per_simd > lim["sgprs_per_simd"]:
        out.append(
            f"SGPRs {res['sgpr_count']} ({sgprs} allocated) x {per_simd} waves a SIMD"
            f" > {lim['sgprs_per_simd']} a SIMD on {arch}"
        )
    return out


def waves_per_simd(res: dict, arch: str) -> int:
    """How many waves of this kernel one SIMD can hold by registers alone."""
    lim = arch_facts(arch).limits()
    alloc = max(res.get("vgpr_alloc", 0), _round_up(max(res["vgpr_count"], 1), lim["vgpr_granule"]))
    return min(lim["vgprs_per_simd"] // alloc, lim["sgprs_per_simd"] // _round_up(max(res["sgpr_count"], 1), lim["sgpr_granule"]))


# ---------------------------------------------------------------- dsv41-aot inspect


def inspect_dir(root) -> list[dict]:
    """One row per stored symbol of prebuilt directory ``root``: its figures
    read from the stored object's GPU code object, its residency verdict,
    and the manifest's compile seconds and sizes."""
    from pathlib import Path

    from .elf import exported_parts
    from ..errors import AotError
    from ..manifest import Manifest, arch_dirs

    root = Path(root)
    dirs = arch_dirs(root)
    if not dirs:
        raise AotError(f"{root} holds no prebuilt architecture (no <arch>/manifest.json)", fix=f"dsv41-aot build --out {root}")
    rows = []
    for d in dirs:
        man = Manifest.read(d)
        for key in sorted(man.entries):
            e = man.entries[key]
            man.check_object(key)
            _, code = exported_parts(man.object_path(key).read_bytes(), e["entry"])
            res = code_object_resources(code)
            problems = residency_problems(res, man.arch)
            rows.append({
                "key": key, "kind": e["kind"], "arch": man.arch, "tokens": e["fields"]["tokens"],
                "tp": e["fields"]["tp"], "compile_seconds": e["compile_seconds"], "bytes": e["bytes"],
                "code_object_bytes": e["code_object_bytes"], "resources": res,
                "waves_per_simd": waves_per_simd(res, man.arch), "resident": not problems, "problems": problems,
            })
    return rows


def plot(rows: list[dict], path) -> None:
    """PNG: compile seconds and GPU code object bytes against step width, one
    line per kind, arch and TP (matplotlib, a build-side dependency)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from ..errors import ToolchainError

        raise ToolchainError("--plot needs matplotlib", fix="pip install 'dsv41-aot[build]'  (or: pip install matplotlib)") from None
    from pathlib import Path

    from ..manifest import atomic_write

    series: dict = {}
    for r in rows:
        series.setdefault((r["kind"], r["arch"], r["tp"]), []).append(r)
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for (kind, arch, tp), rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: r["tokens"])
        s = [r["tokens"] for r in rs]
        label = f"{kind} {arch} tp{tp}"
        style = dict(marker="o", linestyle="-" if arch == "gfx950" else "--", label=label)
        ax_t.plot(s, [r["compile_seconds"] for r in rs], **style)
        ax_b.plot(s, [r["code_object_bytes"] / 1024 for r in rs], **style)
    ax_t.set(xlabel="step width (tokens)", ylabel="compile seconds", title="FlyDSL compile time per symbol")
    ax_b.set(xlabel="step width (tokens)", ylabel="GPU code object KiB", title="GPU code object size per symbol")
    for ax in (ax_t, ax_b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write(Path(path), buf.getvalue())


def register(sub) -> None:
    from ..manifest import prebuilt_dir

    p = sub.add_parser("inspect", help="GPU resources of every prebuilt symbol and whether one CTA per CU is resident")
    p.add_argument("--dir", default=str(prebuilt_dir()), help="prebuilt directory (default: $DSV41_AOT_PREBUILT, else kernels_prebuilt/)")
    p.add_argument("--json", action="store_true", help="print one JSON array, a row per symbol")
    p.add_argument("--plot", metavar="FILE.png", help="write a PNG of compile seconds and code object bytes by kind and step width")
    p.set_defaults(func=run)


def run(args) -> int:
    """Exit 1 when any symbol cannot be resident (or spills), else 0."""
    rows = inspect_dir(args.dir)
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        import json

        print(json.dumps(rows, indent=1))
    else:
        print(f"{'key':40} {'VGPR':>4} {'AGPR':>4} {'SGPR':>4} {'LDS':>7} {'scratch':>7} {'kernarg':>7} {'wave':>4} {'w/SIMD':>6}  resident")
        for r in rows:
            x = r["resources"]
            print(
                f"{r['key']:40} {x['vgpr_count']:4d} {x['agpr_count']:4d} {x['sgpr_count']:4d} {x['lds_bytes']:7d}"
                f" {x['scratch_bytes']:7d} {x['kernarg_bytes']:7d} {x['wavefront_size']:4d} {r['waves_per_simd']:6d}"
                f"  {'yes' if r['resident'] else 'NO'}"
            )
            for prob in r["problems"]:
                print(f"    {prob}")
        bad = sum(not r["resident"] for r in rows)
        print(f"{len(rows)} symbols, {bad} cannot be resident one 512-thread CTA per CU"
              + (f"; plot: {args.plot}" if args.plot else ""))
    return 1 if any(not r["resident"] for r in rows) else 0


__all__ = [
    "MsgpackError", "amdgpu_metadata", "code_object_resources", "kernel_descriptor",
    "inspect_dir", "plot", "register", "residency_problems", "run", "unpackb", "waves_per_simd",
]
