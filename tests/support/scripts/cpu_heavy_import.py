"""A module whose import computes for the CPU seconds ``slow_imports.py`` was given (as importing transformers does
for 5-40 s under load): imported, it spins until its process has used them."""

import sys
import time

_seconds = float(sys.argv[1])
_count = 0
while time.process_time() < _seconds:
    _count += 1
