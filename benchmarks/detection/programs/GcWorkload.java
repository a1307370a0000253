import java.util.ArrayList;
import java.util.List;

/** A JVM serving requests: short-lived garbage makes the heap saw up and down between GCs;
 *  with a leak rate, each second also keeps that many KiB forever (a cache that never evicts).
 *    java -Xmx384m -Xlog:gc:file=gc.log GcWorkload LEAK_KIB_PER_S */
public class GcWorkload {
    static final List<byte[]> live = new ArrayList<>(); // a steady working set
    static final List<byte[]> kept = new ArrayList<>(); // what leaks
    static volatile Object sink;

    public static void main(String[] args) throws InterruptedException {
        int leakKib = args.length > 0 ? Integer.parseInt(args[0]) : 0;
        for (int i = 0; i < 4096; i++) live.add(new byte[4096]); // 16 MiB
        while (true) {
            for (int i = 0; i < 2000; i++) { // requests: about 2 MiB of garbage per 20 ms tick
                byte[] garbage = new byte[1024];
                garbage[i % 1024] = 1;
                sink = garbage;
            }
            if (leakKib > 0) {
                for (int i = 0; i < leakKib / 50; i++) kept.add(new byte[1024]); // leakKib per second
            }
            Thread.sleep(20);
        }
    }
}
