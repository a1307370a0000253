/*
 * A native allocation workload driven by commands on stdin, for medic's tests, benchmark and demos.
 * Answers each command with one line on stdout ("ok ..." or "error ...").
 *
 *   alloc COUNT SIZE        allocate COUNT blocks of SIZE bytes, touch them, keep them
 *   free                    free every kept block
 *   frag COUNT SIZE KEEP    allocate COUNT blocks, free all but every KEEP-th (kept)
 *   threads N MS            start N threads that churn malloc/free for MS milliseconds
 *   join                    wait for them: "ok OPS"
 *   fork MS                 fork a child that allocates, sleeps MS ms and exits: "ok CHILD_PID"
 *   reap                    wait for that child: "ok EXIT_STATUS"
 *   bench OPS               malloc-heavy loop (ring of 4096 blocks, 16-1040 B):
 *                           "ok WALL_NS_PER_OP CPU_NS_PER_OP" (CPU time of the whole process, all threads)
 *   exit                    exit normally (destructors run)
 *
 * gcc deletes malloc/free pairs whose pointer never escapes: every block goes through `sink`.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void *volatile sink;
static void **held;
static size_t nheld, capheld;
static pthread_t threads[64];
static int nthreads;
static uint64_t thread_ops[64];
static int64_t churn_deadline_ns;
static pid_t child;

static int64_t clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

static uint64_t next_random(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

static void keep(void *p) {
    if (nheld == capheld) {
        capheld = capheld ? capheld * 2 : 1024;
        held = realloc(held, capheld * sizeof *held);
        if (!held) abort();
    }
    held[nheld++] = p;
}

static void *touched(size_t size) {
    char *p = malloc(size);
    if (!p) abort();
    memset(p, 0x5a, size);
    sink = p;
    return p;
}

static void *churn(void *arg) {
    uint64_t *ops = arg, state = (uint64_t)(uintptr_t)arg | 1, n = 0;
    void *ring[1024] = {0};
    while (now_ns() < churn_deadline_ns) {
        for (int i = 0; i < 1024; i++, n++) {
            size_t slot = next_random(&state) % 1024;
            free(ring[slot]);
            size_t size = 16 + next_random(&state) % 4081;
            ring[slot] = malloc(size);
            ((char *)ring[slot])[0] = 1;
            sink = ring[slot];
        }
    }
    for (int i = 0; i < 1024; i++) free(ring[i]);
    *ops = n;
    return NULL;
}

static double bench(long ops, double *cpu_ns_per_op) {
    enum { RING = 4096 };
    static void *ring[RING];
    uint64_t state = 88172645463325252ull;
    for (int i = 0; i < RING; i++) ring[i] = malloc(16 + next_random(&state) % 1025);
    int64_t start = now_ns(), cpu_start = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
    for (long i = 0; i < ops; i++) {
        size_t slot = next_random(&state) % RING;
        free(ring[slot]);
        ring[slot] = malloc(16 + next_random(&state) % 1025);
        sink = ring[slot];
    }
    int64_t elapsed = now_ns() - start, cpu = clock_ns(CLOCK_PROCESS_CPUTIME_ID) - cpu_start;
    for (int i = 0; i < RING; i++) free(ring[i]);
    *cpu_ns_per_op = (double)cpu / (double)ops;
    return (double)elapsed / (double)ops;
}

int main(void) {
    char line[256];
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready %d\n", (int)getpid());
    while (fgets(line, sizeof line, stdin)) {
        long a = 0, b = 0, c = 0;
        if (sscanf(line, "alloc %ld %ld", &a, &b) == 2) {
            for (long i = 0; i < a; i++) keep(touched((size_t)b));
            printf("ok\n");
        } else if (strncmp(line, "free", 4) == 0) {
            for (size_t i = 0; i < nheld; i++) free(held[i]);
            nheld = 0;
            printf("ok\n");
        } else if (sscanf(line, "frag %ld %ld %ld", &a, &b, &c) == 3 && c > 0) {
            void **blocks = malloc((size_t)a * sizeof *blocks);
            for (long i = 0; i < a; i++) blocks[i] = touched((size_t)b);
            for (long i = 0; i < a; i++) {
                if (i % c == 0) keep(blocks[i]);
                else free(blocks[i]);
            }
            free(blocks);
            printf("ok\n");
        } else if (sscanf(line, "threads %ld %ld", &a, &b) == 2 && a > 0 && a <= 64) {
            churn_deadline_ns = now_ns() + b * 1000000;
            nthreads = (int)a;
            for (int i = 0; i < nthreads; i++) pthread_create(&threads[i], NULL, churn, &thread_ops[i]);
            printf("ok\n");
        } else if (strncmp(line, "join", 4) == 0) {
            uint64_t total = 0;
            for (int i = 0; i < nthreads; i++) {
                pthread_join(threads[i], NULL);
                total += thread_ops[i];
            }
            nthreads = 0;
            printf("ok %llu\n", (unsigned long long)total);
        } else if (sscanf(line, "fork %ld", &a) == 1) {
            child = fork();
            if (child == 0) {
                for (int i = 0; i < 1000; i++) free(touched(4096));
                usleep((useconds_t)a * 1000);
                _exit(0);
            }
            printf("ok %d\n", (int)child);
        } else if (strncmp(line, "reap", 4) == 0) {
            int status = 0;
            waitpid(child, &status, 0);
            printf("ok %d\n", status);
        } else if (sscanf(line, "bench %ld", &a) == 1 && a > 0) {
            double cpu = 0, wall = bench(a, &cpu);
            printf("ok %.3f %.3f\n", wall, cpu);
        } else if (strncmp(line, "exit", 4) == 0) {
            return 0;
        } else {
            printf("error unknown command\n");
        }
    }
    return 0;
}
