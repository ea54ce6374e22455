package io.pmemblk.posix;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.Map;
import java.util.TreeMap;

/**
 * The mappings this process made of file descriptors, by address: for a DMA engine in another process (a
 * vfio-user device), which can reach our memory only through a descriptor it maps itself (VFIO_USER_DMA_MAP
 * carries an fd and a file offset, {@code docs/interop/vfio-user.rst} "VFIO_USER_DMA_MAP").
 *
 * <p>Why a registry rather than {@code map(segment, fd, offset)} at every call site: the memory an engine must
 * reach is mapped in three modules (the pmem file in pmem-blk, guest RAM in vhost, DMA buffers here), and it is
 * handed to the engine through interfaces that carry a {@link MemorySegment} only ({@code BlockDriver.registerMemory},
 * {@code IovaSpace.map}). Whoever maps records the descriptor once, here, next to the mmap; whoever needs it looks
 * the address up. A segment that is a slice of a mapping finds it too (guest RAM regions are sliced at their
 * page skew).
 *
 * <p>Each entry holds a descriptor of its own, opened anew on {@code /proc/self/fd/N} (a new open file description
 * of the same file): what another process receives from {@link #backing} then shares no file lock and no file
 * status flags with the descriptor the mapper keeps (the pmem file's OFD lock stays the server's alone, and a
 * device process still holding our fd after we exit cannot keep the next server out). Where reopening is refused
 * (a file we may map but not open by name), a dup. The entry and its descriptor go when the mapping's arena
 * closes. Control path only: a lookup locks and opens a descriptor.
 */
public final class MappedFiles {
    private MappedFiles() {}

    /** A mapping: {@code length} bytes at {@code address} show {@code fd} from {@code offset}. */
    private record Entry(long address, long length, int fd, long offset) {}

    /** What backs a range: a descriptor the caller owns (close it) and the file offset of the range's first byte. */
    public record Backing(int fd, long offset) {}

    private static final TreeMap<Long, Entry> BY_ADDRESS = new TreeMap<>();

    /**
     * Records that {@code mapping} shows {@code fd} from {@code offset}, until {@code owner} closes. The caller
     * keeps {@code fd}; the registry keeps a descriptor of its own.
     */
    public static void register(MemorySegment mapping, int fd, long offset, Arena owner) throws NativeException {
        int own = reopen(fd);
        Entry e = new Entry(mapping.address(), mapping.byteSize(), own, offset);
        try {
            // A zero-length segment in the owner's scope: its cleanup runs when the arena closes (before or after
            // the munmap, either is fine: it only forgets the address and closes our descriptor).
            Native.owned(MemorySegment.ofAddress(mapping.address()), 0, owner, unused -> forget(e));
        } catch (RuntimeException ex) {
            Libc.close(own);
            throw ex;
        }
        synchronized (BY_ADDRESS) {
            Entry old = BY_ADDRESS.put(e.address(), e);
            if (old != null) { // the address was unmapped without its arena closing first: that entry is stale
                Libc.closeQuietly(old.fd());
            }
        }
    }

    /**
     * The file behind {@code [address, address + length)}, which must lie in one registered mapping (its last page
     * counted whole: mmap maps pages), or null when no registered mapping covers it (anonymous memory, a heap
     * copy, a mapping made elsewhere).
     */
    public static Backing backing(long address, long length) throws NativeException {
        synchronized (BY_ADDRESS) {
            Map.Entry<Long, Entry> floor = BY_ADDRESS.floorEntry(address);
            if (floor == null) {
                return null;
            }
            Entry e = floor.getValue();
            long page = Libc.pageSize();
            long end = e.address() + ((e.length() + page - 1) & -page);
            if (address + length > end || address + length < address) {
                return null;
            }
            return new Backing(Libc.dupCloexec(e.fd()), e.offset() + (address - e.address()));
        }
    }

    /** Mappings recorded now (tests). */
    public static int size() {
        synchronized (BY_ADDRESS) {
            return BY_ADDRESS.size();
        }
    }

    private static void forget(Entry e) {
        synchronized (BY_ADDRESS) {
            BY_ADDRESS.remove(e.address(), e);
        }
        Libc.closeQuietly(e.fd());
    }

    private static int reopen(int fd) throws NativeException {
        try {
            return FileCalls.open("/proc/self/fd/" + fd, FileCalls.O_RDWR, 0);
        } catch (NativeException e) {
            return Libc.dupCloexec(fd);
        }
    }
}
