"""Leaking programs for the histogram tests: a JVM leaking one class into a static map among churning
classes, a Python program leaking one type through the in-process hook, and a C program leaking from one
function among several allocating ones. Each prints `ready PID` once it runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from support import services
from support.procs import wait_ready

JAVA_LEAK = r"""
import java.util.*;

public class LeakClasses {
    static final Map<Long, LeakyRecord> RETAINED = new HashMap<>();
    static final class LeakyRecord {
        final long id;
        final byte[] payload = new byte[48];
        LeakyRecord(long id) { this.id = id; }
    }
    static final class ChurnEvent { long a, b, c; }
    static final class ChurnBuffer { final int[] data = new int[16]; }
    static final class ChurnRequest { String path = "/predict"; Object attachment = new Object(); }
    static final class CacheEntry { final long key; CacheEntry(long key) { this.key = key; } }
    static final Map<Long, CacheEntry> CACHE = new LinkedHashMap<>(16, 0.75f, true) {
        protected boolean removeEldestEntry(Map.Entry<Long, CacheEntry> eldest) { return size() > 2000; }
    };
    static volatile Object sink;

    public static void main(String[] args) throws Exception {
        int leakPerTick = Integer.parseInt(args[0]);
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.flush();
        Random random = new Random(1);
        long id = 0;
        while (true) {
            for (int i = 0; i < leakPerTick; i++, id++) RETAINED.put(id, new LeakyRecord(id));
            int churn = 20000 + random.nextInt(20000);
            for (int i = 0; i < churn; i++) {
                sink = new ChurnEvent();
                sink = new ChurnBuffer();
                sink = new ChurnRequest();
            }
            for (int i = 0; i < 300; i++) {
                long key = random.nextInt(5000);
                CACHE.put(key, new CacheEntry(key));
            }
            Thread.sleep(100);
        }
    }
}
"""

PYTHON_LEAK = r"""
import os, random, sys, time
sys.path.insert(0, sys.argv[1])
import medic_hook

class LeakyRecord:
    def __init__(self, i):
        self.id = i
        self.tags = [i, i + 1]

class ChurnEvent:
    def __init__(self):
        self.values = {"a": 1}

class ChurnRequest:
    pass

RETAINED = []
path = medic_hook.start(sys.argv[2])
print("ready", os.getpid(), path, flush=True)
rng = random.Random(1)
keep = []
while True:
    RETAINED.extend(LeakyRecord(i) for i in range(200))
    keep = [ChurnEvent() for _ in range(rng.randrange(100, 3000))]
    keep += [ChurnRequest() for _ in range(rng.randrange(100, 3000))]
    time.sleep(0.05)
"""

C_LEAK = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile sink;
static void **leaked;
static size_t nleaked, capleaked;
static void *ring[256];

__attribute__((noinline)) void leak_records(int n) {
    for (int i = 0; i < n; i++) {
        if (nleaked == capleaked) {
            capleaked = capleaked ? capleaked * 2 : 1024;
            leaked = realloc(leaked, capleaked * sizeof *leaked);
        }
        char *p = malloc(4096);
        memset(p, 1, 4096);
        leaked[nleaked++] = p;
    }
}

__attribute__((noinline)) void churn_buffers(int n) {
    for (int i = 0; i < n; i++) {
        char *p = malloc(65536);
        p[0] = 1;
        sink = p;
        free(p);
    }
}

__attribute__((noinline)) void cache_fill(int n) {
    static unsigned next;
    for (int i = 0; i < n; i++) {
        unsigned slot = next++ % 256;
        free(ring[slot]);
        ring[slot] = malloc(8192);
        memset(ring[slot], 2, 8192);
        sink = ring[slot];
    }
}

int main(int argc, char **argv) {
    int per_tick = argc > 1 ? atoi(argv[1]) : 256;
    int sleep_us = argc > 2 ? atoi(argv[2]) : 100000;
    int ticks = argc > 3 ? atoi(argv[3]) : 0; /* 0: until killed */
    printf("ready %d\n", getpid());
    fflush(stdout);
    for (int tick = 0; ticks == 0 || tick < ticks; tick++) {
        leak_records(per_tick);
        churn_buffers(200);
        cache_fill(500);
        usleep(sleep_us);
    }
    return 0;
}
"""


def build_java(out_dir: Path) -> Path:
    """Compile LeakClasses.java with javac; returns the class directory."""
    return compile_java(out_dir, "LeakClasses", JAVA_LEAK)


def compile_java(out_dir: Path, name: str, text: str) -> Path:
    """Compile the public class `name` (its source `text`) with javac into `out_dir`; returns it."""
    source = out_dir / f"{name}.java"
    source.write_text(text)
    subprocess.run(["javac", "-d", str(out_dir), str(source)], check=True, capture_output=True, timeout=120)
    return out_dir


def build_c(out_dir: Path) -> str:
    return services.build_c(out_dir, "leak_sites", C_LEAK)


def write_python(out_dir: Path) -> str:
    script = out_dir / "leak_types.py"
    script.write_text(PYTHON_LEAK)
    return str(script)


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without allocator or hook variables, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MEDIC_HOOK", "MALLOC_CONF", "HEAPPROFILE", "LD_PRELOAD", "JAVA_TOOL_OPTIONS"))
    }
    env.update(extra)
    return env


def read_ready(proc: subprocess.Popen, timeout: float = 60.0) -> list[str]:
    """`wait_ready` with the minute a JVM start or a compile may need."""
    return wait_ready(proc, timeout)
