"""A JVM that leaks native memory through objects it never closes (`java.util.zip.Deflater`s kept in a
list, each holding about 250 KiB of zlib state outside the Java heap), and the same program serving
requests without the leak: both make per-request garbage (`float[]`, `NativeLeak$Scratch`) in a GC
sawtooth. Prints `ready PID` once it runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.histo import clean_env, compile_java, read_ready
from support.procs import SpawnFn

JAVA_NATIVE_LEAK = r"""
import java.util.*;
import java.util.zip.Deflater;

public class NativeLeak {
    static final List<Deflater> OPEN = new ArrayList<>();
    static final class Scratch { final float[] values = new float[32]; long stamp; }
    static volatile Object sink;

    public static void main(String[] args) throws Exception {
        boolean leak = args[0].equals("leak");
        int everyTicks = Integer.parseInt(args[1]);
        int cap = Integer.parseInt(args[2]);
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.flush();
        Random random = new Random(2);
        byte[] input = new byte[64 * 1024];
        random.nextBytes(input);
        byte[] output = new byte[80 * 1024];
        for (long tick = 0; ; tick++) {
            if (leak && tick % everyTicks == 0 && OPEN.size() < cap) {
                Deflater deflater = new Deflater();  // never end()ed: its zlib state stays allocated
                deflater.setInput(input);
                deflater.deflate(output, 0, output.length, Deflater.SYNC_FLUSH);
                OPEN.add(deflater);
            }
            int requests = 2000 + random.nextInt(4000);
            for (int i = 0; i < requests; i++) {
                Scratch scratch = new Scratch();
                scratch.stamp = tick;
                sink = scratch;
                sink = new float[16];
            }
            Thread.sleep(20);
        }
    }
}
"""
# small and steady: a serial collector and a small heap keep a healthy JVM's RSS near 50 MiB
JVM_FLAGS = (
    "-Xmx48m",
    "-Xss256k",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:ReservedCodeCacheSize=16m",
    "-XX:NativeMemoryTracking=summary",
)


def build_native_leak(out_dir: Path) -> Path:
    """Compile NativeLeak.java with javac; returns the class directory."""
    return compile_java(out_dir, "NativeLeak", JAVA_NATIVE_LEAK)


def start_native_leak(
    spawn: SpawnFn, classes: Path, leak: bool, every_ticks: int = 5, cap: int = 4000
) -> int:
    """Start the program (leaking one Deflater every `every_ticks` ticks of ~20 ms, at most `cap`);
    returns the JVM's pid once it runs."""
    argv = ["java", *JVM_FLAGS, "-cp", str(classes), "NativeLeak", "leak" if leak else "healthy"]
    proc = spawn(
        [*argv, str(every_ticks), str(cap)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(),
    )
    return int(read_ready(proc)[1])
