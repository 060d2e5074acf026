"""`fleetdeck report`: a run's whole history as one self-contained HTML page of plots and a
summary table, and the same plots as PNG (series: the figures; render: plots and page;
verb: where the history comes from)."""
