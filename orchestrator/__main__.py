"""``python -m orchestrator``: see ``orchestrator.cli``."""

import sys

from orchestrator.cli import main

sys.exit(main())
