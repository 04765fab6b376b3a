# attack: sys.exit(0) before the tests
# cause: verdict
import sys

sys.exit(0)
