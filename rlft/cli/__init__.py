"""The `rlft` command (main.py), its interactive chat (chat.py) and its sweeps (sweep.py)."""
