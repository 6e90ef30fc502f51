"""``python -m search``: see ``search.commands``."""

import sys

from search.commands import main

sys.exit(main())
