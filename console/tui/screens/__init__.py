"""The console's screens: the fleet, a generation node, a training node."""
