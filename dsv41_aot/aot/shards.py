"""CI shards: a selection of keys split into N parts of balanced compile time.

The split uses the seconds earlier builds recorded (else an estimate), and
puts every key in exactly one shard, the same on every machine.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import MatrixError
from ..facts.arches import ARCHES as ARCH_FACTS
from ..facts.kinds import KINDS as KINDS_FACTS
from ..keys import BuildKey


def estimate_seconds(key: BuildKey) -> float:
    """A guess of a key's compile seconds on a 2-core CPU, when none is recorded."""
    base, per_token = KINDS_FACTS[key.kind].compile_estimate
    return (base + per_token * key.tokens) * ARCH_FACTS[key.arch].compile_scale


def recorded_seconds(paths) -> dict:
    """(release, key) -> compile seconds: what makes every CI cell cut the same shards.

    Each path is a room's ``timings.json``, a room or arch folder holding
    them, a ``manifest.json`` (read with its sibling timings.json, or an old
    manifest's own ``compile_seconds``), or any {key: seconds} JSON file. The
    release is the room folder's; elsewhere it is None (any release)."""
    import json

    from ..facts.releases import RELEASES
    from ..listing import rooms_of
    from ..manifest import TIMINGS, folder_name, read_timings

    folders = {folder_name(v): v for v in RELEASES}
    files: list = []
    for p in paths or ():
        p = Path(p)
        if p.is_dir():
            rooms = [r.timings_path for r in rooms_of(p) if r.timings_path.is_file()]
            files += rooms if rooms and not (p / TIMINGS).is_file() else [p / TIMINGS]
        else:
            files.append(p)
    out: dict = {}
    for p in files:
        try:
            doc = json.loads(p.read_bytes())
        except (OSError, ValueError) as e:
            raise MatrixError(f"cannot read recorded seconds from {p}: {e}",
                              fix=f"pass --seconds the {TIMINGS} (or manifest.json) a build wrote") from None
        if not isinstance(doc, dict):
            raise MatrixError(f"{p}: not a {{key: seconds}} mapping or a manifest",
                              fix=f"pass --seconds the {TIMINGS} (or manifest.json) a build wrote")
        release = folders.get(p.parent.name)
        if isinstance(doc.get("entries"), dict):  # a manifest
            release = doc.get("release", release)
            found = {k: e["compile_seconds"] for k, e in doc["entries"].items()
                     if isinstance(e, dict) and "compile_seconds" in e}
            found.update(read_timings(p.parent))
        else:
            found = doc
        for key, secs in sorted(found.items()):
            try:
                out[(release, key)] = float(secs)
            except (TypeError, ValueError):
                raise MatrixError(f"{p}: seconds of {key} is {secs!r}, not a number",
                                  fix=f"pass --seconds the {TIMINGS} a build wrote") from None
    return out


def parse_shard(text: str) -> tuple[int, int]:
    """``--shard i/N`` as (i, N)."""
    m = re.fullmatch(r"(\d+)/(\d+)", text or "")
    if not m or not (0 <= int(m[1]) < int(m[2])):
        raise MatrixError(f"bad shard {text!r}: expected i/N with 0 <= i < N", fix="pass --shard 0/4 (shards are numbered from 0)")
    return int(m[1]), int(m[2])


def key_seconds(key: BuildKey, seconds: dict | None) -> float:
    """``key``'s compile seconds in ``seconds`` (``recorded_seconds``'), else its estimate.

    A key recorded for its own release wins over one recorded for any release
    (None, or a bare key string)."""
    seconds = seconds or {}
    for at in ((key.release, str(key)), (None, str(key)), str(key)):
        if at in seconds:
            return float(seconds[at])
    return float(estimate_seconds(key))


def shard(keys: list[BuildKey], index: int, count: int, seconds: dict | None = None) -> list[BuildKey]:
    """Shard ``index`` of ``count``, filled longest first by recorded or estimated seconds."""
    cost = {k: key_seconds(k, seconds) for k in keys}
    loads = [0.0] * count
    out: list[list[BuildKey]] = [[] for _ in range(count)]
    for k in sorted(keys, key=lambda k: (-cost[k], str(k), k.release)):
        i = min(range(count), key=lambda j: (loads[j], j))
        loads[i] += cost[k]
        out[i].append(k)
    return sorted(out[index])
