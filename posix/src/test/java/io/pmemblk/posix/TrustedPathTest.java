package io.pmemblk.posix;

import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * Two attacks on trusted paths (another user's directory, link or socket directory), set up for real: as root, with
 * files and directories chowned to another uid (no such user needs to exist), then checked with the real
 * lstat/open/fstat.
 */
class TrustedPathTest {
    /** Another user: anyone but root. */
    static final int MALLORY = 4242;

    @TempDir
    Path tmp;
    Path dir;
    final TrustedPath check = TrustedPath.ofThisProcess();

    @BeforeEach
    void rootOnly() throws Exception {
        assumeTrue(Libc.geteuid() == 0, "these tests chown files to another user: run them as root (CI does)");
        dir = tmp.toRealPath(); // @TempDir may sit under a link; the messages name real directories
        Files.setPosixFilePermissions(dir, PosixFilePermissions.fromString("rwx------"));
    }

    /** Opens (creating what is missing) and closes again: the path the file was opened as. */
    static Path openFile(TrustedPath trust, Path f, String setting) throws Exception {
        try (TrustedFile t = trust.openFile(f, setting, true)) {
            return t.path();
        }
    }

    static Path openDirectory(TrustedPath trust, Path d, String setting) throws Exception {
        try (TrustedDirectory t = trust.openDirectory(d, setting)) {
            return t.path();
        }
    }

    static Path openParentOf(TrustedPath trust, Path f, String setting) throws Exception {
        try (TrustedDirectory t = trust.openParentOf(f, setting)) {
            return t.path();
        }
    }

    private static void chown(Path p, int uid) throws Exception {
        Files.setAttribute(p, "unix:uid", uid, LinkOption.NOFOLLOW_LINKS); // lchown for a link
    }

    private static void chmod(Path p, String mode) throws Exception {
        Files.setPosixFilePermissions(p, PosixFilePermissions.fromString(mode));
    }

    private static void sticky(Path p) throws Exception {
        Files.setAttribute(p, "unix:mode", 01777);
    }

    @Test
    void statLayoutMatchesWhatTheJdkReads() throws Exception {
        Path f = Files.write(dir.resolve("f"), new byte[12345]);
        chmod(f, "rw-r-----");
        FileStat st = FileCalls.lstat(f.toString());
        assertThat(st.isRegularFile()).isTrue();
        assertThat(st.size()).isEqualTo(12345);
        assertThat(st.permissions()).isEqualTo("0640");
        assertThat(st.uid()).isEqualTo(Files.getAttribute(f, "unix:uid"));
        assertThat(st.gid()).isEqualTo(Files.getAttribute(f, "unix:gid"));
        assertThat(st.ino()).isEqualTo(Files.getAttribute(f, "unix:ino"));
        assertThat(st.dev()).isEqualTo(Files.getAttribute(f, "unix:dev"));
        Path l = Files.createSymbolicLink(dir.resolve("l"), f);
        assertThat(FileCalls.lstat(l.toString()).isSymbolicLink()).isTrue();
        assertThat(FileCalls.stat(l.toString()).ino()).isEqualTo(st.ino());
        FileStat null0 = FileCalls.stat("/dev/null");
        assertThat(null0.isCharacterDevice()).isTrue();
        assertThat(null0.rdev()).isEqualTo(Files.getAttribute(Path.of("/dev/null"), "unix:rdev"));
    }

    /** The first attack: a world-writable directory of another user, p.img a link to that user's file. */
    @Test
    void anotherUsersWorldWritableDirectoryWithALinkIsRefused() throws Exception {
        Path evil = Files.createDirectory(dir.resolve("pm-evil"));
        chmod(evil, "rwxrwxrwx");
        Path theirs = Files.write(evil.resolve("mine.img"), new byte[4096]);
        chown(theirs, MALLORY);
        Path link = Files.createSymbolicLink(evil.resolve("p.img"), theirs);
        chown(link, MALLORY);
        chown(evil, MALLORY);
        assertThatThrownBy(() -> openFile(check, link, "pmem.path"))
                .isInstanceOf(UnsafePathException.class)
                .hasMessageContaining("pmem.path " + link + ": directory " + evil + " is owned by uid " + MALLORY)
                .hasMessageContaining("not by root or by the user pmemblk runs as (root)")
                .hasMessageContaining("chown 0 " + evil);
    }

    /** The same link in a shared sticky directory (like /tmp itself): the link is what gets refused. */
    @Test
    void aFinalLinkIsNotFollowedEvenInAStickyDirectory() throws Exception {
        Path shared = Files.createDirectory(dir.resolve("shared"));
        sticky(shared);
        Path theirs = Files.write(shared.resolve("mine.img"), new byte[4096]);
        chown(theirs, MALLORY);
        Path link = Files.createSymbolicLink(shared.resolve("p.img"), theirs);
        chown(link, MALLORY);
        assertThatThrownBy(() -> openFile(check, link, "pmem.path"))
                .isInstanceOf(UnsafePathException.class)
                .hasMessageContaining("pmem.path " + link + " is a symbolic link (to " + theirs + ")")
                .hasMessageContaining("does not follow a final symbolic link");
        // a link of root's own, to root's own file, is refused all the same: the rule is about links, not owners
        Path own = Files.write(shared.resolve("own.img"), new byte[4096]);
        Path ownLink = Files.createSymbolicLink(shared.resolve("q.img"), own);
        assertThatThrownBy(() -> openFile(check, ownLink, "pmem.path")).hasMessageContaining("is a symbolic link");
    }

    @Test
    void anotherUsersFileInAStickyDirectoryIsRefused() throws Exception {
        Path shared = Files.createDirectory(dir.resolve("shared"));
        sticky(shared);
        Path theirs = Files.write(shared.resolve("p.img"), new byte[4096]);
        chmod(theirs, "rw-------");
        chown(theirs, MALLORY);
        assertThatThrownBy(() -> openFile(check, theirs, "pmem.path"))
                .isInstanceOf(UnsafePathException.class)
                .hasMessageContaining("pmem.path " + theirs + " is owned by uid " + MALLORY)
                .hasMessageContaining("chown 0 " + theirs);
    }

    /** The second attack: the socket's directory belongs to another user (mode 777). */
    @Test
    void aSocketDirectoryOfAnotherUserIsRefused() throws Exception {
        Path evil = Files.createDirectory(dir.resolve("pm-evil"));
        chmod(evil, "rwxrwxrwx");
        chown(evil, MALLORY);
        assertThatThrownBy(() -> openDirectory(check, evil, "nbd.socket"))
                .isInstanceOf(UnsafePathException.class)
                .hasMessageContaining("nbd.socket " + evil + ": directory " + evil + " is owned by uid " + MALLORY);
        assertThatThrownBy(() -> openParentOf(check, evil.resolve("nbd.sock"), "nbd.socket"))
                .hasMessageContaining("nbd.socket " + evil.resolve("nbd.sock") + ": directory " + evil + " is owned by");
        // and a directory to be created below it is refused for the same reason
        assertThatThrownBy(() -> openDirectory(check, evil.resolve("a/b"), "nbd.socket"))
                .hasMessageContaining("directory " + evil + " is owned by uid " + MALLORY);
    }

    @Test
    void aWorldWritableDirectoryWithoutTheStickyBitIsRefusedEvenIfRootOwnsIt() throws Exception {
        Path open = Files.createDirectory(dir.resolve("open"));
        chmod(open, "rwxrwxrwx");
        assertThatThrownBy(() -> openFile(check, open.resolve("p.img"), "pmem.path"))
                .isInstanceOf(UnsafePathException.class)
                .hasMessageContaining("directory " + open + " is writable by group or others without the sticky bit"
                        + " (mode 0777)")
                .hasMessageContaining("chmod go-w " + open);
        chmod(open, "rwxrwx---");
        assertThatThrownBy(() -> openDirectory(check, open, "nbd.socket")).hasMessageContaining("(mode 0770)");
        sticky(open);
        openDirectory(check, open, "nbd.socket"); // like /tmp: allowed
    }

    @Test
    void aGroupWritableFileIsRefused() throws Exception {
        Path f = Files.write(dir.resolve("p.img"), new byte[4096]);
        chmod(f, "rw-rw----");
        assertThatThrownBy(() -> openFile(check, f, "pmem.path"))
                .isInstanceOf(UnsafePathException.class)
                .hasMessageContaining("pmem.path " + f + " is writable by group or others (mode 0660)")
                .hasMessageContaining("chmod go-w " + f);
    }

    @Test
    void ownFilesAndDirectoriesPassAndAMissingFileIsToBeCreated() throws Exception {
        Path d = Files.createDirectories(dir.resolve("state/pmemblk"));
        Path f = Files.write(d.resolve("p.img"), new byte[4096]);
        chmod(f, "rw-------");
        assertThat(openFile(check, f, "pmem.path")).isEqualTo(f);
        assertThat(openFile(check, d.resolve("new.img"), "pmem.path")).isEqualTo(d.resolve("new.img"));
        openDirectory(check, dir.resolve("not/yet/there"), "nbd.socket");
        // another user's file the process may own: the check trusts whoever it runs as
        chown(f, MALLORY);
        assertThat(openFile(new TrustedPath(MALLORY), f, "pmem.path")).isEqualTo(f);
    }

    @Test
    void directoryLinksOnTheWayAreJudgedByTheirOwnerAndWhereTheyLead() throws Exception {
        Path real = Files.createDirectory(dir.resolve("real"));
        Path viaOwn = Files.createSymbolicLink(dir.resolve("via-own"), real);
        assertThat(openFile(check, viaOwn.resolve("p.img"), "pmem.path")).isEqualTo(viaOwn.resolve("p.img"));

        Path viaTheirs = Files.createSymbolicLink(dir.resolve("via-theirs"), real);
        chown(viaTheirs, MALLORY);
        assertThatThrownBy(() -> openFile(check, viaTheirs.resolve("p.img"), "pmem.path"))
                .hasMessageContaining(viaTheirs + " is owned by uid " + MALLORY);

        Path theirDir = Files.createDirectory(dir.resolve("their-dir"));
        chown(theirDir, MALLORY);
        Path toTheirs = Files.createSymbolicLink(dir.resolve("to-theirs"), theirDir);
        assertThatThrownBy(() -> openDirectory(check, toTheirs, "nbd.socket"))
                .hasMessageContaining("directory " + theirDir + " is owned by uid " + MALLORY);
    }

    @Test
    void onlyRootsLinksUnderDevToADaxNodeAreFollowed() {
        // /dev/stdin is root's link under /dev, but to /proc/self/fd/0, not to a /dev/daxX.Y node
        assertThatThrownBy(() -> openFile(check, Path.of("/dev/stdin"), "pmem.path"))
                .isInstanceOf(UnsafePathException.class)
                .hasMessageContaining("pmem.path /dev/stdin is a symbolic link");
    }

    @Test
    void aCharacterDeviceOwnedByRootPassesWhateverItsMode() throws Exception {
        // /dev/null is crw-rw-rw- root: a device node's mode is the administrator's access policy
        assertThat(openFile(check, Path.of("/dev/null"), "pmem.path")).isEqualTo(Path.of("/dev/null"));
    }

    @Test
    void aFifoOrADirectoryIsNotABackingFile() throws Exception {
        Path d = Files.createDirectory(dir.resolve("d"));
        assertThatThrownBy(() -> openFile(check, d, "pmem.path"))
                .hasMessageContaining("is a directory; allowed: a regular file, or a device-DAX node");
    }

    /** What is made through a held directory lands in the checked directory, whatever its name leads to by then. */
    @Test
    void whatIsMadeThroughAHeldDirectoryLandsInItEvenIfItsNameIsGivenToAnother() throws Exception {
        Path run = dir.resolve("run");
        try (TrustedDirectory held = check.openParentOf(run.resolve("nbd.sock"), "nbd.socket")) {
            Path moved = Files.move(run, dir.resolve("run.checked"));
            Path theirs = Files.createDirectory(run);
            chmod(theirs, "rwxrwxrwx");
            chown(theirs, MALLORY);
            assertThat(held.isAt(run)).as("the name leads elsewhere now").isFalse();
            assertThat(held.isAt(moved)).isTrue();
            Libc.close(FileCalls.openat(held.fd(), "made", FileCalls.O_RDWR | FileCalls.O_CREAT | FileCalls.O_EXCL | FileCalls.O_NOFOLLOW, 0600));
            assertThat(moved.resolve("made")).exists();
            assertThat(theirs.resolve("made")).doesNotExist();
        }
    }

    @Test
    void aNewFileIsCreatedExclusivelyMode0600AndADirectoryMadeOnTheWayIsSyncedByItsHeldParent() throws Exception {
        Path f = dir.resolve("state/pmemblk/p.img");
        try (TrustedFile t = check.openFile(f, "pmem.path", true)) {
            assertThat(t.created()).isTrue();
            assertThat(t.stat().permissions()).isEqualTo("0600");
            assertThat(t.stat().size()).isZero();
            assertThat(t.directory().madeDirectories()).containsExactly(dir.resolve("state/pmemblk"), dir.resolve("state"));
            t.directory().syncMadeDirectories();
            assertThat(FileCalls.fstat(t.fd()).ino()).isEqualTo(Files.getAttribute(f, "unix:ino"));
        }
        try (TrustedFile again = check.openFile(f, "pmem.path", true)) {
            assertThat(again.created()).as("found, not made again").isFalse();
            assertThat(again.directory().madeDirectories()).isEmpty();
        }
    }

    @Test
    void aDanglingLinkAtTheNameIsRefusedNotFollowedToCreateItsTarget() throws Exception {
        Path target = dir.resolve("elsewhere.img");
        Path link = Files.createSymbolicLink(dir.resolve("p.img"), target);
        assertThatThrownBy(() -> check.openFile(link, "pmem.path", true))
                .isInstanceOf(UnsafePathException.class)
                .hasMessageContaining("pmem.path " + link + " is a symbolic link (to " + target + ")");
        assertThat(target).doesNotExist();
    }

    @Test
    void aLoopOfDirectoryLinksIsRefused() throws Exception {
        Files.createSymbolicLink(dir.resolve("a"), dir.resolve("b"));
        Files.createSymbolicLink(dir.resolve("b"), dir.resolve("a"));
        assertThatThrownBy(() -> check.openFile(dir.resolve("a/p.img"), "pmem.path", true))
                .isInstanceOf(UnsafePathException.class)
                .hasMessageContaining("more than 40 symbolic links on the way");
    }

    /**
     * The lock PmemRegion takes: on the open file itself, so closing another descriptor of the same file (as the
     * JDK's and libpmem's mappers do) keeps it, where a classic POSIX lock would go; and it still excludes a
     * classic lock (FileChannel.tryLock, an older server).
     */
    @Test
    void anOpenFileLockSurvivesClosingAnotherDescriptorAndExcludesAClassicLock() throws Exception {
        Path f = dir.resolve("p.img");
        int held = ZeroedFile.openReadWrite(f, 4096);
        try {
            assertThat(FileCalls.lockExclusive(held)).isTrue();
            Libc.close(FileCalls.open(f.toString(), FileCalls.O_RDWR, 0));
            int other = FileCalls.open(f.toString(), FileCalls.O_RDWR, 0);
            try {
                assertThat(FileCalls.lockExclusive(other)).as("a second open file of the same file").isFalse();
            } finally {
                Libc.close(other);
            }
            try (var ch = java.nio.channels.FileChannel.open(f, java.nio.file.StandardOpenOption.WRITE)) {
                assertThat(ch.tryLock()).as("a classic POSIX lock").isNull();
            }
        } finally {
            Libc.close(held);
        }
        int after = FileCalls.open(f.toString(), FileCalls.O_RDWR, 0);
        try {
            assertThat(FileCalls.lockExclusive(after)).as("free once the holder closed").isTrue();
        } finally {
            Libc.close(after);
        }
    }
}
