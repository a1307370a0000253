/* Allocator fragmentation or retention that is not a leak: the live bytes stay flat.
 *   frag frag    : 1.5 M small objects, every 16th kept, the rest freed; then steady churn of
 *                  small objects. glibc cannot return the holes (trim frees only whole pages).
 *   frag retain  : 1200 x 256 KiB buffers, all but every 20th freed; then churn.
 *                  With MALLOC_CONF=dirty_decay_ms:-1 jemalloc keeps the freed pages resident.
 * Prints allocator statistics ("M ..." lines) every 100 ms. */
#include "allocstats.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void *volatile sink;

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
    int retain = argc > 1 && strcmp(argv[1], "retain") == 0;
    long n = retain ? 1200 : 1500000;
    size_t size = retain ? 262144 : 200;
    long keep_every = retain ? 20 : 16;
    char **objs = malloc(n * sizeof(char *));
    for (long i = 0; i < n; i++) {
        objs[i] = malloc(size);
        memset(objs[i], 3, size);
    }
    for (long i = 0; i < n; i++)
        if (i % keep_every) {
            free(objs[i]);
            objs[i] = NULL;
        }
    for (long tick = 0;; tick++) { /* steady work: live bytes stay flat */
        for (int i = 0; i < 500; i++) {
            char *p = malloc(64 + (i % 5) * 32);
            memset(p, 4, 32);
            sink = p;
            free(p);
        }
        if (tick % 5 == 0) report_allocator();
        sink = objs;
        sleep_ms(20);
    }
}
