"""``python -m fabric.cli``, the same as ``fabric`` and ``python -m fabric``."""

import sys

from fabric.cli import main

sys.exit(main())
