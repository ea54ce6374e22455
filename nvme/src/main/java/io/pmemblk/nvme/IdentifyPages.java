package io.pmemblk.nvme;

import java.net.Inet6Address;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;

/**
 * The data pages admin commands return (Identify, log pages), each built into the controller's one page buffer
 * (admin commands run one at a time on the admin queue's reader): cleared, filled, its limit the page's size. One
 * per server: the text the pages carry (serial, model, firmware, NQNs, the listener's address) is encoded once
 * here, so that building a page allocates nothing.
 */
final class IdentifyPages {
    static final String MODEL = "pmemblk";
    static final String FIRMWARE = "0.1.0";
    /** KAS: keep-alive granularity in 100 ms units (nvmet says 10: one second). */
    static final int KAS = 10;
    /** AERL: 0's based: four Asynchronous Event Requests may be outstanding (nvmet's NVMET_ASYNC_EVENTS). */
    static final int AERL = 3;
    /** Command set identifier 0: the NVM command set. */
    private static final byte[] CSI_NVM = {0};
    private static final byte[] MODEL_ASCII = ascii(MODEL), FIRMWARE_ASCII = ascii(FIRMWARE);
    private static final byte[] DISCOVERY_NQN = Nqn.encode(Nvme.DISCOVERY_NQN);

    /** The largest page: Identify's 4 KiB (the discovery log's two entries take 3 KiB). */
    static final int PAGE_SIZE = Nvme.IDENTIFY_SIZE;

    private final NvmeTcpConfig cfg;
    private final Namespace ns;
    private final byte[] serial, subsystemNqn, traddr, trsvcid;
    private final boolean ipv6;

    /** @param listening the address the listener is bound to: the discovery log's entries name it */
    IdentifyPages(NvmeTcpConfig cfg, Namespace ns, InetSocketAddress listening) {
        this.cfg = cfg;
        this.ns = ns;
        this.serial = ascii(cfg.serial());
        this.subsystemNqn = Nqn.encode(cfg.subsystemNqn());
        this.traddr = ascii(listening.getAddress().getHostAddress());
        this.trsvcid = ascii(Integer.toString(listening.getPort()));
        this.ipv6 = listening.getAddress() instanceof Inet6Address;
    }

    static ByteBuffer newPage() {
        return ByteBuffer.allocate(PAGE_SIZE).order(ByteOrder.LITTLE_ENDIAN);
    }

    /** {@code b} zeroed up to {@code size}, limit {@code size}, position 0. */
    static ByteBuffer page(ByteBuffer b, int size) {
        b.clear();
        java.util.Arrays.fill(b.array(), b.arrayOffset(), b.arrayOffset() + b.capacity(), (byte) 0);
        return b.limit(size);
    }

    private static byte[] ascii(String s) {
        return s.getBytes(StandardCharsets.US_ASCII);
    }

    /**
     * {@code v} in a field of {@code width} bytes, space padded as SN/MN/FR are (NVMe base 1.3 5.15 figure 109);
     * NQNs are NUL padded instead.
     */
    static void put(ByteBuffer b, int at, int width, byte[] v, boolean spacePad) {
        for (int i = 0; i < width; i++) {
            b.put(at + i, i < v.length ? v[i] : (byte) (spacePad ? ' ' : 0));
        }
    }

    ByteBuffer controller(ByteBuffer b, int cntlid, boolean discovery) {
        page(b, Nvme.IDENTIFY_SIZE);
        put(b, Nvme.IC_SN, 20, serial, true);
        put(b, Nvme.IC_MN, 40, MODEL_ASCII, true);
        put(b, Nvme.IC_FR, 8, FIRMWARE_ASCII, true);
        b.put(Nvme.IC_RAB, (byte) 6);
        b.putShort(Nvme.IC_CNTLID, (short) cntlid);
        b.putInt(Nvme.IC_VER, Nvme.VERSION_1_3);
        b.put(Nvme.IC_CNTRLTYPE, (byte) (discovery ? Nvme.CNTRLTYPE_DISCOVERY : Nvme.CNTRLTYPE_IO));
        b.put(Nvme.IC_ACL, (byte) 3);
        b.put(Nvme.IC_AERL, (byte) AERL);
        b.put(Nvme.IC_FRMW, (byte) (1 << 1 | 1)); // one slot (bits 3:1 = 1), slot 1 read-only
        b.put(Nvme.IC_LPA, (byte) Nvme.LPA_EXTENDED);
        b.putShort(Nvme.IC_KAS, (short) KAS);
        b.putInt(Nvme.IC_SGLS, Nvme.SGLS_SUPPORTED | Nvme.SGLS_OFFSET);
        put(b, Nvme.IC_SUBNQN, Nvme.NQN_FIELD, discovery ? DISCOVERY_NQN : subsystemNqn, false);
        b.putInt(Nvme.IC_IORCSZ, Nvme.CQE_SIZE / 16);
        if (discovery) {
            b.putShort(Nvme.IC_MAXCMD, (short) Nvme.ADMIN_QUEUE_DEPTH);
            b.putInt(Nvme.IC_IOCCSZ, Nvme.SQE_SIZE / 16);
            return b;
        }
        b.put(Nvme.IC_CMIC, (byte) Nvme.CMIC_MULTI_CTRL);
        // MDTS in units of the minimum page (CAP.MPSMIN = 4 KiB), as a power of two
        b.put(Nvme.IC_MDTS, (byte) Integer.numberOfTrailingZeros(cfg.maxTransferBytes() / 4096));
        b.put(Nvme.IC_SQES, (byte) 0x66); // 64-byte SQEs, required and maximum
        b.put(Nvme.IC_CQES, (byte) 0x44); // 16-byte CQEs
        b.putShort(Nvme.IC_MAXCMD, (short) cfg.queueDepth());
        b.putInt(Nvme.IC_NN, 1);
        b.putShort(Nvme.IC_ONCS, (short) (Nvme.ONCS_DSM | Nvme.ONCS_WRITE_ZEROES));
        b.put(Nvme.IC_VWC, (byte) (ns.volatileCache() ? 1 : 0));
        b.putInt(Nvme.IC_IOCCSZ, (Nvme.SQE_SIZE + cfg.inCapsuleBytes()) / 16);
        b.putShort(Nvme.IC_ICDOFF, (short) 0);
        b.put(Nvme.IC_MSDBD, (byte) 1);
        return b;
    }

    ByteBuffer namespace(ByteBuffer b) {
        page(b, Nvme.IDENTIFY_SIZE);
        b.putLong(Nvme.IN_NSZE, ns.blocks()).putLong(Nvme.IN_NCAP, ns.blocks()).putLong(Nvme.IN_NUSE, ns.blocks());
        b.put(Nvme.IN_NLBAF, (byte) 0).put(Nvme.IN_FLBAS, (byte) 0);
        b.put(Nvme.IN_NMIC, (byte) 1); // may be shared by several controllers (CMIC bit 1)
        b.put(Nvme.IN_NGUID, ns.nguid()).put(Nvme.IN_EUI64, ns.eui64());
        b.putInt(Nvme.IN_LBAF0, ns.lbaShift() << 16); // MS 0, LBADS, RP 0
        return b;
    }

    static ByteBuffer activeNamespaces(ByteBuffer b, int startAfter) {
        page(b, Nvme.IDENTIFY_SIZE);
        if (startAfter == 0) { // the list holds the namespaces above an unsigned NSID: only 0 is below 1
            b.putInt(0, 1);
        }
        return b;
    }

    ByteBuffer descriptors(ByteBuffer b) {
        page(b, Nvme.IDENTIFY_SIZE);
        int at = 0;
        at = descriptor(b, at, Nvme.NIDT_EUI64, ns.eui64());
        at = descriptor(b, at, Nvme.NIDT_NGUID, ns.nguid());
        at = descriptor(b, at, Nvme.NIDT_UUID, ns.uuid());
        descriptor(b, at, Nvme.NIDT_CSI, CSI_NVM);
        return b;
    }

    private static int descriptor(ByteBuffer b, int at, int type, byte[] id) {
        b.put(at, (byte) type).put(at + 1, (byte) id.length).put(at + 4, id);
        return at + 4 + id.length;
    }

    /** Firmware Slot Information (log 03h): slot 1 active, holding {@link #FIRMWARE}. */
    static ByteBuffer firmwareSlots(ByteBuffer b) {
        page(b, 512);
        b.put(0, (byte) 1);
        put(b, 8, 8, FIRMWARE_ASCII, true);
        return b;
    }

    /**
     * Discovery log page (NVMe-oF 1.1 5.3), on the listener's address: this subsystem, when the asking host may
     * connect to it, and the discovery subsystem. A host the subsystem refuses is not told its NQN, as Linux's
     * nvmet leaves out every subsystem the host is not allowed (and `nvme connect-all` would only fail on it).
     */
    ByteBuffer discoveryLog(ByteBuffer b, boolean hostAllowed) {
        int records = hostAllowed ? 2 : 1;
        page(b, Nvme.DISC_HEADER + records * Nvme.DISC_ENTRY);
        b.putLong(Nvme.DISC_GENCTR, 1).putLong(Nvme.DISC_NUMREC, records).putShort(Nvme.DISC_RECFMT, (short) 0);
        int at = Nvme.DISC_HEADER;
        if (hostAllowed) {
            entry(b, at, Nvme.SUBTYPE_NVME, subsystemNqn);
            at += Nvme.DISC_ENTRY;
        }
        entry(b, at, Nvme.SUBTYPE_DISCOVERY, DISCOVERY_NQN);
        return b;
    }

    private void entry(ByteBuffer b, int at, int subtype, byte[] nqn) {
        b.put(at + Nvme.DE_TRTYPE, (byte) Nvme.TRTYPE_TCP);
        b.put(at + Nvme.DE_ADRFAM, (byte) (ipv6 ? Nvme.ADRFAM_IPV6 : Nvme.ADRFAM_IPV4));
        b.put(at + Nvme.DE_SUBTYPE, (byte) subtype);
        b.put(at + Nvme.DE_TREQ, (byte) Nvme.TREQ_NOT_REQUIRED_SQFLOW);
        b.putShort(at + Nvme.DE_PORTID, (short) 1);
        b.putShort(at + Nvme.DE_CNTLID, (short) Nvme.DYNAMIC_CNTLID);
        b.putShort(at + Nvme.DE_ASQSZ, (short) Nvme.ADMIN_QUEUE_DEPTH);
        put(b, at + Nvme.DE_TRSVCID, 32, trsvcid, true);
        put(b, at + Nvme.DE_TRADDR, 256, traddr, true);
        put(b, at + Nvme.DE_SUBNQN, 256, nqn, false);
        // TSAS for TCP: SECTYPE 0 (no security), zeros
    }
}
