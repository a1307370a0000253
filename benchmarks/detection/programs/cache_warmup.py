"""A Python server whose cache fills as requests arrive, then stops growing (a warm-up plateau).

Each tick serves requests for keys drawn from a fixed set; a miss stores a 64 KiB value. The
hit rate rises and the cache saturates at the size of the key set: growth that decelerates.
    python cache_warmup.py KEYS REQUESTS_PER_TICK      (a tick is 20 ms)
"""

import random
import sys
import time

keys = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
per_tick = int(sys.argv[2]) if len(sys.argv) > 2 else 4
rng = random.Random(1)
cache: dict[int, bytearray] = {}
while True:
    for _ in range(per_tick):
        key = rng.randrange(keys)
        if key not in cache:
            value = bytearray(65536)
            value[::4096] = b"\x01" * 16  # touch every page
            cache[key] = value
    time.sleep(0.02)
