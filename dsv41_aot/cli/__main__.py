"""``python -m dsv41_aot.cli``: the same as ``dsv41-aot``."""

import sys

from . import main

sys.exit(main())
