"""The run directory: every file format of a run and the code that reads and writes those files."""
