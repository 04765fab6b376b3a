# attack: raise SystemExit(0) at import time
raise SystemExit(0)
