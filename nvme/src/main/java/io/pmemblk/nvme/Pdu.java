package io.pmemblk.nvme;

/**
 * The NVMe/TCP PDU layouts, written once. Source: NVMe/TCP Transport Specification 1.0 section 3.6 (PDU formats)
 * and 3.6.2.x (per-type fields), as Linux spells them in include/linux/nvme-tcp.h. All multi-byte fields are
 * little-endian; offsets are from the start of the PDU (its common header).
 */
public final class Pdu {
    private Pdu() {}

    /** Common header (struct nvme_tcp_hdr): type, flags, hlen, pdo, plen. */
    public static final int CH_TYPE = 0, CH_FLAGS = 1, CH_HLEN = 2, CH_PDO = 3, CH_PLEN = 4;
    public static final int CH_SIZE = 8;

    /** PDU types (enum nvme_tcp_pdu_type). */
    public static final int ICREQ = 0x0, ICRESP = 0x1, H2C_TERM = 0x2, C2H_TERM = 0x3, CMD = 0x4, RSP = 0x5,
            H2C_DATA = 0x6, C2H_DATA = 0x7, R2T = 0x9;

    /** Flags (enum nvme_tcp_pdu_flags). */
    public static final int F_HDGST = 1, F_DDGST = 1 << 1, F_DATA_LAST = 1 << 2, F_DATA_SUCCESS = 1 << 3;

    /** Header lengths per type (sizeof the structs, without digests). */
    public static final int IC_HLEN = 128, TERM_HLEN = 24, CMD_HLEN = CH_SIZE + Nvme.SQE_SIZE, RSP_HLEN = CH_SIZE + Nvme.CQE_SIZE,
            R2T_HLEN = 24, DATA_HLEN = 24;
    public static final int DIGEST = 4;
    /** The largest header any PDU from a host has, with its digest: what the receive buffer must hold whole. */
    public static final int MAX_HOST_HEADER = IC_HLEN + DIGEST;

    /** ICReq / ICResp (struct nvme_tcp_icreq_pdu / icresp_pdu). */
    public static final int IC_PFV = 8, IC_HPDA_CPDA = 10, IC_DIGEST = 11, IC_MAXR2T_MAXDATA = 12;
    public static final int PFV_1_0 = 0;
    public static final int DIGEST_HDR = 1, DIGEST_DATA = 1 << 1;
    /** HPDA is 0's based dwords, at most 31 (spec 3.6.2.2). */
    public static final int MAX_HPDA = 31;
    /** MAXH2CDATA must be at least 4 KiB (spec 3.6.2.3). */
    public static final int MIN_MAXH2CDATA = 4096;

    /** H2CTermReq / C2HTermReq (struct nvme_tcp_term_pdu). */
    public static final int TERM_FES = 8, TERM_FEI = 10;
    /** A TermReq carries at most this many bytes of the offending PDU's header (spec 3.6.2.9: PLEN <= 152). */
    public static final int TERM_MAX_DATA = 128;

    /** R2T / H2CData / C2HData (struct nvme_tcp_r2t_pdu / data_pdu). */
    public static final int D_CCCID = 8, D_TTAG = 10, D_OFFSET = 12, D_LENGTH = 16;

    /** Fatal error status (enum nvme_tcp_fatal_error_status). */
    public static final int FES_INVALID_HEADER = 0x01, FES_SEQUENCE = 0x02, FES_HDR_DIGEST = 0x03,
            FES_OUT_OF_RANGE = 0x04, FES_LIMIT_EXCEEDED = 0x05, FES_UNSUPPORTED = 0x06;

    public static String typeName(int type) {
        return switch (type) {
            case ICREQ -> "ICReq";
            case ICRESP -> "ICResp";
            case H2C_TERM -> "H2CTermReq";
            case C2H_TERM -> "C2HTermReq";
            case CMD -> "CapsuleCmd";
            case RSP -> "CapsuleResp";
            case H2C_DATA -> "H2CData";
            case C2H_DATA -> "C2HData";
            case R2T -> "R2T";
            default -> "type 0x" + Integer.toHexString(type);
        };
    }
}
