"""The console's widgets: each renders a piece of FleetState it is given and asks no node
anything."""
