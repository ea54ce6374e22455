package io.pmemblk.bench;

import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Measurement;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.Warmup;

/**
 * The run every benchmark of this module is measured with, written once (JMH reads these annotations from a
 * superclass): one thread's own state, 3 warm-up and 5 measured iterations of a second each, one forked JVM with
 * native access (the copies and the DMA models bind native calls). Each benchmark names its own mode and unit.
 */
@State(Scope.Thread)
@Warmup(iterations = 3, time = 1)
@Measurement(iterations = 5, time = 1)
@Fork(value = 1, jvmArgsAppend = "--enable-native-access=ALL-UNNAMED")
public abstract class MeasuredRun {
}
