package io.pmemblk.ublk;

import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.posix.FileCalls;
import io.pmemblk.posix.Libc;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * Which file a device serves, as recorded in the device, and the refusal of a recovery onto another one (the
 * refusal's kernel side, a quiesced device and a second server, runs in the guest: scripts/vm-test ublk-recovery).
 */
class BackingFileTest {
    @TempDir
    Path dir;

    static DeviceInfo quiesced(int id, long serverFlags) {
        return new DeviceInfo(id, 1, 64, UblkAbi.UBLK_S_DEV_QUIESCED, 1 << 20, -1,
                UblkAbi.UBLK_F_USER_COPY | UblkAbi.UBLK_F_USER_RECOVERY, serverFlags);
    }

    /** The identity of the file {@code path} names now, through a descriptor of its own (closed again). */
    static BackingFile identify(Path path) throws Exception {
        int fd = FileCalls.open(path.toString(), FileCalls.O_RDONLY, 0);
        try {
            return BackingFile.of(fd, path);
        } finally {
            Libc.close(fd);
        }
    }

    @Test
    void theIdentityIsThatOfTheFileMappedNotOfWhatItsPathNamesByThen() throws Exception {
        Path pool = dir.resolve("pool");
        try (PmemRegion region = PmemRegion.open(pool, 1 << 20, false, PmemRegion.Mapper.JAVA)) {
            BackingFile mapped = identify(pool);
            // Another file takes the name while the server runs (an operator's mv, a restore, a deploy tool's
            // rename), before the device records what it serves: the mapping still holds the first file.
            Path other = Files.write(dir.resolve("other"), new byte[1 << 20]);
            Files.move(other, pool, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
            BackingFile now = identify(pool);
            assertThat(now.ino()).as("the path names another inode now").isNotEqualTo(mapped.ino());

            BackingFile recorded = BackingFile.of(region.fd(), region.path());
            assertThat(recorded).as("the file mapped, as it was before the rename").isEqualTo(mapped);
            // so a recovery resumes the device only on the file it served, never on the one now at the path
            assertThat(UblkDevice.otherBackingFile(quiesced(7, recorded.identity()), now))
                    .contains("waiting for recovery of another backing file: it was serving inode " + mapped.ino());
            assertThat(UblkDevice.otherBackingFile(quiesced(7, recorded.identity()), mapped)).isNull();
        }
    }

    @Test
    void theIdentityStaysWhileTheFileIsWrittenAndIsNeverZero() throws Exception {
        Path f = Files.write(dir.resolve("pool"), new byte[8192]);
        BackingFile before = identify(f);
        try (FileChannel ch = FileChannel.open(f, StandardOpenOption.WRITE)) {
            ch.write(ByteBuffer.wrap(new byte[]{1, 2, 3}), 4096); // what serving does: mtime and ctime move
            ch.force(true);
        }
        BackingFile after = identify(f);
        assertThat(after).isEqualTo(before);
        assertThat(after.identity()).isEqualTo(before.identity()).isNotZero();
        assertThat(BackingFile.inodeOf(after.identity())).isEqualTo(Files.getAttribute(f, "unix:ino"));
        assertThat(UblkDevice.otherBackingFile(quiesced(7, before.identity()), after)).as("the same file").isNull();
    }

    @Test
    void anotherFileIsRefusedNamingTheInodeOfTheFileTheDeviceServed() throws Exception {
        BackingFile served = identify(Files.write(dir.resolve("served"), new byte[4096]));
        BackingFile other = identify(Files.write(dir.resolve("other"), new byte[4096]));
        assertThat(other.identity()).isNotEqualTo(served.identity());
        String why = UblkDevice.otherBackingFile(quiesced(7, served.identity()), other);
        assertThat(why).contains("ublk device 7 is waiting for recovery of another backing file: it was serving inode "
                        + served.ino() + " (identity 0x" + Long.toHexString(served.identity()) + ")")
                .contains("pmem.path=" + other.path() + " is inode " + other.ino())
                .contains("Serve the file it was serving with ublk.id=7 to resume it")
                .contains("-inum " + served.ino())
                .contains("ublk del -n 7");
    }

    @Test
    void theSameInodeNumberBornAgainIsAnotherFile() {
        // ext4 gives a file deleted and created again the same inode number; its birth time tells them apart.
        BackingFile old = new BackingFile("/p/pool", 0xFE00L, 12, 0, 1_764_000_000_000_000_000L);
        BackingFile reborn = new BackingFile("/p/pool", 0xFE00L, 12, 0, 1_764_000_000_004_000_000L);
        assertThat(reborn.identity()).isNotEqualTo(old.identity());
        assertThat(UblkDevice.otherBackingFile(quiesced(3, old.identity()), reborn))
                .contains("it was serving inode 12 of another filesystem, or a file since deleted and created again");
        BackingFile elsewhere = new BackingFile("/q/pool", 0xFE01L, 12, 0, old.birthNanos());
        assertThat(elsewhere.identity()).as("another filesystem").isNotEqualTo(old.identity());
    }

    @Test
    void aDeviceThatRecordsNoFileIsNotResumed() throws Exception {
        BackingFile here = identify(Files.write(dir.resolve("pool"), new byte[4096]));
        for (long recorded : new long[]{0, 0x2L}) { // an older pmemblk; ublksrv's own flags
            assertThat(UblkDevice.otherBackingFile(quiesced(5, recorded), here))
                    .contains("ublk device 5 is waiting for recovery but records no backing file (ublksrv_flags 0x"
                            + Long.toHexString(recorded) + ":")
                    .contains("ublk del -n 5");
        }
    }
}
