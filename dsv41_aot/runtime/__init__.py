"""The runtime half: what a serving process imports to launch prebuilt kernels.

Standard library only. It may import the shared core (``dsv41_aot.errors``,
``keys``, ``manifest``, ``source``, ``facts``) and never ``dsv41_aot.aot``,
``dsv41_aot.cli``, FlyDSL, torch or vLLM: ``tests/test_architecture.py``
walks the imports and fails when that border is crossed.
"""
