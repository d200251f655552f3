"""`python -m apps.scheduling.sim`: see cli.py."""

import sys

from apps.scheduling.sim.cli import main

sys.exit(main())
