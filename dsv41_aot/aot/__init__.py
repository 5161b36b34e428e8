"""The build side: matrix, kernel sources, compile workers, link and verify.

Runs on CPU-only build machines with FlyDSL, torch (CPU) and vLLM's mono
package installed; nothing here is imported by a serving process
(``dsv41_aot.runtime`` never imports it; ``tests/test_architecture.py``).
"""
