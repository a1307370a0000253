"""A Python worker with batch jobs: a steady base, and every few seconds a batch that holds a
large buffer for a moment and frees it (bursts that return, not a leak); then, halfway, a model
reload that replaces the model with a bigger one (a step that stays).
    python batch_bursts.py BASE_MB BATCH_MB PERIOD_S [RELOAD_AT_S RELOAD_MB]
"""

import sys
import time

MB = 2**20


def touched(size: int) -> bytearray:
    buf = bytearray(size)
    buf[::4096] = b"\x01" * len(range(0, size, 4096))
    return buf


base_mb, batch_mb, period = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
reload_at = float(sys.argv[4]) if len(sys.argv) > 4 else None
reload_mb = int(sys.argv[5]) if len(sys.argv) > 5 else 0
model = touched(base_mb * MB)
start = time.monotonic()
next_batch = start + period
while True:
    now = time.monotonic()
    if reload_at is not None and now - start >= reload_at:
        model = None
        model = touched(reload_mb * MB)  # the new model, kept
        reload_at = None
    if now >= next_batch:
        batch = touched(batch_mb * MB)
        time.sleep(period * 0.3)
        del batch
        next_batch += period
    time.sleep(0.05)
