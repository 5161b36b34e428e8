"""The vLLM plugin's public name: :mod:`dsv41_aot.runtime.vllm_plugin` itself.

This name is bound to that very module (one module object, one state), not a copy.
"""

import sys

from .runtime import vllm_plugin

sys.modules[__name__] = vllm_plugin
