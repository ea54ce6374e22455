package io.pmemblk.ublk;

import java.lang.foreign.MemorySegment;

import static io.pmemblk.ublk.UblkAbi.*;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static java.lang.foreign.ValueLayout.JAVA_SHORT;

/**
 * {@code struct ublksrv_ctrl_dev_info} as the kernel answered it (ADD_DEV, GET_DEV_INFO).
 *
 * @param serverFlags {@code ublksrv_flags}, the server's own field: pmemblk keeps its {@link BackingFile#identity()} there
 */
public record DeviceInfo(int id, int queues, int depth, int state, int maxIoBytes, int serverPid, long flags,
        long serverFlags) {
    static DeviceInfo read(MemorySegment info) {
        return new DeviceInfo(info.get(JAVA_INT, DEV_INFO_DEV_ID),
                Short.toUnsignedInt(info.get(JAVA_SHORT, DEV_INFO_NR_HW_QUEUES)),
                Short.toUnsignedInt(info.get(JAVA_SHORT, DEV_INFO_QUEUE_DEPTH)),
                Short.toUnsignedInt(info.get(JAVA_SHORT, DEV_INFO_STATE)),
                info.get(JAVA_INT, DEV_INFO_MAX_IO_BUF_BYTES),
                info.get(JAVA_INT, DEV_INFO_SRV_PID),
                info.get(JAVA_LONG, DEV_INFO_FLAGS),
                info.get(JAVA_LONG, DEV_INFO_SRV_FLAGS));
    }

    public boolean recoverable() {
        return (flags & UBLK_F_USER_RECOVERY) != 0;
    }

    public String stateName() {
        return switch (state) {
            case UBLK_S_DEV_DEAD -> "dead";
            case UBLK_S_DEV_LIVE -> "live";
            case UBLK_S_DEV_QUIESCED -> "quiesced";
            default -> "state " + state;
        };
    }
}
