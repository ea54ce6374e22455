package io.pmemblk.pmem;

import java.lang.foreign.MemorySegment;

/**
 * A copy between the mapping and a request's own memory faulted on the request's side: the frontend's buffer
 * was taken away under the request (a vhost-user front end truncated its guest RAM), while the mapping still
 * loads. The request answers EIO; unlike a {@link MappingFault} nothing is wrong with the pmem file, and the log
 * says so. Thrown synchronously by {@link PmemRegion}'s copies, never later.
 */
public final class CallerMemoryFault extends RuntimeException {
    CallerMemoryFault(String what, long offset, long length, MemorySegment caller, Throwable cause) {
        super(what + " of " + length + " bytes at offset " + offset + " of the device failed: the request's own memory"
                + " (" + caller.byteSize() + " bytes at address 0x" + Long.toHexString(caller.address()) + ", the"
                + " frontend's buffer: guest RAM on vhost-user) faulted, not the pmem mapping", cause, false, false);
    }
}
