"""Programs shaped like real services, unlike the one-leak programs of `support.histo`, for judging medic
on workloads it was not tuned on. Each prints `ready PID` once it runs, then serves "requests" until
killed.

- `SESSIONS_C` (C): leaks from two call sites at different rates (`remember_session` about four times
  faster than `append_audit`) while `serve_request` churns far more short-lived memory than both
  leak together, and `cache_result` keeps a bounded ring;
- `MODEL_SERVER_C` (C): a large stable heap (`load_weights`, loaded once) with a small leak
  (`intern_token`) beside churn (`decode_batch`);
- `BATCHES_C` (C, glibc, threads): worker threads handle batches of small parts; one part in 32
  outlives its batch in a shared pool of fixed size (a random older one is freed), the rest are freed.
  Concurrency rises one worker every few rounds up to 16: each new worker's arena is left full of holes
  pinned by the survivors, so RSS grows for a quarter of a minute while the live bytes stay flat
  (glibc's per-thread arenas: fragmentation, not a leak);
- `FEATURE_STORE_PY` (Python, in-process hook): a module-global list of dicts that only grows
  (`remember`) beside a dict of in-flight requests that grows and is emptied again;
- `EMBEDDING_CACHE_PY` (Python): an embedding cache warming under skewed (Zipf) traffic, bounded at
  `cap` entries (the oldest evicted): memory rises fast, slows as the hit rate climbs, then holds;
- `ACCOUNTS_JAVA` (JVM): a static HashMap of a custom class that only grows, among request garbage
  (`Object[]` of growing lists, strings, boxed numbers); with `stable` a large heap built once that
  then only makes garbage (many collections, no growth).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

SESSIONS_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile sink;
static void **sessions, **audit;
static size_t nsessions, cap_sessions, naudit, cap_audit;
static char *ring[512];
static unsigned long rng = 88172645463325252UL;
static unsigned long next_random(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

static void push(void ***list, size_t *n, size_t *cap, void *p) {
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 4096;
        *list = realloc(*list, *cap * sizeof **list);
    }
    (*list)[(*n)++] = p;
}

__attribute__((noinline)) void remember_session(void) {
    char *p = malloc(12288);
    memset(p, 1, 12288);
    push(&sessions, &nsessions, &cap_sessions, p);
}

__attribute__((noinline)) void append_audit(void) {
    char *p = malloc(3072);
    memset(p, 2, 3072);
    push(&audit, &naudit, &cap_audit, p);
}

__attribute__((noinline)) void serve_request(void) {
    char *parts[24];
    for (int i = 0; i < 24; i++) {
        size_t size = 4096 + next_random() % 61440;
        parts[i] = malloc(size);
        memset(parts[i], 3, size < 8192 ? size : 8192);
    }
    sink = parts[next_random() % 24];
    for (int i = 0; i < 24; i++) free(parts[i]);
}

__attribute__((noinline)) void cache_result(void) {
    unsigned slot = next_random() % 512;
    free(ring[slot]);
    ring[slot] = malloc(16384);
    memset(ring[slot], 4, 16384);
}

int main(int argc, char **argv) {
    int sessions_per_tick = argc > 1 ? atoi(argv[1]) : 16;
    int tick_us = argc > 2 ? atoi(argv[2]) : 50000;
    printf("ready %d\n", getpid());
    fflush(stdout);
    for (unsigned long tick = 0;; tick++) {
        for (int i = 0; i < 40; i++) serve_request();
        for (int i = 0; i < 20; i++) cache_result();
        for (int i = 0; i < sessions_per_tick; i++) remember_session();
        for (int i = 0; i < sessions_per_tick; i++) append_audit();
        usleep(tick_us);
    }
}
"""

MODEL_SERVER_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile sink;
static char **weights;
static char **tokens;
static size_t ntokens, cap_tokens;
static unsigned long rng = 2463534242UL;
static unsigned long next_random(void) { rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5; return rng; }

__attribute__((noinline)) void load_weights(int mib) {
    weights = malloc(mib * 4 * sizeof *weights);
    for (int i = 0; i < mib * 4; i++) {
        weights[i] = malloc(262144);
        memset(weights[i], 7, 262144);
    }
}

__attribute__((noinline)) void intern_token(void) {
    if (ntokens == cap_tokens) {
        cap_tokens = cap_tokens ? cap_tokens * 2 : 4096;
        tokens = realloc(tokens, cap_tokens * sizeof *tokens);
    }
    char *p = malloc(2048);
    memset(p, 8, 2048);
    tokens[ntokens++] = p;
}

__attribute__((noinline)) void decode_batch(void) {
    char *scratch[16];
    for (int i = 0; i < 16; i++) {
        size_t size = 8192 + next_random() % 131072;
        scratch[i] = malloc(size);
        memset(scratch[i], 9, 4096);
    }
    sink = scratch[next_random() % 16];
    for (int i = 0; i < 16; i++) free(scratch[i]);
}

int main(int argc, char **argv) {
    int weights_mib = argc > 1 ? atoi(argv[1]) : 256;
    int tokens_per_tick = argc > 2 ? atoi(argv[2]) : 8;
    int tick_us = argc > 3 ? atoi(argv[3]) : 50000;
    load_weights(weights_mib);
    printf("ready %d\n", getpid());
    fflush(stdout);
    for (;;) {
        for (int i = 0; i < 30; i++) decode_batch();
        for (int i = 0; i < tokens_per_tick; i++) intern_token();
        usleep(tick_us);
    }
}
"""

BATCHES_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define POOL 30000
static char *pool[POOL];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long seed = 88172645463325252UL;
static unsigned long next_random(unsigned long *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }

__attribute__((noinline)) static void *handle_batch(void *arg) {
    unsigned long s = (unsigned long)arg * 2654435761UL + 1;
    enum { N = 40000 };
    char **parts = malloc(N * sizeof *parts);
    for (int i = 0; i < N; i++) {
        size_t n = 192 + next_random(&s) % 128;
        parts[i] = malloc(n);
        memset(parts[i], 1, n);
    }
    for (int i = 0; i < N; i++) {
        if (i % 32 == 0) { /* outlives the batch */
            pthread_mutex_lock(&lock);
            unsigned long slot = next_random(&seed) % POOL;
            free(pool[slot]);
            pool[slot] = parts[i];
            pthread_mutex_unlock(&lock);
        } else {
            free(parts[i]);
        }
    }
    free(parts);
    return NULL;
}

int main(int argc, char **argv) {
    int max_workers = argc > 1 ? atoi(argv[1]) : 16;
    int ramp_rounds = argc > 2 ? atoi(argv[2]) : 10; /* one more worker every this many rounds */
    printf("ready %d\n", getpid());
    fflush(stdout);
    for (long round = 0;; round++) {
        int workers = 1 + (int)(round / ramp_rounds);
        if (workers > max_workers) workers = max_workers;
        pthread_t threads[64];
        for (int w = 0; w < workers; w++) pthread_create(&threads[w], NULL, handle_batch, (void *)(round * 64 + w));
        for (int w = 0; w < workers; w++) pthread_join(threads[w], NULL);
        usleep(100000);
    }
}
"""

FEATURE_STORE_PY = r'''
"""A feature store: every request's features are remembered in a module-global list (never trimmed),
while requests in flight are tracked in a dict that is emptied when a batch completes."""
import os, random, sys, time
sys.path.insert(0, sys.argv[1])
import medic_hook

HISTORY = []  # module-global: every request's features, never trimmed
IN_FLIGHT = {}


def remember(request_id, rng):
    HISTORY.append({"id": request_id, "user": rng.randrange(10**6), "score": rng.random(), "tags": None})  # leaks


def track(request_id, rng):
    IN_FLIGHT[request_id] = [rng.random() for _ in range(24)]
    if len(IN_FLIGHT) > rng.randrange(500, 3000):
        IN_FLIGHT.clear()  # the batch completed


path = medic_hook.start(sys.argv[2])
print("ready", os.getpid(), path, flush=True)
per_tick = int(sys.argv[3]) if len(sys.argv) > 3 else 400
rng = random.Random(3)
request_id = 0
while True:
    for _ in range(per_tick):
        request_id += 1
        remember(request_id, rng)
        track(request_id, rng)
    time.sleep(0.05)
'''

EMBEDDING_CACHE_PY = r'''
"""An embedding cache in front of a model: keys drawn from a Zipf law over a vocabulary, a miss computes
a 32 KiB vector; at most `cap` vectors are kept (the oldest evicted)."""
import bisect, itertools, os, random, sys, time
from collections import OrderedDict

vocabulary, cap, per_tick = (int(a) for a in sys.argv[1:4])
weights = list(itertools.accumulate(1.0 / (rank + 1) ** 0.8 for rank in range(vocabulary)))
cache = OrderedDict()
rng = random.Random(11)
print("ready", os.getpid(), flush=True)
started, done = time.monotonic(), 0
while True:
    # paced by the clock, `per_tick` lookups every 50 ms: a busy machine that oversleeps delays the
    # next lookups, it does not stretch the warm-up
    due = int((time.monotonic() - started) / 0.05 * per_tick)
    for _ in range(due - done):
        key = bisect.bisect(weights, rng.random() * weights[-1])
        if key in cache:
            cache.move_to_end(key)
            continue
        cache[key] = bytes(32768) + key.to_bytes(4, "little")  # computes the vector
        if len(cache) > cap:
            cache.popitem(last=False)
    done = due
    time.sleep(0.05)
'''

ACCOUNTS_JAVA = r"""
import java.util.*;

public class Accounts {
    static final Map<String, AccountState> ACCOUNTS = new HashMap<>();
    static final class AccountState {
        final String id;
        final long[] counters = new long[6];
        long lastSeen;
        AccountState(String id) { this.id = id; }
    }
    static volatile Object sink;

    public static void main(String[] args) throws Exception {
        boolean stable = args[0].equals("stable");
        int perTick = Integer.parseInt(args[1]);
        List<long[]> resident = new ArrayList<>();
        if (stable) for (int i = 0; i < Integer.parseInt(args[2]); i++) resident.add(new long[128 * 1024]);
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.flush();
        Random random = new Random(5);
        long next = 0;
        while (true) {
            if (!stable) {
                for (int i = 0; i < perTick; i++, next++) {
                    String id = "acct-" + next;
                    ACCOUNTS.put(id, new AccountState(id));
                }
            }
            int requests = 3000 + random.nextInt(3000);
            for (int r = 0; r < requests; r++) {
                List<Object> fields = new ArrayList<>();
                for (int f = 0; f < 12; f++) fields.add(Long.valueOf(random.nextInt(1 << 20)));
                sink = fields;
                sink = "req-" + r;
            }
            if (stable) sink = resident.get(random.nextInt(resident.size()));
            Thread.sleep(50);
        }
    }
}
"""


def build_c(out_dir: Path, name: str, source: str) -> str:
    """Compile one of the C programs above with frame pointers and symbols; returns the binary."""
    path = out_dir / f"{name}.c"
    path.write_text(source)
    binary = out_dir / name
    subprocess.run(
        ["cc", "-g", "-O1", "-fno-omit-frame-pointer", "-pthread", "-o", str(binary), str(path)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return str(binary)


def write_feature_store(out_dir: Path) -> str:
    script = out_dir / "feature_store.py"
    script.write_text(FEATURE_STORE_PY)
    return str(script)


def write_embedding_cache(out_dir: Path) -> str:
    script = out_dir / "embedding_cache.py"
    script.write_text(EMBEDDING_CACHE_PY)
    return str(script)


def build_accounts(out_dir: Path) -> Path:
    """Compile Accounts.java with javac; returns the class directory."""
    source = out_dir / "Accounts.java"
    source.write_text(ACCOUNTS_JAVA)
    subprocess.run(["javac", "-d", str(out_dir), str(source)], check=True, capture_output=True, timeout=120)
    return out_dir
