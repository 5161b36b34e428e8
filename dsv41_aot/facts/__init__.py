"""Facts, not logic: the GPU architectures and the launch kinds dsv41-aot
knows, each in one table.

Adding an architecture is one :data:`arches.ARCHES` entry plus its axis value
in ``build_matrix.yaml``; adding a launch kind is one :data:`kinds.KINDS`
entry plus the runner call that asks for it in :mod:`coverage`; adding a
vLLM release is one :data:`releases.RELEASES` entry plus its release entry
in ``build_matrix.yaml``. Every other module reads these tables: an
arch or kind not in them is an error wherever it appears, never a default.

Standard library only (the runtime reads them too).
"""

from .arches import ARCHES, Arch, arch_facts
from .kinds import KINDS, Kind, kind_facts
from .releases import NEWEST, RELEASES, Deploy, Release, release_facts

__all__ = ["ARCHES", "Arch", "arch_facts", "KINDS", "Kind", "kind_facts",
           "NEWEST", "RELEASES", "Deploy", "Release", "release_facts"]
