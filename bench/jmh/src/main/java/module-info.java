/**
 * JMH benchmarks of the copy paths. JMH runs them from its self-contained jar on the class path (its forks
 * reflect into the generated classes), so this descriptor states the dependencies and opens everything.
 */
open module io.pmemblk.bench {
    requires io.pmemblk.pmem;
    requires io.pmemblk.posix;
    requires java.management;
    requires jmh.core; // automatic name from jmh-core's jar
}
