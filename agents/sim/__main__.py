"""`python -m agents.sim ...`: the same as `fleetdeck-agent sim-server ...`."""

import sys

from agents.sim.cli import main

sys.exit(main())
