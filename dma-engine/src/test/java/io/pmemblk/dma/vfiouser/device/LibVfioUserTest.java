package io.pmemblk.dma.vfiouser.device;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Where libvfio-user is looked for. (That `pmemblk dma-device` without it exits 1 naming the build script and the
 * settings is seen from the command itself, not here.) Seen failing with the existence
 * check taken out of locate(): "Expecting code to raise a throwable" (the loader would have been handed a path
 * that is not there, and said only that).
 */
class LibVfioUserTest {
    @TempDir
    Path dir;

    @AfterEach
    void clear() {
        System.clearProperty(LibVfioUser.PROPERTY);
    }

    @Test
    void theSettingWinsAndAMissingFileIsNamedWithTheSettingThatGaveIt() throws Exception {
        Path lib = Files.createFile(dir.resolve("libvfio-user.so.0"));
        System.setProperty(LibVfioUser.PROPERTY, lib.toString());
        assertThat(LibVfioUser.locate()).isEqualTo(lib.toString());
        System.setProperty(LibVfioUser.PROPERTY, dir.resolve("missing.so").toString());
        assertThatThrownBy(LibVfioUser::locate).isInstanceOf(UnsatisfiedLinkError.class)
                .hasMessageContaining("missing.so").hasMessageContaining(LibVfioUser.PROPERTY);
    }

    /**
     * What the DMA map callback gives a size to: page-aligned regions wholly inside libvfio-user's mapping, compared
     * unsigned (a region ending past the mapping would let the engines touch memory beyond it). Seen failing with
     * the containment check taken out: "[ends past the mapping] Expecting actual not to be null".
     */
    @Test
    void onlyAlignedRegionsInsideTheLibrarysMappingAreGivenASize() {
        long base = 0x7f00_0000_0000L;
        assertThat(LibVfioUser.unusableRegion(0x1000, 0x2000, base, base, 0x2000)).isNull();
        assertThat(LibVfioUser.unusableRegion(0x1000, 0x1000, base + 0x1000, base, 0x2000)).as("tail of a mapping").isNull();
        assertThat(LibVfioUser.unusableRegion(0x1001, 0x1000, base, base, 0x2000)).contains("IOVA 0x1001");
        assertThat(LibVfioUser.unusableRegion(0x1000, 0x1800, base, base, 0x2000)).contains("size 0x1800");
        assertThat(LibVfioUser.unusableRegion(0x1000, 0x1000, base + 0x800, base, 0x2000)).contains("file offset");
        assertThat(LibVfioUser.unusableRegion(0x1000, 0x2000, base + 0x1000, base, 0x2000)).as("ends past the mapping")
                .isNotNull();
        assertThat(LibVfioUser.unusableRegion(0x1000, 0x1000, base - 0x1000, base, 0x2000)).as("starts before it")
                .isNotNull();
        assertThat(LibVfioUser.unusableRegion(0x1000, 0x1000, -0x1000L, base, 0x2000)).as("an address with the top bit")
                .isNotNull();
        assertThat(LibVfioUser.unusableRegion(0x1000, -0x1000L, base + 0x1000, base, 0x2000)).as("a size that wraps")
                .isNotNull();
    }

    @Test
    void withoutASettingTheBuildScriptsOutputIsUsedWhenThere() {
        Path built = LibVfioUser.BUILD_SCRIPT_DEST.resolve("lib").resolve(LibVfioUser.SONAME);
        assertThat(LibVfioUser.locate()).isEqualTo(Files.isRegularFile(built) ? built.toString() : LibVfioUser.SONAME);
        assertThat(LibVfioUser.load()).as("this machine has it (bash ../shared/peers/build-libvfio-user.sh): %s",
                LibVfioUser.unavailableReason()).isPresent();
    }
}
