"""``dsv41_aot.vllm``: the vLLM plugin's public name (``install``,
``uninstall``, ``register``, the ``vllm.general_plugins`` entry point).

The plugin is runtime code and lives in :mod:`dsv41_aot.runtime.vllm_plugin`;
this name is that very module (one module object, one state), not a copy.
"""

import sys

from .runtime import vllm_plugin

sys.modules[__name__] = vllm_plugin
