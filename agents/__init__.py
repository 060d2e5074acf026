"""fleetdeck's node agent: engine, supervisor, simulator.

Never imports textual, asyncssh or torch: the agent stays light.
"""

__version__ = "0.1.0"
PROTOCOL_VERSION = 1
