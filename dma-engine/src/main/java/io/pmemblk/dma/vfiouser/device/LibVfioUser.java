package io.pmemblk.dma.vfiouser.device;

import io.pmemblk.posix.Errno;
import io.pmemblk.posix.LibraryProbe;
import io.pmemblk.posix.Native;
import io.pmemblk.posix.NativeException;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.SymbolLookup;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Optional;

import static io.pmemblk.posix.Native.ERRNO;
import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_BOOLEAN;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static java.lang.foreign.ValueLayout.JAVA_SHORT;

/**
 * nutanix/libvfio-user (libvfio-user.so.0, commit efd091b, BSD-3-Clause), the vfio-user server library, bound once
 * through FFM: its functions as downcalls, its callbacks as upcalls into a {@link Callbacks} object. Signatures,
 * enums and {@code vfu_dma_info_t} from its {@code include/libvfio-user.h}. Debian has no package of it: the
 * library is looked for at {@code -Dpmemblk.libvfio-user=PATH}, then {@code $PMEMBLK_LIBVFIO_USER}, then where
 * {@code ../shared/peers/build-libvfio-user.sh} puts it ({@code ~/.cache/libvfio-user-efd091b/lib}), then by its
 * soname on the loader's path. {@link #load()} is empty with a reason naming what is missing and how to get it.
 *
 * <p>Like {@code io.pmemblk.pmem.Libpmem}, this is a binding class outside io.pmemblk.posix that loads a library of
 * its own, under this module's own native-access grant; errno capture and invokeExact's Throwable handling are
 * {@link Native}'s. Every restricted operation (library lookup, upcall stubs, giving a C pointer a size) is here;
 * the device code above sees sized segments only.
 *
 * <p>Threading: libvfio-user's context is not thread-safe, and every call here is made by the one thread that owns
 * the context (the device's run loop); the callbacks run on that thread, inside {@link #runCtx}.
 */
public final class LibVfioUser {
    public static final String SONAME = "libvfio-user.so.0";
    /** Where {@code build-libvfio-user.sh} installs it by default (its DEST). */
    public static final Path BUILD_SCRIPT_DEST = Path.of(System.getProperty("user.home"), ".cache", "libvfio-user-efd091b");
    public static final String PROPERTY = "pmemblk.libvfio-user";
    public static final String ENV = "PMEMBLK_LIBVFIO_USER";

    // ---- libvfio-user.h ----
    /** vfu_trans_t */
    public static final int VFU_TRANS_SOCK = 0;
    /** vfu_create_ctx flags: attach and run without blocking (the run loop polls the socket itself). */
    public static final int LIBVFIO_USER_FLAG_ATTACH_NB = 1;
    /** vfu_dev_type_t */
    public static final int VFU_DEV_TYPE_PCI = 0;
    /** vfu_pci_type_t */
    public static final int VFU_PCI_TYPE_EXPRESS = 3;
    /** pci_regs.h PCI_HEADER_TYPE_NORMAL */
    public static final int PCI_HEADER_TYPE_NORMAL = 0;
    // region indices (enum VFU_PCI_DEV_*_REGION_IDX)
    public static final int VFU_PCI_DEV_BAR0_REGION_IDX = 0;
    public static final int VFU_PCI_DEV_BAR2_REGION_IDX = 2;
    public static final int VFU_PCI_DEV_CFG_REGION_IDX = 7;
    // region flags
    public static final int VFU_REGION_FLAG_READ = 1;
    public static final int VFU_REGION_FLAG_WRITE = 1 << 1;
    public static final int VFU_REGION_FLAG_RW = VFU_REGION_FLAG_READ | VFU_REGION_FLAG_WRITE;
    public static final int VFU_REGION_FLAG_MEM = 1 << 2;
    // enum vfu_dev_irq_type
    public static final int VFU_DEV_INTX_IRQ = 0;
    public static final int VFU_DEV_MSI_IRQ = 1;
    public static final int VFU_DEV_MSIX_IRQ = 2;
    /** vfu_setup_device_dma's max_regions default (LIBVFIO_USER_MAX_DMA_REGIONS). */
    public static final long LIBVFIO_USER_MAX_DMA_REGIONS = 1000 * 1000;
    // vfu_reset_type_t
    public static final int VFU_RESET_DEVICE = 0;
    public static final int VFU_RESET_LOST_CONN = 1;
    public static final int VFU_RESET_PCI_FLR = 2;
    // syslog.h levels, for vfu_setup_log
    public static final int LOG_ERR = 3;
    public static final int LOG_WARNING = 4;
    public static final int LOG_INFO = 6;
    public static final int LOG_DEBUG = 7;
    /** The PCIe configuration space libvfio-user keeps for a VFU_PCI_TYPE_EXPRESS device (PCI_CFG_SPACE_EXP_SIZE). */
    public static final long PCI_CFG_SPACE_EXP_SIZE = 4096;

    // vfu_dma_info_t: struct iovec iova; void *vaddr; struct iovec mapping; size_t page_size; uint32_t prot;
    static final long DMA_INFO_IOVA_BASE = 0;
    static final long DMA_INFO_IOVA_LEN = 8;
    static final long DMA_INFO_VADDR = 16;
    static final long DMA_INFO_MAPPING_BASE = 24;
    static final long DMA_INFO_MAPPING_LEN = 32;
    static final long DMA_INFO_PROT = 48;
    /**
     * The granule a region's IOVA, address and size must be aligned to: the smallest IOMMU page, as Linux's
     * vfio_iommu_type1 (vfio_dma_do_map) requires of a VFIO_IOMMU_MAP_DMA. libvfio-user checks none of them.
     */
    static final long DMA_PAGE = 4096;

    /**
     * What the device does when libvfio-user calls back; every method runs on the context's thread. An exception
     * must not cross into C (the JVM would exit): the adapters here catch it and answer the library with an error.
     */
    public interface Callbacks {
        /** A library log line at syslog {@code level}. */
        void log(int level, String message);

        /**
         * A BAR0 access of {@code buf.byteSize()} bytes at {@code offset}: fill buf on a read, take it on a write.
         * @return bytes handled, or -1 to fail the access
         */
        long bar0(MemorySegment buf, long offset, boolean write);

        /** A configuration-space access the library leaves to the device (outside the header and capabilities). */
        long config(MemorySegment buf, long offset, boolean write);

        /** A BAR2 access by message (a client that did not map the region); as {@link #bar0}. */
        long bar2(MemorySegment buf, long offset, boolean write);

        /**
         * The client mapped {@code [iova, iova+length)}; {@code memory} is its mapping here, or null with
         * {@code unreachable} saying why (no fd given, or a region {@link #unusableRegion} refuses).
         */
        void dmaRegistered(long iova, long length, MemorySegment memory, int prot, String unreachable);

        /** The client unmapped the region at {@code iova}; its memory is unmapped when this returns. */
        void dmaUnregistered(long iova, long length);

        /** A reset of {@code type} (VFU_RESET_*): 0, or -1 to refuse it. */
        int reset(int type);
    }

    private static final LibraryProbe<LibVfioUser> LOADED = new LibraryProbe<>(LibVfioUser::probe);
    private static volatile String unavailableReason = "not probed";

    private static final class Bound {
        static final SymbolLookup LIB = SymbolLookup.libraryLookup(locate(), Arena.global());
        static final Linker LINKER = Linker.nativeLinker();
        static final MethodHandle CREATE_CTX = down("vfu_create_ctx",
                FunctionDescriptor.of(ADDRESS, JAVA_INT, ADDRESS, JAVA_INT, ADDRESS, JAVA_INT), true);
        static final MethodHandle SETUP_LOG = down("vfu_setup_log",
                FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS, JAVA_INT), true);
        static final MethodHandle PCI_INIT = down("vfu_pci_init",
                FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_INT, JAVA_INT, JAVA_INT), true);
        static final MethodHandle PCI_SET_ID = down("vfu_pci_set_id",
                FunctionDescriptor.ofVoid(ADDRESS, JAVA_SHORT, JAVA_SHORT, JAVA_SHORT, JAVA_SHORT), false);
        static final MethodHandle PCI_SET_CLASS = down("vfu_pci_set_class",
                FunctionDescriptor.ofVoid(ADDRESS, JAVA_BYTE, JAVA_BYTE, JAVA_BYTE), false);
        static final MethodHandle PCI_GET_CONFIG_SPACE = down("vfu_pci_get_config_space",
                FunctionDescriptor.of(ADDRESS, ADDRESS), false);
        static final MethodHandle PCI_ADD_CAPABILITY = down("vfu_pci_add_capability",
                FunctionDescriptor.of(JAVA_LONG, ADDRESS, JAVA_LONG, JAVA_INT, ADDRESS), true);
        static final MethodHandle SETUP_REGION = down("vfu_setup_region", FunctionDescriptor.of(JAVA_INT, ADDRESS,
                JAVA_INT, JAVA_LONG, ADDRESS, JAVA_INT, ADDRESS, JAVA_INT, JAVA_INT, JAVA_LONG), true);
        static final MethodHandle SETUP_NR_IRQS = down("vfu_setup_device_nr_irqs",
                FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_INT, JAVA_INT), true);
        static final MethodHandle SETUP_DMA = down("vfu_setup_device_dma",
                FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG, ADDRESS, ADDRESS), true);
        static final MethodHandle SETUP_RESET = down("vfu_setup_device_reset_cb",
                FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS), true);
        static final MethodHandle REALIZE = down("vfu_realize_ctx", FunctionDescriptor.of(JAVA_INT, ADDRESS), true);
        static final MethodHandle ATTACH = down("vfu_attach_ctx", FunctionDescriptor.of(JAVA_INT, ADDRESS), true);
        static final MethodHandle GET_POLL_FD = down("vfu_get_poll_fd", FunctionDescriptor.of(JAVA_INT, ADDRESS), false);
        static final MethodHandle RUN = down("vfu_run_ctx", FunctionDescriptor.of(JAVA_INT, ADDRESS), true);
        static final MethodHandle IRQ_TRIGGER = down("vfu_irq_trigger",
                FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_INT), true);
        static final MethodHandle DESTROY = down("vfu_destroy_ctx", FunctionDescriptor.ofVoid(ADDRESS), false);

        // upcall shapes (typedefs in libvfio-user.h)
        static final FunctionDescriptor LOG_FN = FunctionDescriptor.ofVoid(ADDRESS, JAVA_INT, ADDRESS);
        static final FunctionDescriptor REGION_ACCESS_CB = FunctionDescriptor.of(JAVA_LONG, ADDRESS, ADDRESS,
                JAVA_LONG, JAVA_LONG, JAVA_BOOLEAN);
        static final FunctionDescriptor DMA_CB = FunctionDescriptor.ofVoid(ADDRESS, ADDRESS);
        static final FunctionDescriptor RESET_CB = FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_INT);

        private static MethodHandle down(String name, FunctionDescriptor fd, boolean errno) {
            MemorySegment symbol = LIB.find(name)
                    .orElseThrow(() -> new UnsatisfiedLinkError(SONAME + " has no symbol " + name));
            return errno ? LINKER.downcallHandle(symbol, fd, ERRNO) : LINKER.downcallHandle(symbol, fd);
        }
    }

    private LibVfioUser() {}

    /** The library file to load: the setting, the environment, the build script's output, else the soname. */
    static String locate() {
        String p = System.getProperty(PROPERTY);
        if (p == null || p.isBlank()) {
            p = System.getenv(ENV);
        }
        if (p != null && !p.isBlank()) {
            if (!Files.isRegularFile(Path.of(p))) {
                throw new UnsatisfiedLinkError(p + " (from " + PROPERTY + " / " + ENV + ") is not a file");
            }
            return p;
        }
        Path built = BUILD_SCRIPT_DEST.resolve("lib").resolve(SONAME);
        return Files.isRegularFile(built) ? built.toString() : SONAME;
    }

    /** libvfio-user if it loads; empty otherwise, see {@link #unavailableReason()}. */
    public static Optional<LibVfioUser> load() {
        return LOADED.get();
    }

    private static Optional<LibVfioUser> probe() {
        try {
            MethodHandle touch = Bound.DESTROY; // initialises Bound: loads the library and finds every symbol
            if (touch == null) {
                throw new AssertionError();
            }
            unavailableReason = null;
            return Optional.of(new LibVfioUser());
        } catch (ExceptionInInitializerError | UnsatisfiedLinkError | NoClassDefFoundError | IllegalArgumentException e) {
            Throwable why = e instanceof ExceptionInInitializerError && e.getCause() != null ? e.getCause() : e;
            unavailableReason = SONAME + " could not be loaded (" + why.getMessage() + "). Debian has no package of"
                    + " it: build it with `bash ../shared/peers/build-libvfio-user.sh` (installs into "
                    + BUILD_SCRIPT_DEST + "/lib, where pmemblk looks), or point -D" + PROPERTY + "=PATH or "
                    + ENV + "=PATH at a libvfio-user.so.0 (docs/operating.md, \"The DMA device over vfio-user\")";
            return Optional.empty();
        }
    }

    /** Why {@link #load()} is empty, or null when the library is loaded. */
    public static String unavailableReason() {
        load();
        return unavailableReason;
    }

    /** The library {@link #load()} succeeds with, or an exception whose message says how to get it. */
    public static LibVfioUser require() {
        return load().orElseThrow(() -> new IllegalStateException(unavailableReason));
    }

    // ---- context set-up ----

    /** vfu_create_ctx(VFU_TRANS_SOCK, path, flags, NULL, VFU_DEV_TYPE_PCI): binds and listens on {@code path}. */
    public MemorySegment createCtx(String path, int flags) throws NativeException {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment state = Native.callState();
            MemorySegment ctx;
            try {
                ctx = (MemorySegment) Bound.CREATE_CTX.invokeExact(state, VFU_TRANS_SOCK, a.allocateFrom(path), flags,
                        MemorySegment.NULL, VFU_DEV_TYPE_PCI);
            } catch (Throwable t) {
                throw Native.unexpected(t);
            }
            if (ctx.equals(MemorySegment.NULL)) {
                throw failed("vfu_create_ctx(" + path + ")", Native.errno(state));
            }
            return ctx;
        }
    }

    /**
     * The upcall stubs for {@code callbacks}, allocated in {@code arena} (which must outlive the context), and
     * registered on {@code ctx}: log at {@code logLevel}, the reset callback, and DMA register/unregister with at most
     * {@code maxDmaRegions} regions. The region callbacks are given with {@link #setupRegion}.
     */
    public Stubs stubs(Callbacks callbacks, Arena arena) {
        return new Stubs(callbacks, arena);
    }

    /** The C function pointers of one device's callbacks. */
    public static final class Stubs {
        final MemorySegment log;
        final MemorySegment bar0;
        final MemorySegment config;
        final MemorySegment bar2;
        final MemorySegment dmaRegister;
        final MemorySegment dmaUnregister;
        final MemorySegment reset;
        private final Callbacks cb;

        @SuppressWarnings("restricted")
        private Stubs(Callbacks cb, Arena arena) {
            this.cb = cb;
            Linker linker = Bound.LINKER;
            MethodHandles.Lookup l = MethodHandles.lookup();
            try {
                log = linker.upcallStub(l.findVirtual(Stubs.class, "onLog",
                        MethodType.methodType(void.class, MemorySegment.class, int.class, MemorySegment.class)).bindTo(this),
                        Bound.LOG_FN, arena);
                MethodType access = MethodType.methodType(long.class, MemorySegment.class, MemorySegment.class,
                        long.class, long.class, boolean.class);
                // One upcall for every region, told apart by the leading argument bound here.
                MethodHandle region = l.findVirtual(Stubs.class, "onRegion",
                        access.insertParameterTypes(0, RegionCallback.class)).bindTo(this);
                bar0 = linker.upcallStub(MethodHandles.insertArguments(region, 0, RegionCallback.BAR0),
                        Bound.REGION_ACCESS_CB, arena);
                config = linker.upcallStub(MethodHandles.insertArguments(region, 0, RegionCallback.CONFIG),
                        Bound.REGION_ACCESS_CB, arena);
                bar2 = linker.upcallStub(MethodHandles.insertArguments(region, 0, RegionCallback.BAR2),
                        Bound.REGION_ACCESS_CB, arena);
                MethodType dma = MethodType.methodType(void.class, MemorySegment.class, MemorySegment.class);
                dmaRegister = linker.upcallStub(l.findVirtual(Stubs.class, "onDmaRegister", dma).bindTo(this),
                        Bound.DMA_CB, arena);
                dmaUnregister = linker.upcallStub(l.findVirtual(Stubs.class, "onDmaUnregister", dma).bindTo(this),
                        Bound.DMA_CB, arena);
                reset = linker.upcallStub(l.findVirtual(Stubs.class, "onReset",
                        MethodType.methodType(int.class, MemorySegment.class, int.class)).bindTo(this),
                        Bound.RESET_CB, arena);
            } catch (ReflectiveOperationException e) {
                throw new AssertionError("an upcall target of LibVfioUser.Stubs is missing", e);
            }
        }

        @SuppressWarnings("restricted")
        private void onLog(MemorySegment ctx, int level, MemorySegment msg) {
            try {
                cb.log(level, msg.reinterpret(4096).getString(0));
            } catch (Throwable t) {
                // nothing may cross into C; a log line lost is all this costs
            }
        }

        /** A region's access callback. */
        @SuppressWarnings("restricted")
        private long onRegion(RegionCallback which, MemorySegment ctx, MemorySegment buf, long count, long offset,
                              boolean write) {
            try {
                MemorySegment b = buf.reinterpret(count);
                return switch (which) {
                    case BAR0 -> cb.bar0(b, offset, write);
                    case CONFIG -> cb.config(b, offset, write);
                    case BAR2 -> cb.bar2(b, offset, write);
                };
            } catch (Throwable t) {
                cb.log(LOG_ERR, which + " " + (write ? "write" : "read") + " of " + count + " at 0x"
                        + Long.toHexString(offset) + " failed: " + t);
                return -1;
            }
        }

        @SuppressWarnings("restricted")
        private void onDmaRegister(MemorySegment ctx, MemorySegment info) {
            try {
                MemorySegment i = info.reinterpret(DMA_INFO_PROT + 4);
                long iova = i.get(JAVA_LONG, DMA_INFO_IOVA_BASE);
                long length = i.get(JAVA_LONG, DMA_INFO_IOVA_LEN);
                MemorySegment vaddr = i.get(ADDRESS, DMA_INFO_VADDR);
                int prot = i.get(JAVA_INT, DMA_INFO_PROT);
                // libvfio-user mapped the client's fd for [iova, iova+length) at vaddr (it unmaps it after the
                // unregister callback returns); no fd: vaddr is NULL and the region is reachable by messages only.
                // vaddr is given a size only where the library's own mapping holds all of it (a client's offset
                // that is not page-aligned leaves the region's tail past the mapping, libvfio-user issue #730)
                String unreachable = vaddr.equals(MemorySegment.NULL) ? "it has no fd (reachable by messages only)"
                        : unusableRegion(iova, length, vaddr.address(), i.get(JAVA_LONG, DMA_INFO_MAPPING_BASE),
                                i.get(JAVA_LONG, DMA_INFO_MAPPING_LEN));
                MemorySegment memory = unreachable == null ? vaddr.reinterpret(length) : null;
                cb.dmaRegistered(iova, length, memory, prot, unreachable);
            } catch (Throwable t) {
                cb.log(LOG_ERR, "DMA register callback failed: " + t);
            }
        }

        @SuppressWarnings("restricted")
        private void onDmaUnregister(MemorySegment ctx, MemorySegment info) {
            try {
                MemorySegment i = info.reinterpret(DMA_INFO_PROT + 4);
                cb.dmaUnregistered(i.get(JAVA_LONG, DMA_INFO_IOVA_BASE), i.get(JAVA_LONG, DMA_INFO_IOVA_LEN));
            } catch (Throwable t) {
                cb.log(LOG_ERR, "DMA unregister callback failed: " + t);
            }
        }

        private int onReset(MemorySegment ctx, int type) {
            try {
                return cb.reset(type);
            } catch (Throwable t) {
                cb.log(LOG_ERR, "reset callback failed: " + t);
                return -1;
            }
        }
    }

    /**
     * Why a region libvfio-user mapped at {@code vaddr} may not be used as memory, or null when it may: its IOVA,
     * address and size must be {@link #DMA_PAGE}-aligned (libvfio-user maps {@code ROUND_UP(size, page)} bytes from
     * the offset rounded down, so an unaligned offset leaves the region's last bytes past what is mapped, and an
     * unaligned IOVA or address breaks the engines' aligned descriptor accesses), and
     * {@code [vaddr, vaddr+length)} must lie inside the library's mapping {@code [mappingBase, +mappingLength)}
     * (addresses and lengths compared unsigned).
     */
    static String unusableRegion(long iova, long length, long vaddr, long mappingBase, long mappingLength) {
        long m = DMA_PAGE - 1;
        if (((iova | vaddr | length) & m) != 0) {
            String what = (iova & m) != 0 ? "IOVA 0x" + Long.toHexString(iova)
                    : (length & m) != 0 ? "size 0x" + Long.toHexString(length)
                    : "file offset (it lands at address 0x" + Long.toHexString(vaddr) + ")";
            return "its " + what + " is not a multiple of the " + DMA_PAGE + "-byte page (VFIO maps whole pages only)";
        }
        long into = vaddr - mappingBase;
        if (Long.compareUnsigned(vaddr, mappingBase) < 0 || Long.compareUnsigned(into, mappingLength) > 0
                || Long.compareUnsigned(length, mappingLength - into) > 0) {
            return "[0x" + Long.toHexString(vaddr) + " +0x" + Long.toHexString(length) + ") is not inside libvfio-user's"
                    + " mapping [0x" + Long.toHexString(mappingBase) + " +0x" + Long.toHexString(mappingLength) + ")";
        }
        return null;
    }

    public void setupLog(MemorySegment ctx, Stubs stubs, int level) throws NativeException {
        check(ctx, "vfu_setup_log", s -> (int) Bound.SETUP_LOG.invokeExact(s, ctx, stubs.log, level));
    }

    public void pciInit(MemorySegment ctx, int pciType, int headerType) throws NativeException {
        check(ctx, "vfu_pci_init", s -> (int) Bound.PCI_INIT.invokeExact(s, ctx, pciType, headerType, 0));
    }

    public void pciSetId(MemorySegment ctx, int vendor, int device, int subsystemVendor, int subsystem) {
        try {
            Bound.PCI_SET_ID.invokeExact(ctx, (short) vendor, (short) device, (short) subsystemVendor, (short) subsystem);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
    }

    public void pciSetClass(MemorySegment ctx, int base, int sub, int progIf) {
        try {
            Bound.PCI_SET_CLASS.invokeExact(ctx, (byte) base, (byte) sub, (byte) progIf);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
    }

    /** The library's copy of the configuration space (4 KiB for PCIe), valid until the context is destroyed. */
    @SuppressWarnings("restricted")
    public MemorySegment pciConfigSpace(MemorySegment ctx) {
        MemorySegment p;
        try {
            p = (MemorySegment) Bound.PCI_GET_CONFIG_SPACE.invokeExact(ctx);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (p.equals(MemorySegment.NULL)) {
            throw new IllegalStateException("vfu_pci_get_config_space returned NULL (vfu_pci_init not called?)");
        }
        return p.reinterpret(PCI_CFG_SPACE_EXP_SIZE);
    }

    /** vfu_pci_add_capability(ctx, pos, flags, data): copies {@code data} in; returns the offset it was placed at. */
    public long pciAddCapability(MemorySegment ctx, long pos, int flags, MemorySegment data) throws NativeException {
        MemorySegment state = Native.callState();
        long rc;
        try {
            rc = (long) Bound.PCI_ADD_CAPABILITY.invokeExact(state, ctx, pos, flags, data);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        if (rc < 0) {
            throw failed("vfu_pci_add_capability(id 0x" + Integer.toHexString(data.get(JAVA_BYTE, 0) & 0xFF) + ")",
                    Native.errno(state));
        }
        return rc;
    }

    /** Which of {@link Callbacks}' region methods serves a region. */
    public enum RegionCallback { BAR0, CONFIG, BAR2 }

    /** A region served by callback only (no fd to mmap). */
    public void setupRegion(MemorySegment ctx, int index, long size, Stubs stubs, RegionCallback which, int flags)
            throws NativeException {
        setupRegion(ctx, index, size, stubs, which, flags, -1);
    }

    /**
     * A region the client may also map whole by {@code fd} (offset 0; the library hands the fd out with the region's
     * info), its accesses by message served by the callback; {@code fd} -1: by callback only.
     */
    public void setupRegion(MemorySegment ctx, int index, long size, Stubs stubs, RegionCallback which, int flags, int fd)
            throws NativeException {
        MemorySegment cb = switch (which) {
            case BAR0 -> stubs.bar0;
            case CONFIG -> stubs.config;
            case BAR2 -> stubs.bar2;
        };
        check(ctx, "vfu_setup_region(" + index + ", " + size + ")", s -> (int) Bound.SETUP_REGION.invokeExact(s, ctx,
                index, size, cb, flags, MemorySegment.NULL, 0, fd, 0L));
    }

    public void setupIrqs(MemorySegment ctx, int type, int count) throws NativeException {
        check(ctx, "vfu_setup_device_nr_irqs(" + type + ", " + count + ")",
                s -> (int) Bound.SETUP_NR_IRQS.invokeExact(s, ctx, type, count));
    }

    public void setupDma(MemorySegment ctx, Stubs stubs, long maxRegions) throws NativeException {
        check(ctx, "vfu_setup_device_dma", s -> (int) Bound.SETUP_DMA.invokeExact(s, ctx, maxRegions,
                stubs.dmaRegister, stubs.dmaUnregister));
    }

    public void setupReset(MemorySegment ctx, Stubs stubs) throws NativeException {
        check(ctx, "vfu_setup_device_reset_cb", s -> (int) Bound.SETUP_RESET.invokeExact(s, ctx, stubs.reset));
    }

    public void realize(MemorySegment ctx) throws NativeException {
        check(ctx, "vfu_realize_ctx", s -> (int) Bound.REALIZE.invokeExact(s, ctx));
    }

    /** vfu_attach_ctx: 0 when a client attached (its VERSION negotiated), else the errno (EAGAIN: nobody yet). */
    public int attach(MemorySegment ctx) {
        return errnoOf(s -> (int) Bound.ATTACH.invokeExact(s, ctx));
    }

    /** The fd to poll: the listening socket before attach, the client's after. */
    public int pollFd(MemorySegment ctx) {
        try {
            return (int) Bound.GET_POLL_FD.invokeExact(ctx);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
    }

    /** vfu_run_ctx: handles one message (non-blocking context); 0, or the errno (ENOTCONN: the client went away). */
    public int runCtx(MemorySegment ctx) {
        // per message and per interrupt: called directly, no lambda to allocate
        MemorySegment state = Native.callState();
        int rc;
        try {
            rc = (int) Bound.RUN.invokeExact(state, ctx);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        return rc < 0 ? Math.max(1, Native.errno(state)) : 0;
    }

    /** vfu_irq_trigger(ctx, subindex): 0, or the errno (ENOENT: the client gave no eventfd for it). */
    public int irqTrigger(MemorySegment ctx, int subindex) {
        MemorySegment state = Native.callState();
        int rc;
        try {
            rc = (int) Bound.IRQ_TRIGGER.invokeExact(state, ctx, subindex);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        return rc < 0 ? Math.max(1, Native.errno(state)) : 0;
    }

    public void destroy(MemorySegment ctx) {
        try {
            Bound.DESTROY.invokeExact(ctx);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
    }

    @FunctionalInterface
    private interface IntCall {
        int call(MemorySegment state) throws Throwable;
    }

    private static int errnoOf(IntCall c) {
        MemorySegment state = Native.callState();
        int rc;
        try {
            rc = c.call(state);
        } catch (Throwable t) {
            throw Native.unexpected(t);
        }
        return rc < 0 ? Math.max(1, Native.errno(state)) : 0;
    }

    private static void check(MemorySegment ctx, String call, IntCall c) throws NativeException {
        int errno = errnoOf(c);
        if (errno != 0) {
            throw failed(call, errno);
        }
    }

    private static NativeException failed(String call, int errno) {
        return new NativeException(call + " failed: errno " + errno + " (" + Errno.name(errno) + ")", errno);
    }
}
