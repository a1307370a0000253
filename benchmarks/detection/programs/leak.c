/* A request loop that leaks: every tick it serves "requests" (small allocations freed at once),
 * runs a batch every second (a burst of 64 KiB buffers, freed: a sawtooth), and keeps
 * LEAK_BYTES of small blocks per tick forever.
 *   leak LEAK_BYTES_PER_TICK TICK_MS BATCH_MB REPORT(0|1) */
#include "allocstats.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void *volatile sink; /* keeps gcc from deleting malloc/free pairs */

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
    long leak = argc > 1 ? atol(argv[1]) : 65536;
    long tick_ms = argc > 2 ? atol(argv[2]) : 20;
    long batch_mb = argc > 3 ? atol(argv[3]) : 32;
    int report = argc > 4 ? atoi(argv[4]) : 0;
    size_t kept_cap = 1 << 20, kept_n = 0;
    void **kept = malloc(kept_cap * sizeof(void *));
    for (long tick = 0;; tick++) {
        for (int i = 0; i < 200; i++) { /* requests: allocate, use, free */
            char *p = malloc(512 + (i % 7) * 128);
            memset(p, i, 64);
            sink = p;
            free(p);
        }
        for (long left = leak; left > 0; left -= 256) { /* the leak: 256-byte blocks never freed */
            char *p = malloc(256);
            memset(p, 1, 256);
            if (kept_n == kept_cap) {
                kept_cap *= 2;
                kept = realloc(kept, kept_cap * sizeof(void *));
            }
            kept[kept_n++] = p;
        }
        if (batch_mb > 0 && tick % (1000 / tick_ms) == 0) { /* a batch: touch, then free */
            long n = batch_mb * 16;
            char **bufs = malloc(n * sizeof(char *));
            for (long i = 0; i < n; i++) {
                bufs[i] = malloc(65536);
                memset(bufs[i], 2, 65536);
            }
            sleep_ms(tick_ms * 10);
            for (long i = 0; i < n; i++) free(bufs[i]);
            free(bufs);
        }
        if (report && tick % 10 == 0) report_allocator();
        sink = kept;
        sleep_ms(tick_ms);
    }
}
