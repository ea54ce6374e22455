package io.pmemblk.posix;

import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.stream.Stream;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** {@link TrustedDirectory#replaceDurably}: the one way pmemblk replaces its small records (layout, write cache). */
class TrustedDirectoryReplaceTest {
    @TempDir
    Path tmp;
    Path dir;

    @BeforeEach
    void privateDirectory() throws Exception {
        dir = tmp.toRealPath();
        Files.setPosixFilePermissions(dir, PosixFilePermissions.fromString("rwx------"));
    }

    private TrustedDirectory open() throws Exception {
        return TrustedPath.ofThisProcess().openDirectory(dir, "test.dir");
    }

    private List<String> names() throws Exception {
        try (Stream<Path> s = Files.list(dir)) {
            return s.map(p -> p.getFileName().toString()).sorted().toList();
        }
    }

    private static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    @Test
    void replacesAnExistingFileByANewOneMode0600AndAReaderOfTheOldKeepsTheOld() throws Exception {
        Path f = dir.resolve("record");
        Files.writeString(f, "old\n");
        Files.setPosixFilePermissions(f, PosixFilePermissions.fromString("rw-r--r--"));
        try (TrustedDirectory d = open(); InputStream before = Files.newInputStream(f)) {
            d.replaceDurably("record", utf8("new, and longer than the old\n"));
            assertThat(new String(before.readAllBytes(), StandardCharsets.UTF_8))
                    .as("a reader that opened the old file: it was not written over").isEqualTo("old\n");
        }
        assertThat(Files.readString(f)).isEqualTo("new, and longer than the old\n");
        assertThat(Files.getPosixFilePermissions(f)).isEqualTo(PosixFilePermissions.fromString("rw-------"));
        assertThat(names()).containsExactly("record");
    }

    @Test
    void createsAMissingFileAndReplacesItAgainShorter() throws Exception {
        try (TrustedDirectory d = open()) {
            d.replaceDurably("r", utf8("first, long\n"));
            d.replaceDurably("r", utf8("2\n"));
            d.replaceDurably("e", new byte[0]);
        }
        assertThat(Files.readString(dir.resolve("r"))).isEqualTo("2\n");
        assertThat(Files.size(dir.resolve("e"))).isZero();
        assertThat(Files.getPosixFilePermissions(dir.resolve("r"))).isEqualTo(PosixFilePermissions.fromString("rw-------"));
        assertThat(names()).containsExactly("e", "r");
    }

    @Test
    void aSymbolicLinkAtTheNameIsReplacedNotFollowed() throws Exception {
        Path elsewhere = Files.createDirectory(dir.resolve("elsewhere")).resolve("target");
        Files.writeString(elsewhere, "not pmemblk's\n");
        Path link = Files.createSymbolicLink(dir.resolve("record"), elsewhere);
        try (TrustedDirectory d = open()) {
            d.replaceDurably("record", utf8("mine\n"));
        }
        assertThat(Files.readString(elsewhere)).as("where the link pointed: untouched").isEqualTo("not pmemblk's\n");
        assertThat(Files.isSymbolicLink(link)).isFalse();
        assertThat(Files.isRegularFile(link, LinkOption.NOFOLLOW_LINKS)).isTrue();
        assertThat(Files.readString(link)).isEqualTo("mine\n");
        assertThat(names()).containsExactly("elsewhere", "record");
    }

    @Test
    void aFailureLeavesWhatWasThereAndNoTemporaryFileAndSaysWhatFailed() throws Exception {
        // a non-empty directory at the name: the new file is written and synced, and the rename over it fails
        Path at = Files.createDirectory(dir.resolve("record"));
        Files.writeString(at.resolve("inside"), "old\n");
        try (TrustedDirectory d = open()) {
            assertThatThrownBy(() -> d.replaceDurably("record", utf8("new\n")))
                    .hasMessageStartingWith("cannot replace " + dir.resolve("record") + ": renameat(")
                    .hasMessageContaining("record.tmp-");
        }
        assertThat(Files.readString(at.resolve("inside"))).isEqualTo("old\n");
        assertThat(names()).as("the temporary file removed").containsExactly("record");
    }

    @Test
    void concurrentWritersNeverShareATemporaryFile() throws Exception {
        int writers = 4, rounds = 50;
        ExecutorService pool = Executors.newFixedThreadPool(writers);
        try (TrustedDirectory d = open()) {
            List<Future<Void>> done = new ArrayList<>();
            for (int w = 0; w < writers; w++) {
                String text = ("writer " + w + "\n").repeat(100 * (w + 1)); // torn or mixed would show
                done.add(pool.submit((Callable<Void>) () -> {
                    for (int i = 0; i < rounds; i++) {
                        d.replaceDurably("record", utf8(text));
                    }
                    return null;
                }));
            }
            for (Future<Void> f : done) {
                f.get();
            }
        } finally {
            pool.shutdownNow();
        }
        String last = Files.readString(dir.resolve("record"));
        assertThat(last).as("one writer's whole text").matches("(writer (\\d)\\n)+");
        assertThat(last.length()).isEqualTo("writer 0\n".length() * 100 * (last.charAt(7) - '0' + 1));
        assertThat(names()).containsExactly("record");
    }

    @Test
    void aNameWithASlashIsRefused() throws Exception {
        try (TrustedDirectory d = open()) {
            assertThatThrownBy(() -> d.replaceDurably("../x", utf8("x"))).isInstanceOf(IllegalArgumentException.class);
            assertThatThrownBy(() -> d.replaceDurably("..", utf8("x"))).isInstanceOf(IllegalArgumentException.class);
        }
    }
}
