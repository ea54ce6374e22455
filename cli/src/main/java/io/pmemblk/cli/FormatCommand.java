package io.pmemblk.cli;

import io.pmemblk.pmem.BttRegion;
import io.pmemblk.pmem.DataScan;
import io.pmemblk.pmem.LayoutRecord;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.pmem.btt.Btt;
import io.pmemblk.settings.Keys;
import io.pmemblk.settings.Settings;
import io.pmemblk.settings.SettingsException;
import io.pmemblk.settings.Sizes;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;
import picocli.CommandLine.Parameters;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.Callable;

/**
 * Lays out a BTT over a file or device-DAX node: the one way an existing device becomes {@code pmem.layout=btt},
 * since serve lays a BTT out only where pmemblk recorded one. What is there is erased, so a device that holds
 * anything (a non-zero byte anywhere in it: data is wherever a client wrote it, not only in the first MiB), or that
 * pmemblk recorded as a BTT, is refused without {@code --force}. The whole device is looked at, a sparse file's
 * holes skipped unread ({@link DataScan}). The new BTT is recorded ({@link LayoutRecord}).
 */
@Command(name = "format", mixinStandardHelpOptions = true,
        description = "Lay out a BTT (a PMDK pmemblk pool: sector-atomic writes) over FILE, erasing it, and record it"
                + " (FILE.pmemblk-layout beside a file); serve it then with --set pmem.layout=btt. A FILE holding data"
                + " (a non-zero byte anywhere in it) or recorded as a BTT is refused without --force.")
final class FormatCommand implements Callable<Integer> {
    @Option(names = "--layout", required = true, paramLabel = "btt", description = "The layout to make: btt.")
    String layout;

    @Option(names = "--sector-size", paramLabel = "N", defaultValue = "4096",
            description = "Sector size: 512 or 4096 (default: ${DEFAULT-VALUE}).")
    int sectorSize;

    @Option(names = "--size", paramLabel = "SIZE",
            description = "Size of FILE when it does not exist yet (K, M, G, T suffixes; default 1G); an existing"
                    + " file keeps its size.")
    String size;

    @Option(names = "--force", description = "Format even if FILE holds data (it is lost).")
    boolean force;

    @Option(names = "--mapper", paramLabel = "MAPPER", defaultValue = "auto",
            description = "How to map FILE: auto, libpmem or java (as pmem.mapper).")
    String mapper;

    @Parameters(index = "0", paramLabel = "FILE", description = "The backing file or /dev/daxX.Y to format.")
    Path file;

    @Override
    public Integer call() throws IOException, SettingsException {
        if (!layout.equalsIgnoreCase("btt")) {
            throw new SettingsException("--layout " + layout + " is not allowed; allowed: btt (a raw device needs no"
                    + " format: serve any file with pmem.layout=raw)");
        }
        if (sectorSize != 512 && sectorSize != 4096) {
            throw new SettingsException("--sector-size " + sectorSize + " is not allowed; allowed: 512 or 4096");
        }
        Keys.Mapper m;
        try {
            m = Keys.Mapper.valueOf(mapper.toUpperCase(java.util.Locale.ROOT));
        } catch (IllegalArgumentException e) {
            throw new SettingsException("--mapper " + mapper + " is not allowed; allowed: auto, libpmem or java");
        }
        boolean exists = Files.exists(file);
        long least = 8192 + (16 << 20); // a pool header and one 16 MiB arena (BttLayout)
        String badSize = "--size " + size + " is not allowed; allowed: a size that is a multiple of 4096, from 16M + 8K"
                + " to 16T";
        long bytes;
        if (exists) {
            // Not a file (a device-DAX node takes its own size): opened as serve opens it, to be refused in its words
            // if it is a directory or the like; a size of 0 was refused first as "size must be positive, got 0".
            bytes = Files.isRegularFile(file) ? Files.size(file) : least;
            long given;
            try {
                given = size == null ? bytes : Sizes.parse(size);
            } catch (IllegalArgumentException e) { // a usage error (exit 2), as for a file that does not exist
                throw new SettingsException(badSize);
            }
            if (Files.isRegularFile(file) && given != bytes) {
                throw new SettingsException("--size " + size + " is not allowed: " + file + " exists with " + bytes
                        + " bytes; allowed: no --size (the file keeps its size), or remove the file first");
            }
        } else {
            try {
                bytes = Settings.load(null, java.util.List.of("pmem.size=" + (size == null ? "1G" : size)))
                        .get(Keys.PMEM_SIZE);
            } catch (SettingsException e) {
                throw new SettingsException(badSize);
            }
        }
        if (Files.isRegularFile(file) || !exists) {
            if (bytes < least) {
                throw new SettingsException((exists ? file + " has " + bytes + " bytes" : "--size " + size)
                        + ": too small for a BTT; allowed: at least " + least + " bytes (16M + 8K)");
            }
        }
        try (PmemRegion region = PmemRegion.open(file, bytes, false, PmemRegion.Mapper.valueOf(m.name()))) {
            LayoutRecord record = LayoutRecord.of(region, Device.layoutRecords());
            if (!region.created() && !force) {
                String held = holds(region, record);
                if (held != null) {
                    System.err.println("pmemblk: " + file + " " + held + ": formatting would erase it; refused."
                            + " Add --force to format it anyway (its data is lost), or give another FILE");
                    return 1;
                }
            }
            Btt btt = BttRegion.format(region, record, sectorSize);
            System.out.println("formatted " + file + ": BTT of " + btt.blocks() + " sectors of " + btt.blockSize()
                    + " bytes (" + Sizes.format(btt.blocks() * btt.blockSize()) + " of " + Sizes.format(region.size())
                    + "), " + btt.arenaCount() + " arena(s), " + btt.freeBlocks() + " free blocks");
            System.out.println("recorded in " + record.path() + " (serve takes it for a BTT by this record, never by"
                    + " its bytes; keep it with the image)");
            System.out.println("serve it with: pmemblk serve --set pmem.layout=btt --set pmem.path=" + file);
            return 0;
        }
    }

    /** What the device already holds, in words, or null when pmemblk recorded nothing on it and every byte is zero. */
    private static String holds(PmemRegion region, LayoutRecord record) throws IOException {
        var recorded = record.read();
        if (recorded.isPresent()) {
            return "is recorded as a BTT already (" + record.path() + ")";
        }
        long at = DataScan.firstNonZero(region);
        return at < 0 ? null : "holds data (a non-zero byte at offset " + at + " of " + region.size() + ")";
    }
}
