"""`python -m modeld` is the `modeld` command."""

import sys

from modeld.cli import main

sys.exit(main())
