package io.pmemblk.nvme;

import java.util.Set;

/**
 * What the target serves and how, from the {@code nvme.*} settings.
 * @param bind            address to listen on
 * @param port            TCP port (0: any free one, for tests)
 * @param subsystemNqn    the NVM subsystem's NQN
 * @param allowedHosts    host NQNs allowed to connect; empty: any host
 * @param ioQueues        I/O queues a controller may have (Set Features Number of Queues answers this)
 * @param queueDepth      entries per queue the host may ask for (CAP.MQES + 1)
 * @param inCapsuleBytes  in-capsule data on I/O queues (IOCCSZ = 4 + this / 16); at least 1 KiB, Connect's data
 * @param maxTransferBytes the largest Read/Write (MDTS), a power of two from 4 KiB
 * @param maxH2cData      MAXH2CDATA in ICResp: the largest H2CData PDU the host may send
 * @param headerDigest    whether a host may turn the header digest on
 * @param dataDigest      whether a host may turn the data digest on
 * @param serial          serial number (SN) and the seed of the namespace's NGUID/EUI64/UUID: stable per device
 */
public record NvmeTcpConfig(String bind, int port, String subsystemNqn, Set<String> allowedHosts, int ioQueues,
                            int queueDepth, int inCapsuleBytes, int maxTransferBytes, int maxH2cData,
                            boolean headerDigest, boolean dataDigest, String serial) {
    /** Admin queue in-capsule data the Linux host may send (NVME_TCP_ADMIN_CCSZ, 8 KiB). */
    static final int ADMIN_IN_CAPSULE = 8192;

    public NvmeTcpConfig {
        if (subsystemNqn == null || subsystemNqn.isEmpty() || subsystemNqn.length() > 223
                || subsystemNqn.equals(Nvme.DISCOVERY_NQN)) {
            throw new IllegalArgumentException("subsystem NQN '" + subsystemNqn + "': allowed 1..223 bytes, not the"
                    + " discovery NQN");
        }
        if (ioQueues < 1 || ioQueues > 65535) {
            throw new IllegalArgumentException("I/O queues " + ioQueues + ": allowed 1..65535");
        }
        if (queueDepth < Nvme.ADMIN_QUEUE_DEPTH || queueDepth > 65536) {
            throw new IllegalArgumentException("queue depth " + queueDepth + ": allowed " + Nvme.ADMIN_QUEUE_DEPTH
                    + "..65536 (the Linux host's admin queue is " + Nvme.ADMIN_QUEUE_DEPTH + " deep)");
        }
        if (inCapsuleBytes < 4096 || inCapsuleBytes > 1 << 20 || inCapsuleBytes % 16 != 0) {
            throw new IllegalArgumentException("in-capsule data " + inCapsuleBytes + ": allowed 4096..1048576, a"
                    + " multiple of 16 (Connect carries 1 KiB in the capsule on every queue; DSM up to 4 KiB of ranges)");
        }
        if (maxTransferBytes < 4096 || Integer.bitCount(maxTransferBytes) != 1) {
            throw new IllegalArgumentException("max transfer " + maxTransferBytes + ": allowed a power of two >= 4096");
        }
        if (maxH2cData < Pdu.MIN_MAXH2CDATA) {
            throw new IllegalArgumentException("MAXH2CDATA " + maxH2cData + ": allowed >= " + Pdu.MIN_MAXH2CDATA);
        }
        allowedHosts = Set.copyOf(allowedHosts);
    }

    /** The in-capsule data a queue accepts before Connect says which kind it is: the larger of the two. */
    int inCapsuleBeforeConnect() {
        return Math.max(ADMIN_IN_CAPSULE, inCapsuleBytes);
    }
}
