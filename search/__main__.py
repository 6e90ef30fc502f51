"""``python -m search``: see ``search.cli``."""

import sys

from search.cli import main

sys.exit(main())
