"""`python -m agents.cli`: the same as `fleetdeck-agent`."""

import sys

from agents.cli import main

sys.exit(main())
