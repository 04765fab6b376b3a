from rlft.cli.main import entry

entry()
