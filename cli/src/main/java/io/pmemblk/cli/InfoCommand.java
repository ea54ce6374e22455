package io.pmemblk.cli;

import io.pmemblk.pmem.BttRegion;
import io.pmemblk.pmem.LayoutRecord;
import io.pmemblk.pmem.Libpmem;
import io.pmemblk.pmem.PmemRegion;
import io.pmemblk.pmem.btt.Btt;
import io.pmemblk.settings.Keys;
import io.pmemblk.settings.Settings;
import io.pmemblk.settings.SettingsException;
import io.pmemblk.settings.Sizes;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.Callable;

/**
 * Prints the device as serve would open it: size, is_pmem, engine, thresholds. The backing file is mapped
 * only if it exists; when it does not, is_pmem is probed with a small scratch file in the same directory, so
 * the answer is what serve would find there.
 */
@Command(name = "info", mixinStandardHelpOptions = true,
        description = "Show the device's size, is_pmem, layout (raw or btt: sector size, arenas, free blocks), copy"
                + " engine and routing thresholds (key=value lines).")
final class InfoCommand implements Callable<Integer> {
    @Mixin
    SettingsOptions options;

    @Override
    public Integer call() throws IOException, SettingsException {
        Settings s = options.load();
        Path path = s.get(Keys.PMEM_PATH);
        System.out.println("path=" + path);
        boolean exists = Files.exists(path);
        System.out.println("exists=" + exists);
        if (exists) {
            // A file is mapped at its own size. Anything else (and an empty file, which cannot be mapped) is opened
            // with pmem.size, as serve opens it, to be refused in serve's words (a directory, a FIFO, "holds 0
            // bytes"); a size of 0 was refused first, as "size must be positive, got 0", naming nothing.
            long size = Files.isRegularFile(path) ? Files.size(path) : 0;
            try (PmemRegion r = PmemRegion.open(path, size > 0 ? size : s.get(Keys.PMEM_SIZE),
                    false, PmemRegion.Mapper.valueOf(s.get(Keys.PMEM_MAPPER).name()), false)) {
                System.out.println("size=" + r.size() + " (" + Sizes.format(r.size()) + ")");
                // a BTT keeps the size it was formatted with (serve takes the file's size)
                if (Files.isRegularFile(path) && r.size() != s.get(Keys.PMEM_SIZE)
                        && s.get(Keys.PMEM_LAYOUT) == Keys.Layout.RAW) {
                    System.out.println("size_mismatch=pmem.size is " + s.text(Keys.PMEM_SIZE)
                            + ": serve will refuse it unless pmem.resize=true");
                }
                System.out.println("is_pmem=" + r.isPmem());
                System.out.println("mapped_by=" + r.mappedBy());
                printLayout(s, r);
            }
        } else {
            long size = s.get(Keys.PMEM_SIZE);
            System.out.println("size=" + size + " (" + Sizes.format(size) + ")");
            Path dir = path.toAbsolutePath().getParent();
            if (dir != null && Files.isDirectory(dir)) {
                Path probe = Files.createTempFile(dir, ".pmemblk-probe", ".tmp");
                Files.delete(probe);
                try (PmemRegion r = PmemRegion.open(probe, 1 << 20, false,
                        PmemRegion.Mapper.valueOf(s.get(Keys.PMEM_MAPPER).name()))) {
                    System.out.println("is_pmem=" + r.isPmem());
                    System.out.println("mapped_by=" + r.mappedBy());
                } finally {
                    Files.deleteIfExists(probe);
                }
            } else {
                System.out.println("is_pmem=unknown (directory " + dir + " does not exist yet)");
            }
            System.out.println("layout=" + s.text(Keys.PMEM_LAYOUT).toLowerCase(java.util.Locale.ROOT)
                    + (s.get(Keys.PMEM_LAYOUT) == Keys.Layout.BTT ? " (serve creates the file with a BTT of "
                    + s.get(Keys.PMEM_SECTOR_SIZE) + "-byte sectors)" : ""));
        }
        String why = Libpmem.unavailableReason();
        System.out.println("libpmem=" + (why == null ? "loaded" : "unavailable: " + why));
        System.out.println("engine=" + s.text(Keys.DMA_ENGINE));
        System.out.println("dma.channels=" + s.get(Keys.DMA_CHANNELS));
        System.out.println("route.dma.min-bytes=" + s.text(Keys.ROUTE_DMA_MIN_BYTES));
        System.out.println("route.dma.min-segments=" + s.text(Keys.ROUTE_DMA_MIN_SEGMENTS));
        System.out.println("route.dma.bounce=" + s.get(Keys.ROUTE_DMA_BOUNCE));
        System.out.println("queues=" + s.get(Keys.QUEUES));
        System.out.println("queue.depth=" + s.get(Keys.QUEUE_DEPTH));
        System.out.println("nbd.export=" + s.get(Keys.NBD_EXPORT));
        Path sock = s.get(Keys.NBD_SOCKET);
        System.out.println("nbd.socket=" + (sock == null ? "" : sock));
        System.out.println("nbd.tcp=" + (s.get(Keys.NBD_PORT) == 0 ? "off" : s.get(Keys.NBD_BIND) + ":" + s.get(Keys.NBD_PORT)));
        return 0;
    }

    /**
     * The layout of the device as serve decides it: by its layout record and pmem.layout, never by its bytes
     * alone (docs/btt.md). Read only: a pool a server has open is not recovered or repaired here.
     */
    private static void printLayout(Settings s, PmemRegion r) throws IOException {
        boolean wantBtt = s.get(Keys.PMEM_LAYOUT) == Keys.Layout.BTT;
        LayoutRecord record = LayoutRecord.of(r, Device.layoutRecords());
        LayoutRecord.Entry recorded;
        try {
            recorded = record.read().orElse(null);
        } catch (IOException e) {
            System.out.println("layout_record=" + record.path());
            System.out.println("layout_problem=" + e.getMessage());
            return;
        }
        System.out.println("layout_record=" + record.path() + (recorded == null ? " (none)" : " (" +
                recorded.state().name().toLowerCase(java.util.Locale.ROOT) + ")"));
        if (recorded == null) {
            String incomplete = Btt.incomplete(r.memory());
            if (!wantBtt || incomplete != null) {
                System.out.println("layout=raw");
                if (!wantBtt && incomplete == null) {
                    // Said, never acted on: the bytes may be a client's (a guest keeping a BTT image on its disk).
                    System.out.println("layout_note=its bytes hold a complete BTT no record names (made by pmempool or"
                            + " a pmemblk before layout records, or a client's data): served raw, as pmem.layout=raw"
                            + " says; if it is a BTT of yours, serve it with --set pmem.layout=btt (which records it)");
                }
                if (wantBtt) {
                    System.out.println("layout_mismatch=pmem.layout is btt: serve will refuse this device, not recorded"
                            + " as a BTT and holding no complete one (" + incomplete + "); format it (erasing it) with: "
                            + BttRegion.FORMAT_COMMAND);
                }
                return;
            }
            System.out.println("layout=btt (not recorded: a complete BTT made elsewhere; serve takes it, as"
                    + " pmem.layout=btt says, and records it)");
        } else if (recorded.state() == LayoutRecord.State.FORMATTING) {
            System.out.println("layout=btt (a format did not finish: serve with pmem.layout=btt formats it again)");
        } else {
            System.out.println("layout=btt");
        }
        Btt.Summary b = Btt.summarize(r.memory());
        System.out.println("btt.sector_size=" + b.blockSize());
        System.out.println("btt.arenas=" + b.arenas());
        System.out.println("btt.sectors=" + b.blocks());
        System.out.println("btt.capacity=" + b.blocks() * b.blockSize() + " (" + Sizes.format(b.blocks() * b.blockSize()) + ")");
        System.out.println("btt.free_blocks=" + b.freeBlocks());
        System.out.println("btt.internal_block_size=" + b.internalBlockSize());
        if (b.problem() != null) {
            System.out.println("btt.problem=" + b.problem() + " (`pmempool check -v` says more, -r may repair it)");
        }
        if (!wantBtt) {
            System.out.println("layout_mismatch=pmem.layout is raw: serve will refuse this recorded BTT; serve it with"
                    + " --set pmem.layout=btt (or, if it no longer holds that BTT, remove " + record.path() + ")");
        } else if (!s.source(Keys.PMEM_SECTOR_SIZE).equals("default") && s.get(Keys.PMEM_SECTOR_SIZE) != b.blockSize()) {
            System.out.println("layout_mismatch=pmem.sector-size is " + s.get(Keys.PMEM_SECTOR_SIZE) + ", the BTT's is "
                    + b.blockSize() + ": serve will refuse it");
        }
    }
}
