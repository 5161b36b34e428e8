"""Facts, not logic: the arches, launch kinds and vLLM releases dsv41-aot knows.

Each is one table. Adding an arch is one :data:`arches.ARCHES` entry plus
its ``Deploy`` in each release that runs it; a kind, one :data:`kinds.KINDS`
entry plus its runner call in :mod:`dsv41_aot.deployment`; a release, one
:data:`releases.RELEASES` entry plus its digest in ``build_matrix.yaml``.
A name not in these tables is an error wherever it appears, never a default.

Standard library only (the runtime reads them too), and the lowest layer of
the package: nothing here imports keys, rooms or manifests
(tests/test_architecture.py checks it).
"""
