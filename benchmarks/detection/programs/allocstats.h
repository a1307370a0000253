/* Print the allocator's own statistics as "M <metric> <value>" lines for record.py.
 * jemalloc (LD_PRELOAD=libjemalloc.so.2): mallctl("stats.allocated/active/resident") after an
 * epoch refresh, found with dlsym so the program also runs without jemalloc.
 * glibc: mallinfo2() (uordblks + hblkhd allocated; arena + hblkhd held). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);

static void report_allocator(void) {
    mallctl_fn mallctl = (mallctl_fn)dlsym(RTLD_DEFAULT, "mallctl");
    if (mallctl) {
        uint64_t epoch = 1;
        size_t len = sizeof(epoch);
        mallctl("epoch", &epoch, &len, &epoch, len);
        size_t allocated = 0, active = 0, resident = 0;
        len = sizeof(size_t);
        mallctl("stats.allocated", &allocated, &len, NULL, 0);
        len = sizeof(size_t);
        mallctl("stats.active", &active, &len, NULL, 0);
        len = sizeof(size_t);
        mallctl("stats.resident", &resident, &len, NULL, 0);
        printf("M allocator_allocated_bytes %zu\nM allocator_active_bytes %zu\nM allocator_resident_bytes %zu\n",
               allocated, active, resident);
    } else {
        struct mallinfo2 mi = mallinfo2();
        printf("M allocator_allocated_bytes %zu\nM allocator_resident_bytes %zu\n",
               mi.uordblks + mi.hblkhd, mi.arena + mi.hblkhd);
    }
    fflush(stdout);
}
