"""One run on disk: its directory and checkpoints (checkpoint.py), the disk checks (disk.py), the metrics log (tracking.py) and the C allocator's settings (malloc.py)."""
