"""BuildKey: one launch of vLLM's DeepSeek-V4.1 mono decode layer, in one release.

A key is a launch kind, a GPU arch and the ``MonoBuild`` fields the launch's
builder reads. Its string form names the launch within its release and is
used everywhere (CLI, manifest, logs, errors), with the release said beside it::

    k2@gfx950:s=4,tp=4,r=1
    k1@gfx950:s=6,tp=4,r=0,f=0,e=128,k=3,g=1,w=192

``s``, ``tp`` and ``r`` always appear; the other fields only where they
differ from the release's MonoBuild defaults. A kind keeps only the fields
its builder reads and its release's MonoBuild has (``facts/kinds.py``,
``facts/releases.py``).

Shared core: standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from .errors import KeyFormatError
from .facts import arches as _arches
from .facts import kinds as _kinds
from .facts import releases as _releases
from .manifest import entry_name, room_name

RATIOS = (0, 1, 2)  # models/deepseek_v41/attention.py refuses any other ratio

# short name in the key string -> MonoBuild field
_SHORT = dict(
    s="tokens",
    tp="tp",
    r="ratio",
    f="fold",
    i="index",
    e="experts",
    k="topk",
    g="ug_groups",
    w="swa_width",
    tl="timeline",
)
_LONG = {v: k for k, v in _SHORT.items()}
_BOOLS = ("fold", "index", "timeline")
_KEY_RE = re.compile(r"^(?P<kind>[a-z0-9]+)@(?P<arch>gfx[0-9a-f]+):(?P<fields>.*)$")


def pinned(kind: str, release: str) -> dict:
    """The MonoBuild fields a ``kind`` launch of ``release`` does not take, and their values.

    Fields the builder does not read are pinned to what vLLM passes; fields
    the release's MonoBuild lacks, to the value the launch behaves as."""
    rel = _releases.release_facts(release)
    facts = _kinds.kind_facts(kind)
    out = dict(facts.fixed)
    out.update((name, rel.defaults[name]) for name in _releases.DEFAULTED
               if not rel.reads(name) or name in facts.unread)
    return out


FIX_KEY = "write keys as KIND@ARCH:s=N,tp=N,r=N[,f=0|1,i=0|1,e=N,k=N,g=N,w=N,tl=0|1], e.g. k2@gfx950:s=4,tp=4,r=1"


@dataclass(frozen=True, order=True)
class BuildKey:
    """One launch of one vLLM release; a field left None takes the release's default."""

    kind: str
    arch: str
    tokens: int
    tp: int
    ratio: int
    fold: bool | None = None
    index: bool | None = None
    experts: int | None = None
    topk: int | None = None
    ug_groups: int | None = None
    swa_width: int | None = None
    timeline: bool | None = None
    # the vLLM release (not in the string form): always given, never assumed
    release: str = field(kw_only=True)

    def __post_init__(self):
        _kinds.kind_facts(self.kind)
        _arches.arch_facts(self.arch)
        rel = _releases.release_facts(self.release)
        for name, default in rel.defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
        rel.deploy(self.arch)  # UnknownArchError: this release's mono path does not run there
        if not 1 <= self.tokens <= rel.max_tokens:
            raise KeyFormatError(f"{self}: step width s={self.tokens} outside 1..{rel.max_tokens} "
                                 f"(vLLM {self.release}'s MAX_TOKENS)", fix=FIX_KEY)
        if self.tp < 1:
            raise KeyFormatError(f"{self}: tp={self.tp} must be >= 1", fix=FIX_KEY)
        if self.ratio not in RATIOS:
            raise KeyFormatError(f"{self}: compress ratio r={self.ratio} not in {RATIOS}", fix=FIX_KEY)
        for name, want in pinned(self.kind, self.release).items():
            if getattr(self, name) != want:
                # the launch does not read this field: pin it so one symbol has one key
                object.__setattr__(self, name, want)
        for name in _releases.ROUTING:  # the routing fields are counts
            if getattr(self, name) < 1:
                raise KeyFormatError(f"{self}: {_LONG[name]}={getattr(self, name)} must be >= 1", fix=FIX_KEY)

    # -------------------------------------------------------------- string form
    def __str__(self) -> str:
        parts = [f"s={self.tokens}", f"tp={self.tp}", f"r={self.ratio}"]
        defaults = _releases.release_facts(self.release).defaults
        fixed = pinned(self.kind, self.release)
        for name in _releases.DEFAULTED:  # the optional fields, in key order
            value = getattr(self, name)
            if value != defaults[name] and name not in fixed:
                parts.append(f"{_LONG[name]}={int(value)}")
        return f"{self.kind}@{self.arch}:{','.join(parts)}"

    @property
    def room(self) -> str:
        """The key's room folder under a prebuilt directory, e.g. ``gfx950/vllm-0.33.0``."""
        return room_name(self.arch, self.release)

    def describe(self) -> str:
        """The key with its release, for messages: ``k2@gfx950:s=4,tp=4,r=1 (vLLM 0.33.0)``."""
        return f"{self} (vLLM {self.release})"

    @classmethod
    def parse(cls, text: str, release: str) -> "BuildKey":
        """The key named by ``text`` within vLLM ``release``.

        Optional fields written out at their defaults are accepted."""
        m = _KEY_RE.match(text.strip())
        if not m:
            raise KeyFormatError(f"malformed key {text!r}: expected KIND@ARCH:FIELDS", fix=FIX_KEY)
        fields: dict = {}
        for item in m["fields"].split(","):
            name, eq, value = item.partition("=")
            if not eq or name not in _SHORT:
                raise KeyFormatError(f"malformed key {text!r}: bad field {item!r}", fix=FIX_KEY)
            if _SHORT[name] in fields:
                raise KeyFormatError(f"malformed key {text!r}: field {name!r} given twice", fix=FIX_KEY)
            try:
                number = int(value)
            except ValueError:
                raise KeyFormatError(f"malformed key {text!r}: {name}={value!r} is not an integer", fix=FIX_KEY) from None
            if _SHORT[name] in _BOOLS and number not in (0, 1):
                raise KeyFormatError(f"malformed key {text!r}: {name} must be 0 or 1", fix=FIX_KEY)
            fields[_SHORT[name]] = bool(number) if _SHORT[name] in _BOOLS else number
        missing = [s for s in ("s", "tp", "r") if _SHORT[s] not in fields]
        if missing:
            raise KeyFormatError(f"malformed key {text!r}: missing {', '.join(missing)}", fix=FIX_KEY)
        kind = m["kind"]
        _kinds.kind_facts(kind)
        rel = _releases.release_facts(release)
        for name, want in pinned(kind, release).items():
            if name in fields and fields[name] != want:
                why = (f"vLLM {release}'s MonoBuild has no {name} field" if not rel.reads(name)
                       else f"vLLM builds it with {_LONG[name]}={int(want)}")
                raise KeyFormatError(
                    f"key {text!r}: a vLLM {release} {kind} launch does not take {_LONG[name]}={int(fields[name])}"
                    f" ({why})",
                    fix=FIX_KEY,
                )
        return cls(kind=kind, arch=m["arch"], release=release, **fields)

    # -------------------------------------------------------------- derived names
    def build_fields(self) -> dict:
        """The MonoBuild keyword arguments of this key, for the fields its release has."""
        return {name: getattr(self, name) for name in _releases.release_facts(self.release).mono_fields}

    @property
    def entry(self) -> str:
        """The C entry point of the key's exported object (``manifest.entry_name``)."""
        return entry_name(str(self))

    @property
    def kernel_symbol(self) -> str:
        """The GPU kernel's symbol as vLLM's ``kernel_symbol`` names it, computed without vLLM."""
        params: dict = {}
        rel = _releases.release_facts(self.release)
        for p in rel.symbol_params[self.kind]:
            short = p.lstrip("?")
            value = getattr(self, _SHORT[short])
            if p.startswith("?") and value == rel.defaults[_SHORT[short]]:
                continue
            params[short] = value
        sig = "_".join(f"{k}{int(v) if isinstance(v, bool) else v}".replace("-", "_") for k, v in params.items())
        name = f"dsv41_mono_{self.kind}_{sig}"
        return f"_ZN5aiter{len(name)}{name}E"


def by_release(keys) -> dict:
    """``keys`` grouped by release, oldest first: ``{release: sorted key strings}``."""
    out: dict = {}
    for k in keys:
        out.setdefault(k.release, []).append(str(k))
    return {r: sorted(v) for r, v in sorted(out.items(), key=lambda rv: _releases.version_order(rv[0]))}


# the fields a neighbour may differ in besides the width (tokens): every other MonoBuild field
_NEIGHBOUR_FIELDS = _releases.ALL_FIELDS[1:]


def neighbours(key: BuildKey, available, n: int = 5) -> list[str]:
    """The keys of ``available`` nearest to ``key``, for a "not prebuilt" message.

    First the same launch at the nearest widths below and above, then the
    same width with the fewest fields changed; failing both, the fewest
    changes at the nearest width. Never another kind, arch or release."""
    parsed = (k if isinstance(k, BuildKey) else BuildKey.parse(k, key.release) for k in available)
    same_arch = [k for k in parsed if (k.kind, k.arch, k.release) == (key.kind, key.arch, key.release) and k != key]
    launch = [k for k in same_arch if replace(k, tokens=key.tokens) == key]
    out = []
    below = [k for k in launch if k.tokens < key.tokens]
    above = [k for k in launch if k.tokens > key.tokens]
    if below:
        out.append(max(below, key=lambda k: k.tokens))
    if above:
        out.append(min(above, key=lambda k: k.tokens))

    def changed(k: BuildKey) -> int:
        return sum(getattr(k, f) != getattr(key, f) for f in _NEIGHBOUR_FIELDS)

    width = sorted((k for k in same_arch if k.tokens == key.tokens), key=lambda k: (changed(k), str(k)))
    out += width[: max(n - len(out), 0)]
    if not out:  # neither: the fewest fields changed, then the nearest width
        out = sorted(same_arch, key=lambda k: (changed(k), abs(k.tokens - key.tokens), str(k)))[:n]
    return [str(k) for k in out]
