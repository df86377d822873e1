"""Entry points: parse arguments, call policy, print; the only layer that exits the process."""
