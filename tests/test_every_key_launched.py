"""Every shipped key, launched: each key of the three shared full deployments
(gfx950 TP4 and TP2: 1,152 keys each, of two vLLM releases; gfx942 TP4: 630) runs its
band's real exported host code through the recording HIP (the suite's one
stand-in for the AMD GPU, MOCK-GPU: dsv41_aot/aot/hiprec/recording_hip.c), and
what HIP is handed is checked against the key's code object's own AMDGPU
metadata (aot/codeobject.py) and the manifest:

- the kernel looked up and launched is the manifest's symbol and the image's kernel;
- the image hashes to the manifest's code_object_sha256 and the room's proof (verified.json);
- grid is the release's persistent grid (facts/releases.py), block the
  kernel's .reqd_workgroup_size, and shared memory fits the arch's LDS;
- the argument segment holds each value at its argument's .offset / .size and
  zeros everywhere else (distinct values per argument, int32 ones negative);
- the stream arrives unchanged in each form vLLM passes (an int, an object
  with .cuda_stream, None);
- one module load and one function lookup per entry and device, however
  many launches.

The deployments are found by ``_smoke.deployment`` (DSV41_AOT_FULL_DEPLOYMENT,
DSV41_AOT_FULL_DEPLOYMENT_GFX942, DSV41_AOT_FULL_DEPLOYMENT_GFX950_TP2, else
the shared folder beside the repository); under CI=true a missing one fails.
Nothing is timed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import _recording_hip as rh
from _smoke import DEPLOYMENTS, deployment

from dsv41_aot.facts.arches import ARCHES
from dsv41_aot.facts.releases import RELEASES
from dsv41_aot.room import Room

# in a fresh process on the recording HIP: every key of every room preloaded
# (each image saved by the stand-in), the layouts written from those images,
# then every key launched three times, once per stream form
_LAUNCH_ALL = """
import json, sys
from pathlib import Path
import _recording_hip as rh
import dsv41_aot
root, arch, images, layouts, out = sys.argv[1:6]

class TorchStream:  # what vLLM passes from torch.cuda.current_stream()
    def __init__(self, handle):
        self.cuda_stream = handle

launchers = []
for release in dsv41_aot.releases(arch, prebuilt=root):
    launchers += dsv41_aot.preload(dsv41_aot.keys(arch, release=release, prebuilt=root), release=release,
                                   prebuilt=root)
rh.write_layouts(Path(images), Path(layouts))
sent = []
for k, l in enumerate(launchers):
    for form in range(3):
        values = []
        for j, slot in enumerate(l.abi[:-1]):  # distinct per argument, key and form; int32 ones negative
            values.append(-(k * 4096 + j * 8 + form + 1) if slot["ctype"] == "int32"
                          else ((k + 1) << 36) + ((j + 1) << 8) + form)
        handle = 0x7F00_0000_0000 + (k << 4) + form
        stream = (handle, TorchStream(handle), None)[form]
        l(*values, stream=stream)
        sent.append(dict(key=l.key, release=l._idx.room.release, values=values, stream=handle if form < 2 else 0,
                         entry=[l.library, l.entry]))
Path(out).write_text(json.dumps(sent))
print(json.dumps(dict(keys={r: sum(l._idx.room.release == r for l in launchers) for r in dsv41_aot.releases(arch, prebuilt=root)},
                      entries=len({(l.library, l.entry) for l in launchers}))))
"""


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_every_shipped_key_hands_hip_what_its_code_object_says(name, recording_hip, tmp_path):
    arch, _, _, shipped = DEPLOYMENTS[name]
    root = deployment(name)
    rooms = launch_every_key(root, arch, recording_hip, tmp_path, shipped)
    # the proven deployments carry their proofs: every key's was checked (gfx950 TP2 ships none)
    if all(room.has("verified.json") for room in rooms):
        assert all(set(room.proof().keys) == set(room.manifest().entries) for room in rooms)


@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
def test_every_smoke_key_hands_hip_what_its_code_object_says(arch, smoke_dir, recording_hip, tmp_path):
    from _smoke import SMOKE_RELEASE_KEYS

    shipped = {r: sum(f"@{arch}:" in k for k in keys) for r, keys in SMOKE_RELEASE_KEYS.items()}
    launch_every_key(smoke_dir, arch, recording_hip, tmp_path, {r: n for r, n in shipped.items() if n})


def launch_every_key(root: Path, arch: str, recording_hip: Path, tmp_path: Path, shipped: dict) -> list:
    """Launch every key of ``root``'s ``arch`` rooms (``shipped``: release ->
    keys) through the recording HIP and check what HIP was handed; the rooms."""
    log, images, layouts, sent_file = tmp_path / "hip.log", tmp_path / "images", tmp_path / "layouts.tsv", \
        tmp_path / "sent.json"
    images.mkdir()
    env = rh.env(recording_hip, log, arch=arch, images=images, layouts=layouts)
    # the installed vLLM is one release: the other room's sources check is waived the documented way
    env["DSV41_AOT_ALLOW_SOURCE_MISMATCH"] = "1"
    proc = rh.python(_LAUNCH_ALL, root, arch, images, layouts, sent_file, env=env, timeout=600)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["keys"] == shipped
    sent = json.loads(sent_file.read_text())
    assert len(sent) == 3 * sum(shipped.values())

    rooms = {r: Room(root, arch, r) for r in shipped}
    entries = {r: room.manifest().entries for r, room in rooms.items()}
    proofs = {r: room.proof().keys for r, room in rooms.items()}  # {} where the room has no proof
    kernels = {f.stem: rh.kernel_metadata(f.read_bytes()) for f in images.glob("*.co")}
    lds = ARCHES[arch].lds_bytes

    launches = rh.calls(log, "hipModuleLaunchKernel")
    assert len(launches) == len(sent) and {c.pid for c in launches} == {launches[0].pid}
    wrong = []
    for want, got in zip(sent, launches):
        entry = entries[want["release"]][want["key"]]
        rel = RELEASES[want["release"]]
        sha = entry.code_object_sha256
        kernel = kernels.get(got["module"])
        problems = []
        if got.status != 0:
            problems.append(f"status {got.status}")
        proof = proofs[want["release"]].get(want["key"])
        if got["module"] != sha or (proof is not None and proof.code_object_sha256 != sha):
            problems.append(f"image {got['module'][:16]} (manifest {sha[:16]})")
        if kernel is None:
            problems.append("image not saved")
            wrong.append((want["key"], problems))
            continue
        if not got["kernel"] == entry.symbol == kernel[".name"]:
            problems.append(f"kernel {got['kernel']}")
        if got["grid"] != f"{rel.grid_ctas},1,1":
            problems.append(f"grid {got['grid']}")
        if got["block"] != ",".join(map(str, kernel[".reqd_workgroup_size"])) \
                or kernel[".reqd_workgroup_size"] != [rel.cta_threads, 1, 1]:
            problems.append(f"block {got['block']}")
        if int(got["shared"]) + kernel[".group_segment_fixed_size"] > lds:
            problems.append(f"shared {got['shared']}")
        if got["kernarg"] != rh.kernarg(kernel, want["values"]):
            problems.append("argument segment")
        if int(got["stream"], 16) != want["stream"] or got["extra"] != "(nil)":
            problems.append(f"stream {got['stream']} extra {got['extra']}")
        if not got["device"] == got["fn_device"] == "0":
            problems.append(f"device {got['device']}")
        if problems:
            wrong.append((want["key"], problems))
    assert not wrong, f"{len(wrong)} of {len(sent)} launches wrong; first: {wrong[:5]}"

    # one load and one lookup per entry and device: three launches each reuse them
    loads, lookups = rh.calls(log, "hipModuleLoadData"), rh.calls(log, "hipModuleGetFunction")
    assert len(loads) == len(lookups) == summary["entries"] and all(c.status == 0 for c in loads + lookups)
    assert len({c["module"] for c in loads}) == len(loads) and {c["device"] for c in loads} == {"0"}
    assert {c["fn"] for c in launches} == {c["fn"] for c in lookups}
    return list(rooms.values())
