# attack: raise SystemExit(0) at import time
# cause: verdict
raise SystemExit(0)
