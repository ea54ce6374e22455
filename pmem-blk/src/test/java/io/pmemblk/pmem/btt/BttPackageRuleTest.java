package io.pmemblk.pmem.btt;

import io.pmemblk.pmem.PmemBlockDriver;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.lang.classfile.ClassFile;
import java.lang.classfile.constantpool.PoolEntry;
import java.lang.classfile.constantpool.Utf8Entry;
import java.net.URISyntaxException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Stream;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The engine's layering rule: the BTT (io.pmemblk.pmem.btt) reaches the media only through Persistence, Media and
 * MappingHold, and uses nothing of the block layer (io.pmemblk.queueing) or of the DMA engines (io.pmemblk.dma);
 * the request side that joins them lives in io.pmemblk.pmem. Read from the compiled classes' constant pools, not
 * from the import lines: a fully qualified name in the code, a type in a signature or a lambda's target counts too,
 * and an unused import (which makes no dependency) does not.
 */
class BttPackageRuleTest {
    private static final List<String> FORBIDDEN = List.of("io/pmemblk/queueing/", "io/pmemblk/dma/");

    @Test
    void theEngineUsesNeitherTheBlockLayerNorTheDmaEngines() throws Exception {
        List<Path> classes = classesOf(Btt.class);
        assertThat(classes).as("the package's classes were found").extracting(p -> p.getFileName().toString())
                .contains("Btt.class", "WriteGroup.class", "LaneHandle.class");
        List<String> found = new ArrayList<>();
        for (Path c : classes) {
            for (String ref : forbiddenReferences(c)) {
                found.add(c.getFileName() + " refers to " + ref);
            }
        }
        assertThat(found).as("io.pmemblk.pmem.btt must not use io.pmemblk.queueing or io.pmemblk.dma").isEmpty();
    }

    /** The check itself sees such a use: the driver, outside the engine, uses both. */
    @Test
    void theCheckSeesAUseWhereThereIsOne() throws Exception {
        Path driver = classesOf(PmemBlockDriver.class).stream()
                .filter(p -> p.getFileName().toString().equals("PmemBlockDriver.class")).findFirst().orElseThrow();
        assertThat(forbiddenReferences(driver)).anyMatch(r -> r.startsWith("io/pmemblk/queueing/"))
                .anyMatch(r -> r.startsWith("io/pmemblk/dma/"));
    }

    /** The class files of {@code type}'s package (nested and local classes included), from where it was loaded. */
    private static List<Path> classesOf(Class<?> type) throws IOException, URISyntaxException {
        Path root = Path.of(type.getProtectionDomain().getCodeSource().getLocation().toURI());
        Path dir = root.resolve(type.getPackageName().replace('.', '/'));
        try (Stream<Path> files = Files.list(dir)) {
            return files.filter(p -> p.toString().endsWith(".class")).sorted().toList();
        }
    }

    /** Every constant-pool string of the class that names a type of a forbidden package (class, descriptor, signature). */
    private static List<String> forbiddenReferences(Path classFile) throws IOException {
        List<String> refs = new ArrayList<>();
        for (PoolEntry e : ClassFile.of().parse(Files.readAllBytes(classFile)).constantPool()) {
            if (e instanceof Utf8Entry u) {
                String s = u.stringValue();
                for (String prefix : FORBIDDEN) {
                    if (s.contains(prefix)) {
                        refs.add(s);
                    }
                }
            }
        }
        return refs;
    }
}
