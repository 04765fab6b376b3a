import sys

from rlft.cli import main

sys.exit(main())
