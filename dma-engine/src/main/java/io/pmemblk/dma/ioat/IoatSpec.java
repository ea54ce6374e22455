package io.pmemblk.dma.ioat;

import static java.lang.foreign.MemoryLayout.PathElement.groupElement;

import java.lang.foreign.MemoryLayout;
import java.lang.foreign.StructLayout;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;

/**
 * Intel I/OAT (Crystal Beach DMA) version 3 register file and copy descriptor, written once.
 * Sources: Linux {@code drivers/dma/ioat/registers.h} and {@code hw.h}; SPDK {@code include/spdk/ioat_spec.h}
 * ({@code struct spdk_ioat_registers}, {@code struct spdk_ioat_dma_hw_desc}); DPDK {@code drivers/dma/ioat/ioat_hw_defs.h}.
 * All registers and descriptor fields are little-endian.
 */
public final class IoatSpec {
    private IoatSpec() {}

    // ---- BAR0 global registers (spdk_ioat_registers; registers.h IOAT_*_OFFSET) ----
    /** u8: number of channels. */
    public static final int CHANCNT = 0x00;
    /** u8: log2 of the maximum bytes one descriptor transfers, in bits 4:0 ({@link #maxTransfer}). */
    public static final int XFERCAP = 0x01;
    /** XFERCAP's valid bits (SPDK lib/ioat/ioat.c: "Only bits [4:0] are valid"). */
    public static final int XFERCAP_MASK = 0x1f;
    /**
     * The largest transfer of one descriptor for an XFERCAP register value: bits 4:0 are the log2, the rest
     * ignored (SPDK masks them; a device may set them); 0 means the largest (SPDK reads it as 4 GiB), here 2^31,
     * the largest power of two the descriptor's 32-bit size field holds.
     */
    public static long maxTransfer(int xfercapRegister) {
        int log2 = xfercapRegister & XFERCAP_MASK;
        return 1L << (log2 == 0 ? 31 : log2);
    }

    /** Descriptors a copy of {@code length} bytes takes, split at {@code maxTransfer} (1 for a length below 1). */
    public static int descriptorsFor(long length, long maxTransfer) {
        if (length <= 0) {
            return 1;
        }
        long n = (length + maxTransfer - 1) / maxTransfer;
        return n > Integer.MAX_VALUE ? Integer.MAX_VALUE : (int) n;
    }
    /** u8 */
    public static final int GENCTRL = 0x02;
    /** u8: INTRCTRL_MASTER_INT_EN 0x01. */
    public static final int INTRCTRL = 0x03;
    /** u32 */
    public static final int ATTNSTATUS = 0x04;
    /** u8: 0x30 = v3.0, 0x33 = v3.3. */
    public static final int CBVER = 0x08;
    /** u16 */
    public static final int INTRDELAY = 0x0C;
    /** u16 */
    public static final int CS_STATUS = 0x0E;
    /** u32 */
    public static final int DMACAPABILITY = 0x10;

    public static final int INTRCTRL_MASTER_INT_EN = 0x01;
    public static final int VER_3_0 = 0x30;
    public static final int VER_3_3 = 0x33;

    // DMACAPABILITY bits (SPDK_IOAT_DMACAP_*)
    public static final int DMACAP_PB = 1;
    public static final int DMACAP_DCA = 1 << 4;
    public static final int DMACAP_BFILL = 1 << 6;
    public static final int DMACAP_XOR = 1 << 8;
    public static final int DMACAP_PQ = 1 << 9;
    public static final int DMACAP_DMA_DIF = 1 << 10;

    // ---- Per-channel registers, at channelBase(n) + offset ----
    /** Size of one channel's register block; channel n starts at 0x80 * (n + 1). */
    public static final int CHANNEL_MMIO_SIZE = 0x80;

    /** u16 */
    public static final int CHANCTRL = 0x00;
    /** u16 */
    public static final int DMA_COMP = 0x02;
    /** u8 */
    public static final int CHANCMD = 0x04;
    /** u16: running descriptor count; a write is the doorbell. */
    public static final int DMACOUNT = 0x06;
    /** u64: completed descriptor address | state. */
    public static final int CHANSTS = 0x08;
    /** u64: IOVA of the first descriptor. */
    public static final int CHAINADDR = 0x10;
    /** u64: IOVA of the 8-byte completion writeback word. */
    public static final int CHANCMP = 0x18;
    /** u32: write 1 to clear. */
    public static final int CHANERR = 0x28;
    /** u32 */
    public static final int CHANERR_MASK = 0x2C;

    public static long channelBase(int channel) {
        return (long) CHANNEL_MMIO_SIZE * (channel + 1);
    }

    // CHANCTRL bits (registers.h IOAT_CHANCTRL_*)
    public static final int CHANCTRL_INT_REARM = 0x0001;
    public static final int CHANCTRL_ERR_COMPLETION_EN = 0x0004;
    public static final int CHANCTRL_ANY_ERR_ABORT_EN = 0x0008;
    public static final int CHANCTRL_ERR_INT_EN = 0x0010;
    public static final int CHANCTRL_DESC_ADDR_SNOOP = 0x0020;
    public static final int CHANCTRL_CHANNEL_IN_USE = 0x0100;
    public static final int CHANCTRL_COMPL_DCA_EN = 0x0200;
    /** What Linux writes to run a channel (IOAT_CHANCTRL_RUN). */
    public static final int CHANCTRL_RUN = CHANCTRL_INT_REARM | CHANCTRL_ERR_INT_EN
            | CHANCTRL_ERR_COMPLETION_EN | CHANCTRL_ANY_ERR_ABORT_EN;

    // CHANCMD bits (registers.h IOAT_CHANCMD_*)
    public static final int CHANCMD_START = 0x01;
    public static final int CHANCMD_APPEND = 0x02;
    public static final int CHANCMD_SUSPEND = 0x04;
    public static final int CHANCMD_ABORT = 0x08;
    public static final int CHANCMD_RESUME = 0x10;
    public static final int CHANCMD_RESET = 0x20;

    // CHANSTS (registers.h IOAT_CHANSTS_*; SPDK_IOAT_CHANSTS_*)
    public static final long CHANSTS_STATUS_MASK = 0x7L;
    public static final int CHANSTS_ACTIVE = 0x0;
    public static final int CHANSTS_IDLE = 0x1;
    public static final int CHANSTS_SUSPENDED = 0x2;
    public static final int CHANSTS_HALTED = 0x3;
    public static final int CHANSTS_ARMED = 0x4;
    public static final long CHANSTS_UNAFFILIATED_ERROR = 0x8L;
    public static final long CHANSTS_SOFT_ERROR = 0x10L;
    public static final long CHANSTS_COMPLETED_DESCRIPTOR_MASK = ~0x3FL;

    // CHANERR bits, write-1-to-clear (registers.h IOAT_CHANERR_*)
    public static final int CHANERR_SRC_ADDR = 0x0001;
    public static final int CHANERR_DEST_ADDR = 0x0002;
    public static final int CHANERR_NEXT_ADDR = 0x0004;
    public static final int CHANERR_NEXT_DESC_ALIGN = 0x0008;
    public static final int CHANERR_CHAIN_ADDR_VALUE = 0x0010;
    public static final int CHANERR_CHANCMD = 0x0020;
    public static final int CHANERR_CHIPSET_UNCORRECTABLE_DATA_INTEGRITY = 0x0040;
    public static final int CHANERR_DMA_UNCORRECTABLE_DATA_INTEGRITY = 0x0080;
    public static final int CHANERR_READ_DATA = 0x0100;
    public static final int CHANERR_WRITE_DATA = 0x0200;
    public static final int CHANERR_CONTROL = 0x0400;
    public static final int CHANERR_LENGTH = 0x0800;
    public static final int CHANERR_COMPLETION_ADDR = 0x1000;
    public static final int CHANERR_INT_CONFIGURATION = 0x2000;
    public static final int CHANERR_SOFT = 0x4000;
    public static final int CHANERR_UNAFFILIATED = 0x8000;
    /** XOR_VAL or PQ_VAL: the P (xor) result was not zero / not the P given. */
    public static final int CHANERR_XOR_P_OR_CRC = 0x10000;
    /** PQ_VAL: the Q result was not the Q given. */
    public static final int CHANERR_XOR_Q = 0x20000;
    /** A descriptor needing an extension descriptor that DMACOUNT has not made available. */
    public static final int CHANERR_DESCRIPTOR_COUNT = 0x40000;

    // ---- Copy descriptor (spdk_ioat_dma_hw_desc; hw.h struct ioat_dma_descriptor), 64 bytes ----
    private static final ValueLayout.OfInt U32 = ValueLayout.JAVA_INT.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final ValueLayout.OfLong U64 = ValueLayout.JAVA_LONG.withOrder(ByteOrder.LITTLE_ENDIAN);

    public static final StructLayout DESCRIPTOR = MemoryLayout.structLayout(
            U32.withName("size"),
            U32.withName("control"),
            U64.withName("src_addr"),
            U64.withName("dest_addr"),
            U64.withName("next"),
            U64.withName("reserved"),
            U64.withName("reserved2"),
            U64.withName("user1"),
            U64.withName("user2")).withByteAlignment(64).withName("ioat_dma_hw_desc");

    public static final long DESC_BYTES = DESCRIPTOR.byteSize();
    public static final long DESC_SIZE = DESCRIPTOR.byteOffset(groupElement("size"));
    public static final long DESC_CONTROL = DESCRIPTOR.byteOffset(groupElement("control"));
    public static final long DESC_SRC = DESCRIPTOR.byteOffset(groupElement("src_addr"));
    public static final long DESC_DST = DESCRIPTOR.byteOffset(groupElement("dest_addr"));
    public static final long DESC_NEXT = DESCRIPTOR.byteOffset(groupElement("next"));
    public static final long DESC_USER1 = DESCRIPTOR.byteOffset(groupElement("user1"));
    public static final long DESC_USER2 = DESCRIPTOR.byteOffset(groupElement("user2"));

    /** Little-endian field layouts to read and write descriptors and the completion word with. */
    public static final ValueLayout.OfInt FIELD_U32 = U32;
    public static final ValueLayout.OfLong FIELD_U64 = U64;

    // Descriptor control bits (bitfield order of spdk_ioat_dma_hw_desc.u.control)
    public static final int CTRL_INT_ENABLE = 1;
    public static final int CTRL_SRC_SNOOP_DISABLE = 1 << 1;
    public static final int CTRL_DEST_SNOOP_DISABLE = 1 << 2;
    public static final int CTRL_COMPLETION_UPDATE = 1 << 3;
    public static final int CTRL_FENCE = 1 << 4;
    /** The copy format's null bit (hw.h ioat_dma_descriptor); in XOR and PQ descriptors bits 7:5 are the source count. */
    public static final int CTRL_NULL = 1 << 5;
    public static final int CTRL_SRC_PAGE_BREAK = 1 << 6;
    public static final int CTRL_DEST_PAGE_BREAK = 1 << 7;
    public static final int CTRL_BUNDLE = 1 << 8;
    public static final int CTRL_DEST_DCA = 1 << 9;
    public static final int CTRL_HINT = 1 << 10;
    public static final int CTRL_OP_SHIFT = 24;
    public static final int CTRL_OP_MASK = 0xFF << CTRL_OP_SHIFT;
    public static final int OP_COPY = 0x00;
    public static final int OP_FILL = 0x01;

    // ---- RAID descriptors (hw.h struct ioat_xor_descriptor, ioat_xor_ext_descriptor, ioat_pq_descriptor,
    // ioat_pq_ext_descriptor; prep.c xor_idx_to_field / pq_idx_to_field): 64 bytes each, an operation of more
    // sources than the base holds takes the next ring descriptor as its extension (linked by the base's next)
    public static final int OP_XOR = 0x87;
    public static final int OP_XOR_VAL = 0x88;
    public static final int OP_PQ = 0x89;
    public static final int OP_PQ_VAL = 0x8a;
    /** src_cnt: sources - 2, in control bits 7:5. */
    public static final int CTRL_SRC_CNT_SHIFT = 5;
    public static final int CTRL_SRC_CNT_MASK = 0x7 << CTRL_SRC_CNT_SHIFT;
    /** PQ: do not write (validate) P / Q. */
    public static final int CTRL_P_DISABLE = 1 << 11;
    public static final int CTRL_Q_DISABLE = 1 << 12;
    /** Most sources of an XOR or PQ operation without super-extended descriptors (dma->max_xor, dma_set_maxpq 8). */
    public static final int RAID_MAX_SOURCES = 8;
    /** XOR: where source i lies: in the base descriptor for i < 5, else in the extension. */
    public static final long[] XOR_SRC_OFFSETS = {0x08, 0x20, 0x28, 0x30, 0x38, 0x00, 0x08, 0x10};
    public static final int XOR_BASE_SOURCES = 5;
    /** PQ: where source i lies: in the base descriptor for i < 3, else in the extension. */
    public static final long[] PQ_SRC_OFFSETS = {0x08, 0x20, 0x28, 0x00, 0x08, 0x10, 0x20, 0x28};
    public static final int PQ_BASE_SOURCES = 3;
    /** PQ: P's address (where COPY has its destination), the 8 coefficient bytes, Q's address. */
    public static final long PQ_P = 0x10;
    public static final long PQ_COEF = 0x30;
    public static final long PQ_Q = 0x38;

    /** A null descriptor moves nothing but still completes; drivers use one to start a channel. */
    public static final int NULL_DESC_SIZE = 8;

    /** The 8-byte completion writeback word must be 8-byte aligned (SPDK_IOAT_CHANCMP_ALIGN). */
    public static final int CHANCMP_ALIGN = 8;
}
