"""``python -m episodelake.cli``: the same command as ``episodelake``."""

import sys

from .main import main

sys.exit(main())
