# attack: sys.exit(0) before the tests
import sys

sys.exit(0)
