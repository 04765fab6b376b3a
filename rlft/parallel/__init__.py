"""Processes and parallel backends: this process among the others (dist.py), FSDP2 (fsdp.py) and DeepSpeed ZeRO (zero.py)."""
