/*
 * medic LD_PRELOAD shim: serves the allocator figures of a native process on a Unix socket.
 *
 *   LD_PRELOAD=$(medic hook path) MEDIC_HOOK_SOCKET=auto ./server
 *
 * A constructor starts one server thread only when MEDIC_HOOK_SOCKET is set: "%p" in it becomes the
 * pid, "auto" the conventional path <dir>/hook.<pid>.sock (rules in native_hooks/sockets.py). The
 * protocol is one JSON object per line each way (native_hooks/protocol.py); ops: ping, stats, purge,
 * prof_dump, prof_active. Allocator functions are found with dlsym(RTLD_DEFAULT, ...) and used only
 * when they live in the same object as the malloc the process calls, so the shim works with whichever
 * allocator is loaded and never reports glibc figures for another allocator. The shim defines no
 * allocation function. Requests and replies use static buffers: serving a request does not allocate
 * (jemalloc's epoch and tcmalloc's GetHeapProfile allocate inside the allocator). Peers must have our
 * uid or be root (SO_PEERCRED). The thread blocks all signals. After fork the child closes the
 * inherited socket and serves nothing; a child that execs runs the constructor again for its own pid.
 * The socket is unlinked at exit by the process that bound it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define HOOK_ENV "MEDIC_HOOK_SOCKET"
#define HOOK_DIR_ENV "MEDIC_HOOK_DIR"
#define HOOK_DEBUG_ENV "MEDIC_HOOK_DEBUG"
#define PROTOCOL_VERSION 1
#define MAX_CLIENTS 8
#define REQUEST_MAX 4096 /* including the newline; same as protocol.MAX_REQUEST_BYTES */
#define REPLY_MAX 8192
#define IDLE_TIMEOUT_MS 10000
#define MALLCTL_ARENAS_ALL 4096
#define THREAD_STACK (256 * 1024)
#define BACKLOG 64
#define EXPORT __attribute__((visibility("default")))

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);
typedef int (*tc_property_fn)(const char *, size_t *);
typedef void (*void_fn)(void);
typedef int (*int_fn)(void);
typedef char *(*heap_profile_fn)(void);
typedef void (*heap_start_fn)(const char *);
typedef int (*trim_fn)(size_t);
struct medic_mallinfo2 {
    size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
};
typedef struct medic_mallinfo2 (*mallinfo2_fn)(void);

enum { ALLOC_UNKNOWN, ALLOC_JEMALLOC, ALLOC_TCMALLOC, ALLOC_GLIBC };
static const char *const ALLOC_NAMES[] = {"unknown", "jemalloc", "tcmalloc", "glibc"};

static struct {
    int kind;
    const char *object; /* file name of the object that serves malloc (owned by ld.so) */
    mallctl_fn mallctl;
    tc_property_fn tc_property;
    void_fn tc_release;
    int_fn tc_running;
    heap_profile_fn tc_profile;
    heap_start_fn tc_start;
    void_fn tc_stop;
    mallinfo2_fn mallinfo2;
    trim_fn trim;
} A;

struct client {
    int fd;
    bool discarding; /* inside an over-long line: drop bytes up to its newline */
    size_t len;
    int64_t last_ms;
    char buf[REQUEST_MAX];
};

static int listen_fd = -1;
static pid_t owner_pid;
static bool debug_on;
static char sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
static struct client clients[MAX_CLIENTS];
static char reply_buf[REPLY_MAX];

struct request {
    char op[32];
    char path[PATH_MAX];
    char prefix[PATH_MAX];
    int active; /* -1 when absent */
};
static struct request R;

/* ---------------------------------------------------------------- small helpers */

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void debug(const char *what, const char *detail) {
    char line[512];
    if (!debug_on) return;
    int n = snprintf(line, sizeof line, "medic shim (pid %d): %s%s%s\n", (int)getpid(), what,
                     detail ? ": " : "", detail ? detail : "");
    if (n > 0) {
        ssize_t ignored = write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        (void)ignored;
    }
}

/* resolve a symbol only if it lives in the same object as `malloc_addr` */
static void *same_object_symbol(const char *name, void *malloc_addr) {
    void *sym = dlsym(RTLD_DEFAULT, name);
    Dl_info a, b;
    if (!sym || !malloc_addr || !dladdr(sym, &a) || !dladdr(malloc_addr, &b)) return NULL;
    return a.dli_fbase == b.dli_fbase ? sym : NULL;
}

static void detect_allocator(void) {
    void *malloc_addr = dlsym(RTLD_DEFAULT, "malloc");
    Dl_info info;
    A.object = (malloc_addr && dladdr(malloc_addr, &info) && info.dli_fname) ? info.dli_fname : "";
    void *sym;
    if ((sym = same_object_symbol("mallctl", malloc_addr))) {
        A.kind = ALLOC_JEMALLOC;
        *(void **)&A.mallctl = sym;
        return;
    }
    if ((sym = same_object_symbol("MallocExtension_GetNumericProperty", malloc_addr))) {
        A.kind = ALLOC_TCMALLOC;
        *(void **)&A.tc_property = sym;
        *(void **)&A.tc_release = same_object_symbol("MallocExtension_ReleaseFreeMemory", malloc_addr);
        *(void **)&A.tc_running = same_object_symbol("IsHeapProfilerRunning", malloc_addr);
        *(void **)&A.tc_profile = same_object_symbol("GetHeapProfile", malloc_addr);
        *(void **)&A.tc_start = same_object_symbol("HeapProfilerStart", malloc_addr);
        *(void **)&A.tc_stop = same_object_symbol("HeapProfilerStop", malloc_addr);
        return;
    }
    const char *base = strrchr(A.object, '/');
    base = base ? base + 1 : A.object;
    sym = dlsym(RTLD_DEFAULT, "mallinfo2");
    if (sym && strncmp(base, "libc.so", 7) == 0) {
        A.kind = ALLOC_GLIBC;
        *(void **)&A.mallinfo2 = sym;
        *(void **)&A.trim = dlsym(RTLD_DEFAULT, "malloc_trim");
        return;
    }
    A.kind = ALLOC_UNKNOWN;
}

/* RSS and virtual size from /proc/self/statm, without stdio */
static bool process_memory(uint64_t *rss, uint64_t *vms) {
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = 0;
    unsigned long long size = 0, resident = 0;
    if (sscanf(buf, "%llu %llu", &size, &resident) != 2) return false;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    *rss = resident * page;
    *vms = size * page;
    return true;
}

static uint64_t rss_now(void) {
    uint64_t rss = 0, vms = 0;
    process_memory(&rss, &vms);
    return rss;
}

/* ---------------------------------------------------------------- JSON output */

struct out {
    char *buf;
    size_t len, cap;
    bool overflow;
};

static void out_raw(struct out *o, const char *s, size_t n) {
    if (o->overflow || o->len + n + 2 > o->cap) { /* keep room for "}\n" */
        o->overflow = true;
        return;
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
}

static void out_lit(struct out *o, const char *s) { out_raw(o, s, strlen(s)); }

static void out_str(struct out *o, const char *s) {
    static const char hex[] = "0123456789abcdef";
    out_raw(o, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char esc[2] = {'\\', (char)*p};
            out_raw(o, esc, 2);
        } else if (*p < 0x20 || *p >= 0x7f) { /* ASCII-only output, like the Python hook */
            char esc[6] = {'\\', 'u', '0', '0', hex[*p >> 4], hex[*p & 15]};
            out_raw(o, esc, 6);
        } else {
            out_raw(o, (const char *)p, 1);
        }
    }
    out_raw(o, "\"", 1);
}

static void out_key(struct out *o, const char *key) {
    if (o->len && o->buf[o->len - 1] != '{') out_raw(o, ",", 1);
    out_str(o, key);
    out_raw(o, ":", 1);
}

static void out_u64(struct out *o, const char *key, uint64_t v) {
    char num[24];
    int n = snprintf(num, sizeof num, "%llu", (unsigned long long)v);
    out_key(o, key);
    out_raw(o, num, (size_t)n);
}

static void out_bool(struct out *o, const char *key, bool v) {
    out_key(o, key);
    out_lit(o, v ? "true" : "false");
}

static void out_kstr(struct out *o, const char *key, const char *v) {
    out_key(o, key);
    out_str(o, v);
}

static void out_seconds(struct out *o, const char *key, int64_t sec, long nsec) {
    char num[40];
    int n = snprintf(num, sizeof num, "%lld.%06ld", (long long)sec, nsec / 1000);
    out_key(o, key);
    out_raw(o, num, (size_t)n);
}

static void out_begin(struct out *o, const char *op) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    o->len = 0;
    o->overflow = false;
    out_lit(o, "{\"ok\":true");
    out_kstr(o, "op", op);
    out_kstr(o, "hook", "shim");
    out_u64(o, "protocol", PROTOCOL_VERSION);
    out_u64(o, "pid", (uint64_t)getpid());
    out_seconds(o, "ts", ts.tv_sec, ts.tv_nsec);
}

static void out_error(struct out *o, const char *code, const char *message) {
    o->len = 0;
    o->overflow = false;
    out_lit(o, "{\"ok\":false");
    out_kstr(o, "code", code);
    out_kstr(o, "error", message);
}

/* ---------------------------------------------------------------- JSON request parsing */

struct parser {
    const char *p, *end;
};

static void skip_ws(struct parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\r' || *ps->p == '\n')) ps->p++;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool read_hex4(struct parser *ps, unsigned *cp) {
    if (ps->end - ps->p < 4) return false;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(ps->p[i]);
        if (h < 0) return false;
        v = v * 16 + (unsigned)h;
    }
    ps->p += 4;
    *cp = v;
    return true;
}

/* append one byte to dst (NULL dst skips); false when the value is too long for dst */
static bool put(char *dst, size_t cap, size_t *n, char c) {
    if (!dst) return true;
    if (*n + 1 >= cap) return false;
    dst[(*n)++] = c;
    return true;
}

/* parse a JSON string at ps->p into dst (NUL-terminated); dst NULL skips it */
static bool parse_string(struct parser *ps, char *dst, size_t cap, const char **err) {
    size_t n = 0;
    if (ps->p >= ps->end || *ps->p != '"') return *err = "expected a string", false;
    ps->p++;
    while (ps->p < ps->end) {
        unsigned char c = (unsigned char)*ps->p++;
        if (c == '"') {
            if (dst) dst[n] = 0;
            return true;
        }
        if (c < 0x20) return *err = "control character inside a string", false;
        if (c != '\\') {
            if (!put(dst, cap, &n, (char)c)) return *err = "string value too long", false;
            continue;
        }
        if (ps->p >= ps->end) break;
        char e = *ps->p++;
        char simple = e == '"' ? '"' : e == '\\' ? '\\' : e == '/' ? '/' : e == 'b' ? '\b' : e == 'f' ? '\f'
                    : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : 0;
        if (simple) {
            if (!put(dst, cap, &n, simple)) return *err = "string value too long", false;
            continue;
        }
        if (e != 'u') return *err = "invalid escape in a string", false;
        unsigned cp;
        if (!read_hex4(ps, &cp)) return *err = "invalid \\u escape", false;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            unsigned low;
            if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u') return *err = "lone surrogate", false;
            ps->p += 2;
            if (!read_hex4(ps, &low) || low < 0xDC00 || low > 0xDFFF) return *err = "lone surrogate", false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return *err = "lone surrogate", false;
        }
        if (cp == 0 && dst) return *err = "NUL character inside a string", false;
        char utf8[4];
        int len;
        if (cp < 0x80) {
            utf8[0] = (char)cp, len = 1;
        } else if (cp < 0x800) {
            utf8[0] = (char)(0xC0 | (cp >> 6)), utf8[1] = (char)(0x80 | (cp & 0x3F)), len = 2;
        } else if (cp < 0x10000) {
            utf8[0] = (char)(0xE0 | (cp >> 12)), utf8[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
            utf8[2] = (char)(0x80 | (cp & 0x3F)), len = 3;
        } else {
            utf8[0] = (char)(0xF0 | (cp >> 18)), utf8[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
            utf8[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), utf8[3] = (char)(0x80 | (cp & 0x3F)), len = 4;
        }
        for (int i = 0; i < len; i++)
            if (!put(dst, cap, &n, utf8[i])) return *err = "string value too long", false;
    }
    return *err = "unterminated string", false;
}

static bool parse_literal(struct parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return false;
    ps->p += n;
    return true;
}

static bool skip_value(struct parser *ps, int depth, const char **err);

static bool skip_container(struct parser *ps, int depth, char close, bool object, const char **err) {
    ps->p++; /* the opening bracket */
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return true;
    }
    for (;;) {
        skip_ws(ps);
        if (object) {
            if (!parse_string(ps, NULL, 0, err)) return false;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return *err = "expected ':' after a key", false;
            ps->p++;
        }
        if (!skip_value(ps, depth + 1, err)) return false;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return true;
        }
        return *err = "expected ',' or a closing bracket", false;
    }
}

static bool skip_value(struct parser *ps, int depth, const char **err) {
    if (depth > 32) return *err = "nesting too deep", false;
    skip_ws(ps);
    if (ps->p >= ps->end) return *err = "expected a value", false;
    char c = *ps->p;
    if (c == '"') return parse_string(ps, NULL, 0, err);
    if (c == '{') return skip_container(ps, depth, '}', true, err);
    if (c == '[') return skip_container(ps, depth, ']', false, err);
    if (parse_literal(ps, "true") || parse_literal(ps, "false") || parse_literal(ps, "null")) return true;
    if (c == '-' || (c >= '0' && c <= '9')) {
        const char *start = ps->p;
        while (ps->p < ps->end && strchr("+-0123456789.eE", *ps->p) && *ps->p) ps->p++;
        return ps->p > start ? true : (*err = "invalid number", false);
    }
    return *err = "invalid value", false;
}

/* a request is one JSON object; we keep "op", "path", "prefix" (strings) and "active" (bool) */
static bool parse_request(const char *line, size_t n, struct request *r, const char **err) {
    struct parser ps = {line, line + n};
    char key[16];
    bool have_op = false;
    r->op[0] = r->path[0] = r->prefix[0] = 0;
    r->active = -1;
    skip_ws(&ps);
    if (ps.p >= ps.end || *ps.p != '{') return *err = "request must be a JSON object", false;
    ps.p++;
    skip_ws(&ps);
    if (ps.p < ps.end && *ps.p == '}') {
        ps.p++;
    } else {
        for (;;) {
            skip_ws(&ps);
            const char *key_start = ps.p;
            if (!parse_string(&ps, key, sizeof key, err)) {
                /* an over-long key is simply not one of ours: skip it */
                ps.p = key_start;
                if (!parse_string(&ps, NULL, 0, err)) return false;
                key[0] = 0;
            }
            skip_ws(&ps);
            if (ps.p >= ps.end || *ps.p != ':') return *err = "expected ':' after a key", false;
            ps.p++;
            skip_ws(&ps);
            char *dst = strcmp(key, "op") == 0       ? r->op
                        : strcmp(key, "path") == 0   ? r->path
                        : strcmp(key, "prefix") == 0 ? r->prefix
                                                     : NULL;
            if (dst) {
                size_t cap = dst == r->op ? sizeof r->op : PATH_MAX;
                if (ps.p < ps.end && *ps.p == '"') {
                    if (!parse_string(&ps, dst, cap, err)) return false;
                    if (dst == r->op) have_op = true;
                } else {
                    if (strcmp(key, "op") == 0) return *err = "\"op\" must be a string such as \"ping\"", false;
                    if (!skip_value(&ps, 1, err)) return false;
                    dst[0] = 0;
                }
            } else if (strcmp(key, "active") == 0 && parse_literal(&ps, "true")) {
                r->active = 1;
            } else if (strcmp(key, "active") == 0 && parse_literal(&ps, "false")) {
                r->active = 0;
            } else if (!skip_value(&ps, 1, err)) {
                return false;
            }
            skip_ws(&ps);
            if (ps.p < ps.end && *ps.p == ',') {
                ps.p++;
                continue;
            }
            if (ps.p < ps.end && *ps.p == '}') {
                ps.p++;
                break;
            }
            return *err = "expected ',' or '}' in the request object", false;
        }
    }
    skip_ws(&ps);
    if (ps.p != ps.end) return *err = "trailing data after the request object", false;
    if (!have_op) return *err = "request needs \"op\": a string such as \"ping\" or \"stats\"", false;
    return true;
}

/* ---------------------------------------------------------------- allocator figures */

static bool je_size(const char *name, size_t *value) {
    size_t len = sizeof *value;
    return A.mallctl(name, value, &len, NULL, 0) == 0;
}

static bool je_bool(const char *name, bool *value) {
    size_t len = sizeof *value;
    return A.mallctl(name, value, &len, NULL, 0) == 0;
}

static void stats_jemalloc(struct out *o) {
    static const char *const names[] = {"allocated", "active", "metadata", "resident", "mapped", "retained"};
    size_t values[6] = {0}, page = 4096, pdirty = 0, pmuzzy = 0;
    bool have[6], have_decay;
    uint64_t epoch = 1;
    size_t elen = sizeof epoch;
    char ctl[48];
    const char *version = NULL;
    size_t vlen = sizeof version;
    bool prof_enabled = false, prof_active = false;

    A.mallctl("epoch", &epoch, &elen, &epoch, elen);
    for (int i = 0; i < 6; i++) {
        snprintf(ctl, sizeof ctl, "stats.%s", names[i]);
        have[i] = je_size(ctl, &values[i]);
    }
    je_size("arenas.page", &page);
    snprintf(ctl, sizeof ctl, "stats.arenas.%d.pdirty", MALLCTL_ARENAS_ALL);
    have_decay = je_size(ctl, &pdirty);
    snprintf(ctl, sizeof ctl, "stats.arenas.%d.pmuzzy", MALLCTL_ARENAS_ALL);
    have_decay = je_size(ctl, &pmuzzy) && have_decay;
    if (A.mallctl("version", (void *)&version, &vlen, NULL, 0) == 0 && version) out_kstr(o, "allocator_version", version);
    je_bool("opt.prof", &prof_enabled);
    if (prof_enabled) je_bool("prof.active", &prof_active);

    out_key(o, "figures");
    out_lit(o, "{");
    for (int i = 0; i < 6; i++)
        if (have[i]) out_u64(o, names[i], values[i]);
    if (have_decay) {
        size_t dirty = pdirty * page, muzzy = pmuzzy * page;
        out_u64(o, "dirty", dirty);
        out_u64(o, "muzzy", muzzy);
        out_u64(o, "purgeable", dirty + muzzy);
        if (have[0] && have[1])
            out_u64(o, "free", (values[1] > values[0] ? values[1] - values[0] : 0) + dirty + muzzy);
    }
    out_lit(o, "}");
    out_key(o, "native");
    out_lit(o, "{");
    for (int i = 0; i < 6; i++) {
        if (!have[i]) continue;
        snprintf(ctl, sizeof ctl, "stats.%s", names[i]);
        out_u64(o, ctl, values[i]);
    }
    if (have_decay) {
        out_u64(o, "dirty", pdirty * page);
        out_u64(o, "muzzy", pmuzzy * page);
    }
    out_lit(o, "}");
    out_key(o, "prof");
    out_lit(o, "{");
    out_bool(o, "enabled", prof_enabled);
    out_bool(o, "active", prof_active);
    out_lit(o, "}");
}

static void stats_tcmalloc(struct out *o) {
    static const char *const names[] = {
        "generic.current_allocated_bytes",    "generic.heap_size",
        "generic.total_physical_bytes",       "tcmalloc.pageheap_free_bytes",
        "tcmalloc.pageheap_unmapped_bytes",   "tcmalloc.central_cache_free_bytes",
        "tcmalloc.transfer_cache_free_bytes", "tcmalloc.thread_cache_free_bytes",
        "tcmalloc.current_total_thread_cache_bytes", "tcmalloc.max_total_thread_cache_bytes",
        "tcmalloc.aggressive_memory_decommit",
    };
    enum { N = sizeof names / sizeof names[0] };
    size_t v[N] = {0};
    bool have[N];
    for (int i = 0; i < N; i++) have[i] = A.tc_property(names[i], &v[i]) != 0;
    size_t heap = v[1], unmapped = v[4], page_free = v[3];
    size_t held = heap > unmapped ? heap - unmapped : 0;
    size_t physical = have[2] ? v[2] : held;
    out_key(o, "figures");
    out_lit(o, "{");
    out_u64(o, "allocated", v[0]);
    out_u64(o, "active", heap > page_free + unmapped ? heap - page_free - unmapped : 0);
    out_u64(o, "resident", physical);
    out_u64(o, "mapped", heap);
    out_u64(o, "retained", unmapped);
    out_u64(o, "metadata", physical > held ? physical - held : 0);
    out_u64(o, "free", page_free + v[5] + v[6] + v[7]);
    out_u64(o, "purgeable", page_free);
    out_lit(o, "}");
    out_key(o, "native");
    out_lit(o, "{");
    for (int i = 0; i < N; i++)
        if (have[i]) out_u64(o, names[i], v[i]);
    out_lit(o, "}");
    bool running = A.tc_running && A.tc_running();
    out_key(o, "prof");
    out_lit(o, "{");
    out_bool(o, "enabled", A.tc_profile != NULL);
    out_bool(o, "active", running);
    out_lit(o, "}");
}

static void stats_glibc(struct out *o, uint64_t rss) {
    struct medic_mallinfo2 mi = A.mallinfo2();
    uint64_t mapped = (uint64_t)mi.arena + mi.hblkhd;
    out_key(o, "figures");
    out_lit(o, "{");
    out_u64(o, "allocated", (uint64_t)mi.uordblks + mi.hblkhd);
    out_u64(o, "mapped", mapped);
    out_u64(o, "resident", rss && rss < mapped ? rss : mapped);
    out_u64(o, "free", mi.fordblks);
    out_lit(o, "}");
    out_key(o, "native");
    out_lit(o, "{");
    out_u64(o, "arena", mi.arena);
    out_u64(o, "ordblks", mi.ordblks);
    out_u64(o, "smblks", mi.smblks);
    out_u64(o, "hblks", mi.hblks);
    out_u64(o, "hblkhd", mi.hblkhd);
    out_u64(o, "usmblks", mi.usmblks);
    out_u64(o, "fsmblks", mi.fsmblks);
    out_u64(o, "uordblks", mi.uordblks);
    out_u64(o, "fordblks", mi.fordblks);
    out_u64(o, "keepcost", mi.keepcost);
    out_lit(o, "}");
}

/* ---------------------------------------------------------------- operations */

static void describe_allocator(struct out *o) {
    out_kstr(o, "allocator", ALLOC_NAMES[A.kind]);
    out_kstr(o, "allocator_object", A.object);
}

static void op_ping(struct out *o) {
    out_begin(o, "ping");
    out_bool(o, "pong", true);
    out_kstr(o, "allocator", ALLOC_NAMES[A.kind]);
    out_key(o, "ops");
    out_lit(o, "[\"ping\",\"stats\",\"purge\",\"prof_dump\",\"prof_active\"]");
}

static void op_stats(struct out *o) {
    uint64_t rss = 0, vms = 0;
    bool have_mem = process_memory(&rss, &vms);
    out_begin(o, "stats");
    describe_allocator(o);
    if (A.kind == ALLOC_JEMALLOC) {
        stats_jemalloc(o);
    } else if (A.kind == ALLOC_TCMALLOC) {
        stats_tcmalloc(o);
    } else if (A.kind == ALLOC_GLIBC) {
        stats_glibc(o, rss);
    } else {
        out_key(o, "figures");
        out_lit(o, "{}");
        out_key(o, "native");
        out_lit(o, "{}");
    }
    out_key(o, "process");
    out_lit(o, "{");
    if (have_mem) {
        out_u64(o, "rss_bytes", rss);
        out_u64(o, "vms_bytes", vms);
    }
    out_lit(o, "}");
}

static const char *unsupported_allocator(void) {
    return A.kind == ALLOC_GLIBC
               ? "glibc malloc has no heap profiler: run the target under jemalloc (LD_PRELOAD=libjemalloc.so.2 "
                 "MALLOC_CONF=prof:true,prof_active:false) or tcmalloc (LD_PRELOAD=libtcmalloc.so.4 "
                 "HEAPPROFILE=/dir/prefix)"
               : "malloc is served by an allocator the shim cannot drive (statically linked or unknown): "
                 "export its mallctl with -rdynamic, or use jemalloc/tcmalloc/glibc";
}

static void op_purge(struct out *o) {
    struct timespec t0, t1;
    const char *action;
    uint64_t before, after;
    if (A.kind == ALLOC_UNKNOWN || (A.kind == ALLOC_TCMALLOC && !A.tc_release) || (A.kind == ALLOC_GLIBC && !A.trim)) {
        out_error(o, "unsupported", unsupported_allocator());
        return;
    }
    clock_gettime(CLOCK_MONOTONIC, &t0);
    before = rss_now();
    if (A.kind == ALLOC_JEMALLOC) {
        char ctl[32];
        snprintf(ctl, sizeof ctl, "arena.%d.purge", MALLCTL_ARENAS_ALL);
        int rc = A.mallctl(ctl, NULL, NULL, NULL, 0);
        if (rc != 0) {
            char msg[128];
            snprintf(msg, sizeof msg, "mallctl %s failed: %s", ctl, strerror(rc));
            out_error(o, "failed", msg);
            return;
        }
        action = "arena.4096.purge";
    } else if (A.kind == ALLOC_TCMALLOC) {
        A.tc_release();
        action = "MallocExtension_ReleaseFreeMemory";
    } else {
        A.trim(0);
        action = "malloc_trim(0)";
    }
    after = rss_now();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    int64_t ns = (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000000 + (t1.tv_nsec - t0.tv_nsec);
    out_begin(o, "purge");
    out_kstr(o, "allocator", ALLOC_NAMES[A.kind]);
    out_kstr(o, "action", action);
    out_u64(o, "rss_before", before);
    out_u64(o, "rss_after", after);
    out_u64(o, "returned_bytes", before > after ? before - after : 0);
    out_seconds(o, "duration_s", ns / 1000000000, (long)(ns % 1000000000));
}

static bool require_absolute(struct out *o, const char *value, const char *what) {
    char msg[160];
    if (value[0] == '/') return true;
    snprintf(msg, sizeof msg, "%s needs \"%s\": an absolute path in a directory the target can write",
             R.op, what);
    out_error(o, "bad_request", msg);
    return false;
}

static const char *JE_PROF_OFF =
    "heap profiling is off in this process: start it with MALLOC_CONF=prof:true,prof_active:false "
    "(jemalloc reads it only at start; sampling then costs nothing until switched on)";

static void finish_dump(struct out *o, const char *format) {
    struct stat st;
    out_begin(o, "prof_dump");
    out_kstr(o, "allocator", ALLOC_NAMES[A.kind]);
    out_kstr(o, "path", R.path);
    out_u64(o, "bytes", stat(R.path, &st) == 0 ? (uint64_t)st.st_size : 0);
    out_kstr(o, "format", format);
}

static void op_prof_dump(struct out *o) {
    char msg[PATH_MAX + 200];
    if (!require_absolute(o, R.path, "path")) return;
    if (A.kind == ALLOC_JEMALLOC) {
        bool enabled = false;
        if (!je_bool("opt.prof", &enabled) || !enabled) {
            out_error(o, "unavailable", JE_PROF_OFF);
            return;
        }
        const char *path = R.path;
        int rc = A.mallctl("prof.dump", NULL, NULL, (void *)&path, sizeof path);
        if (rc != 0) {
            snprintf(msg, sizeof msg,
                     "jemalloc could not write the heap profile to %s (%s): the directory must exist and be "
                     "writable by the target",
                     R.path, strerror(rc));
            out_error(o, "failed", msg);
            return;
        }
        finish_dump(o, "jemalloc");
        return;
    }
    if (A.kind == ALLOC_TCMALLOC) {
        if (!A.tc_profile || !A.tc_running) {
            out_error(o, "unavailable",
                      "this tcmalloc (libtcmalloc_minimal) has no heap profiler: preload libtcmalloc.so.4 instead");
            return;
        }
        if (!A.tc_running()) {
            out_error(o, "unavailable",
                      "tcmalloc's heap profiler is not running: start the target with HEAPPROFILE=/dir/prefix, or "
                      "send {\"op\": \"prof_active\", \"active\": true, \"prefix\": \"/dir/prefix\"} first");
            return;
        }
        int fd = open(R.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0) {
            snprintf(msg, sizeof msg, "cannot create %s: %s", R.path, strerror(errno));
            out_error(o, "failed", msg);
            return;
        }
        char *text = A.tc_profile(); /* malloc'ed by tcmalloc, freed below */
        size_t len = text ? strlen(text) : 0, done = 0;
        bool ok = true;
        while (done < len) {
            ssize_t w = write(fd, text + done, len - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                ok = false;
                break;
            }
            done += (size_t)w;
        }
        free(text);
        if (close(fd) != 0) ok = false;
        if (!ok) {
            snprintf(msg, sizeof msg, "writing the heap profile to %s failed: %s", R.path, strerror(errno));
            out_error(o, "failed", msg);
            return;
        }
        finish_dump(o, "gperftools");
        return;
    }
    out_error(o, "unsupported", unsupported_allocator());
}

static void op_prof_active(struct out *o) {
    bool previous = false;
    if (R.active < 0) {
        out_error(o, "bad_request", "prof_active needs \"active\": true or false");
        return;
    }
    if (A.kind == ALLOC_JEMALLOC) {
        bool enabled = false, value = R.active == 1;
        size_t len = sizeof previous;
        if (!je_bool("opt.prof", &enabled) || !enabled) {
            out_error(o, "unavailable", JE_PROF_OFF);
            return;
        }
        int rc = A.mallctl("prof.active", &previous, &len, &value, sizeof value);
        if (rc != 0) {
            out_error(o, "failed", strerror(rc));
            return;
        }
    } else if (A.kind == ALLOC_TCMALLOC) {
        if (!A.tc_running || !A.tc_start || !A.tc_stop) {
            out_error(o, "unavailable",
                      "this tcmalloc (libtcmalloc_minimal) has no heap profiler: preload libtcmalloc.so.4 instead");
            return;
        }
        previous = A.tc_running() != 0;
        if (R.active == 1 && !previous) {
            if (!R.prefix[0]) {
                out_error(o, "bad_request", "starting tcmalloc's heap profiler needs \"prefix\": /dir/prefix");
                return;
            }
            if (!require_absolute(o, R.prefix, "prefix")) return;
            A.tc_start(R.prefix);
        } else if (R.active == 0 && previous) {
            A.tc_stop();
        }
    } else {
        out_error(o, "unsupported", unsupported_allocator());
        return;
    }
    out_begin(o, "prof_active");
    out_kstr(o, "allocator", ALLOC_NAMES[A.kind]);
    out_bool(o, "active", R.active == 1);
    out_bool(o, "previous", previous);
}

/* ---------------------------------------------------------------- server */

static void close_client(struct client *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->len = 0;
    c->discarding = false;
}

/* send a whole reply without blocking; a client whose socket buffer is full is dropped */
static bool send_reply(int fd, struct out *o) {
    if (o->overflow) out_error(o, "failed", "reply too large for the shim's buffer");
    o->buf[o->len++] = '}'; /* out_raw always keeps room for these two bytes */
    o->buf[o->len++] = '\n';
    ssize_t w = send(fd, o->buf, o->len, MSG_NOSIGNAL | MSG_DONTWAIT);
    return w == (ssize_t)o->len;
}

static void handle_line(struct client *c, const char *line, size_t n) {
    struct out o = {reply_buf, 0, sizeof reply_buf, false};
    const char *err = "invalid request";
    char msg[160];
    if (!parse_request(line, n, &R, &err)) {
        snprintf(msg, sizeof msg, "request is not a valid JSON object: %s", err);
        out_error(&o, "bad_request", msg);
    } else if (strcmp(R.op, "ping") == 0) {
        op_ping(&o);
    } else if (strcmp(R.op, "stats") == 0) {
        op_stats(&o);
    } else if (strcmp(R.op, "purge") == 0) {
        op_purge(&o);
    } else if (strcmp(R.op, "prof_dump") == 0) {
        op_prof_dump(&o);
    } else if (strcmp(R.op, "prof_active") == 0) {
        op_prof_active(&o);
    } else {
        snprintf(msg, sizeof msg, "unknown op '%.32s': known ops are ping, stats, purge, prof_dump, prof_active",
                 R.op);
        out_error(&o, "unknown_op", msg);
    }
    if (!send_reply(c->fd, &o)) close_client(c);
}

static void reply_and_close(int fd, const char *code, const char *message) {
    struct out o = {reply_buf, 0, sizeof reply_buf, false};
    out_error(&o, code, message);
    send_reply(fd, &o);
    close(fd);
}

/* 1: took a connection, 0: none pending (or backed off), -1: the listening descriptor is no longer
 * ours (the host closed or reused its number) */
static int accept_client(int64_t now) {
    int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOTSOCK || errno == EBADF || errno == EINVAL) return -1;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            struct timespec pause = {0, 100 * 1000 * 1000}; /* back off instead of spinning */
            nanosleep(&pause, NULL);
        }
        return 0;
    }
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        close(fd);
        return 1;
    }
    if (cred.uid != 0 && cred.uid != getuid() && cred.uid != geteuid()) {
        reply_and_close(fd, "permission", "this hook answers only its own uid and root");
        return 1;
    }
    /* a free slot, else the slot of the client idle the longest (most likely gone) */
    int slot = 0;
    for (int i = 0; i < MAX_CLIENTS; i++) {
        if (clients[i].fd < 0) {
            slot = i;
            break;
        }
        if (clients[i].last_ms < clients[slot].last_ms) slot = i;
    }
    close_client(&clients[slot]);
    clients[slot].fd = fd;
    clients[slot].last_ms = now;
    return 1;
}

static void read_client(struct client *c, int64_t now) {
    ssize_t n = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) { /* EOF or error: a half-sent request is discarded */
        close_client(c);
        return;
    }
    c->len += (size_t)n;
    c->last_ms = now;
    if (c->discarding) {
        char *nl = memchr(c->buf, '\n', c->len);
        if (!nl) {
            c->len = 0;
            return;
        }
        c->len -= (size_t)(nl + 1 - c->buf);
        memmove(c->buf, nl + 1, c->len);
        c->discarding = false;
    }
    for (;;) {
        char *nl = memchr(c->buf, '\n', c->len);
        if (!nl) break;
        size_t line = (size_t)(nl - c->buf);
        handle_line(c, c->buf, line);
        if (c->fd < 0) return;
        c->len -= line + 1;
        memmove(c->buf, nl + 1, c->len);
    }
    if (c->len == sizeof c->buf) { /* answer now, skip the rest of the line, keep the connection */
        struct out o = {reply_buf, 0, sizeof reply_buf, false};
        out_error(&o, "too_large", "request longer than 4095 bytes");
        c->len = 0;
        c->discarding = true;
        if (!send_reply(c->fd, &o)) close_client(c);
    }
}

static void *serve(void *unused) {
    (void)unused;
    detect_allocator();
    if (A.kind == ALLOC_JEMALLOC) { /* no thread cache for this mostly idle thread */
        bool off = false;
        A.mallctl("thread.tcache.enabled", NULL, NULL, &off, sizeof off);
    }
    debug("serving", sock_path);
    for (;;) {
        struct pollfd fds[1 + MAX_CLIENTS];
        int index[1 + MAX_CLIENTS];
        int n = 0, busy = 0;
        fds[n].fd = listen_fd;
        fds[n].events = POLLIN;
        fds[n].revents = 0;
        index[n++] = -1;
        for (int i = 0; i < MAX_CLIENTS; i++) {
            if (clients[i].fd < 0) continue;
            fds[n].fd = clients[i].fd;
            fds[n].events = POLLIN;
            fds[n].revents = 0;
            index[n++] = i;
            busy++;
        }
        int ready = poll(fds, (nfds_t)n, busy ? 1000 : -1);
        if (ready < 0) {
            if (errno != EINTR) {
                struct timespec pause = {0, 100 * 1000 * 1000};
                nanosleep(&pause, NULL);
            }
            continue;
        }
        int64_t now = now_ms();
        for (int k = 1; k < n; k++) {
            if (fds[k].revents & POLLNVAL) {
                clients[index[k]].fd = -1; /* the host closed it: the number is not ours to close */
            } else if (fds[k].revents) {
                read_client(&clients[index[k]], now);
            }
        }
        /* the host closed our listening descriptor (a daemon's close-all) or reused its number */
        bool ours = !(fds[0].revents & POLLNVAL);
        if (ours && (fds[0].revents & POLLIN)) {
            int result = 0;
            for (int k = 0; k < BACKLOG && (result = accept_client(now)) > 0; k++) {
            } /* drain the backlog so bursts do not fill it */
            ours = result >= 0;
        }
        if (!ours) {
            debug("listening descriptor no longer ours; stopping", NULL);
            listen_fd = -1;
            return NULL;
        }
        for (int i = 0; i < MAX_CLIENTS; i++)
            if (clients[i].fd >= 0 && now - clients[i].last_ms > IDLE_TIMEOUT_MS) close_client(&clients[i]);
    }
    return NULL;
}

/* ---------------------------------------------------------------- start-up */

static bool private_dir(const char *dir) {
    struct stat st;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) return false;
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    return st.st_uid == geteuid() || st.st_uid == 0;
}

/* the socket path for MEDIC_HOOK_SOCKET's value: "auto", or a template with %p (pid) and %% */
static bool expand_path(const char *tmpl, char *out, size_t cap) {
    char pid[16];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    const char *start = tmpl;
    while (*start == ' ' || *start == '\t') start++;
    size_t word = strcspn(start, " \t");
    if (word == 4 && strncmp(start, "auto", 4) == 0 && start[4 + strspn(start + 4, " \t")] == 0) {
        const char *dir = getenv(HOOK_DIR_ENV), *xdg = getenv("XDG_RUNTIME_DIR");
        char buf[sizeof sock_path];
        int n;
        if (dir && *dir) {
            n = snprintf(buf, sizeof buf, "%s", dir);
        } else if (geteuid() == 0) {
            n = snprintf(buf, sizeof buf, "/run/medic");
        } else if (xdg && *xdg) {
            n = snprintf(buf, sizeof buf, "%s/medic", xdg);
        } else {
            n = snprintf(buf, sizeof buf, "/tmp/medic-%d", (int)getuid());
        }
        if (n < 0 || (size_t)n >= sizeof buf) return false;
        if (!private_dir(buf)) {
            debug("cannot use the socket directory", buf);
            return false;
        }
        n = snprintf(out, cap, "%s/hook.%s.sock", buf, pid);
        return n > 0 && (size_t)n < cap;
    }
    size_t len = 0;
    for (const char *p = tmpl; *p; p++) {
        const char *piece = p;
        size_t plen = 1;
        if (p[0] == '%' && p[1] == 'p') {
            piece = pid, plen = strlen(pid), p++;
        } else if (p[0] == '%' && p[1] == '%') {
            p++;
        }
        if (len + plen >= cap) return false;
        memcpy(out + len, piece, plen);
        len += plen;
    }
    out[len] = 0;
    if (out[0] != '/') return false;
    /* create the parent directory (one level) if missing, private */
    char *slash = strrchr(out, '/');
    if (slash && slash != out) {
        *slash = 0;
        bool ok = private_dir(out);
        *slash = '/';
        if (!ok) {
            debug("cannot use the socket directory of", out);
            return false;
        }
    }
    return true;
}

static bool socket_is_live(const struct sockaddr_un *addr) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return true;
    int rc = connect(fd, (const struct sockaddr *)addr, sizeof *addr);
    int err = errno;
    close(fd);
    return rc == 0 || (err != ECONNREFUSED && err != ENOENT);
}

static int bind_socket(const char *path) {
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    for (int attempt = 0; attempt < 2; attempt++) {
        mode_t old = umask(077); /* constructors run before the program's threads: safe here */
        int rc = bind(fd, (struct sockaddr *)&addr, sizeof addr);
        umask(old);
        if (rc == 0) {
            chmod(path, 0600);
            if (listen(fd, BACKLOG) == 0) return fd;
            unlink(path);
            break;
        }
        if (errno != EADDRINUSE || attempt > 0) break;
        struct stat st;
        if (socket_is_live(&addr) || lstat(path, &st) != 0 || !S_ISSOCK(st.st_mode)) {
            debug("another process serves", path); /* e.g. a child that inherited a path without %p */
            close(fd);
            return -1;
        }
        unlink(path); /* stale: its process exited or exec'd */
    }
    debug("cannot listen on", path);
    close(fd);
    return -1;
}

static void after_fork_in_child(void) {
    if (listen_fd >= 0) close(listen_fd); /* the parent keeps serving; the child has no server thread */
    listen_fd = -1;
    for (int i = 0; i < MAX_CLIENTS; i++) {
        if (clients[i].fd >= 0) close(clients[i].fd);
        clients[i].fd = -1;
    }
}

__attribute__((constructor)) static void medic_shim_start(void) {
    const char *tmpl = getenv(HOOK_ENV), *dbg = getenv(HOOK_DEBUG_ENV);
    if (!tmpl || !*tmpl) return;
    debug_on = dbg && *dbg && strcmp(dbg, "0") != 0;
    if (!expand_path(tmpl, sock_path, sizeof sock_path)) {
        debug("unusable " HOOK_ENV, tmpl);
        return;
    }
    for (int i = 0; i < MAX_CLIENTS; i++) clients[i].fd = -1;
    listen_fd = bind_socket(sock_path);
    if (listen_fd < 0) return;
    owner_pid = getpid();
    pthread_atfork(NULL, NULL, after_fork_in_child);

    pthread_attr_t attr;
    pthread_t thread;
    sigset_t all, old;
    sigfillset(&all);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, THREAD_STACK);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the thread inherits a mask with every signal blocked */
    int rc = pthread_create(&thread, &attr, serve, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        debug("cannot start the server thread", strerror(rc));
        close(listen_fd);
        unlink(sock_path);
        listen_fd = -1;
        return;
    }
    pthread_setname_np(thread, "medic-hook");
}

__attribute__((destructor)) static void medic_shim_stop(void) {
    if (listen_fd >= 0 && getpid() == owner_pid) unlink(sock_path);
}

/* lets `medic doctor` and the tests ask a loaded shim which path it serves */
EXPORT const char *medic_shim_socket_path(void) { return listen_fd >= 0 ? sock_path : NULL; }
