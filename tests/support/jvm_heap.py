"""JVMs whose memory does what a serving JVM's does: one leaks `byte[]` values into a static
`HashMap<String, byte[]>` until it throws `java.lang.OutOfMemoryError`, one keeps direct buffers from
the moment a line comes on its stdin until `-XX:MaxDirectMemorySize` stops it, one widens its GC sawtooth (more requests in flight) so that it
commits its heap up to `-Xmx` over a flat floor and stays there. All make request garbage. Each prints `ready PID` once it runs; the leaking one prints `oome` on
its stdout when the OutOfMemoryError comes, and exits."""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.histo import clean_env, compile_java, read_ready
from support.procs import SpawnFn

JAVA_HEAP = r"""
import java.nio.ByteBuffer;
import java.util.*;

public class HeapShapes {
    static final Map<String, byte[]> CACHE = new HashMap<>();
    static final List<ByteBuffer> BUFFERS = new ArrayList<>();
    static volatile Object sink;

    public static void main(String[] args) throws Exception {
        String mode = args[0];
        long number = Long.parseLong(args[1]);
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.flush();
        if (mode.equals("leak")) leak((int) number);
        else if (mode.equals("direct")) direct((int) number);
        else expand(number);
    }

    /** Request garbage only until a line comes on stdin; then a direct buffer of `kibPerTick` KiB
     * kept every 20 ms tick as well. */
    static void direct(int kibPerTick) throws Exception {
        while (System.in.available() == 0) {
            for (int i = 0; i < 2000; i++) sink = new int[16];
            Thread.sleep(20);
        }
        try {
            while (true) {
                BUFFERS.add(ByteBuffer.allocateDirect(kibPerTick * 1024));
                for (int i = 0; i < 2000; i++) sink = new int[16];
                Thread.sleep(20);
            }
        } catch (OutOfMemoryError e) {
            System.out.println("oome " + e.getMessage());
            System.out.flush();
            System.exit(3);
        }
    }

    /** `kibPerTick` KiB more held every 20 ms tick, plus request garbage. */
    static void leak(int kibPerTick) throws Exception {
        long key = 0;
        try {
            while (true) {
                for (int i = 0; i < kibPerTick; i++, key++) CACHE.put("request-" + key, new byte[1024]);
                for (int i = 0; i < 2000; i++) sink = new int[16];
                Thread.sleep(20);
            }
        } catch (OutOfMemoryError e) {
            CACHE.clear();
            System.out.println("oome " + e.getMessage());
            System.out.flush();
            System.exit(3);
        }
    }

    /** Requests in flight grow from a few to a few thousand over `rampMs`, then stay: each holds a
     * 16 KiB buffer for a few hundred allocations, so the heap widens its sawtooth and commits more. */
    static void expand(long rampMs) throws Exception {
        long start = System.currentTimeMillis();
        Object[] inflight = new Object[256];
        int slot = 0;
        while (true) {
            double f = Math.min(1.0, (System.currentTimeMillis() - start) / (double) rampMs);
            int perTick = 4 + (int) (f * 300);
            for (int i = 0; i < perTick; i++) {
                inflight[slot] = new byte[16 * 1024];
                slot = (slot + 1) % inflight.length;
            }
            Thread.sleep(5);
        }
    }
}
"""


def build_heap_shapes(out_dir: Path) -> Path:
    """Compile HeapShapes.java with javac; returns the class directory."""
    return compile_java(out_dir, "HeapShapes", JAVA_HEAP)


def start_heap_shape(
    spawn: SpawnFn, classes: Path, mode: str, number: int, *flags: str, **env: str
) -> tuple[subprocess.Popen, int]:
    """Start `HeapShapes leak|direct KIB_PER_TICK` or `HeapShapes expand RAMP_MS` with the JVM `flags`;
    returns the process and the JVM's pid once it runs. `direct` starts keeping buffers when
    `start_keeping(proc)` is called."""
    argv = ["java", *flags, "-cp", str(classes), "HeapShapes", mode, str(number)]
    proc = spawn(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=clean_env(**env),
    )
    return proc, int(read_ready(proc)[1])


def start_keeping(proc: subprocess.Popen) -> None:
    """Tell a `HeapShapes direct` JVM to start keeping its direct buffers."""
    assert proc.stdin is not None
    proc.stdin.write("keep\n")
    proc.stdin.flush()
