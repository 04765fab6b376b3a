from rlft.cli import entry

entry()
