package io.pmemblk.nvme;

import java.nio.ByteBuffer;
import java.util.zip.CRC32C;

/** Builds the PDUs a controller sends (NVMe/TCP 1.0 3.6.2) into caller buffers: the header digest included. */
final class Wire {
    private Wire() {}

    /** Common header at {@code b}'s start; the buffer is left positioned 0, limit after the header (and digest). */
    static void header(ByteBuffer b, int type, int flags, int hlen, int pdo, int plen, boolean hdgst, CRC32C crc) {
        b.clear();
        b.put(Pdu.CH_TYPE, (byte) type).put(Pdu.CH_FLAGS, (byte) (flags | (hdgst ? Pdu.F_HDGST : 0)))
                .put(Pdu.CH_HLEN, (byte) hlen).put(Pdu.CH_PDO, (byte) pdo).putInt(Pdu.CH_PLEN, plen);
    }

    /** Seals a header of {@code hlen} bytes: appends its CRC32C when the header digest is on; limits the buffer. */
    static void seal(ByteBuffer b, int hlen, boolean hdgst, CRC32C crc) {
        int end = hlen;
        if (hdgst) {
            crc.reset();
            crc.update(b.limit(hlen).position(0)); // the buffer itself, not a slice: nothing allocated per PDU
            b.limit(b.capacity());
            b.putInt(hlen, (int) crc.getValue());
            end += Pdu.DIGEST;
        }
        b.position(0).limit(end);
    }

    /** CapsuleResp (struct nvme_tcp_rsp_pdu) with a CQE. */
    static void capsuleResp(ByteBuffer b, long result, int sqhd, int sqid, int cid, short status, boolean hdgst,
                            CRC32C crc) {
        int hd = hdgst ? Pdu.DIGEST : 0;
        header(b, Pdu.RSP, 0, Pdu.RSP_HLEN, 0, Pdu.RSP_HLEN + hd, hdgst, crc);
        int c = Pdu.CH_SIZE;
        b.putLong(c + Nvme.CQE_RESULT, result).putShort(c + Nvme.CQE_SQHD, (short) sqhd)
                .putShort(c + Nvme.CQE_SQID, (short) sqid).putShort(c + Nvme.CQE_CID, (short) cid)
                .putShort(c + Nvme.CQE_STATUS, status);
        seal(b, Pdu.RSP_HLEN, hdgst, crc);
    }

    /** C2HData header for {@code length} bytes; {@code pad}: HPDA's alignment bytes between header and data. */
    static void c2hData(ByteBuffer b, int cid, int length, boolean last, boolean success, boolean hdgst, boolean ddgst,
                        int pdo, CRC32C crc) {
        int flags = (last ? Pdu.F_DATA_LAST : 0) | (success ? Pdu.F_DATA_SUCCESS : 0) | (ddgst ? Pdu.F_DDGST : 0);
        header(b, Pdu.C2H_DATA, flags, Pdu.DATA_HLEN, pdo, pdo + length + (ddgst ? Pdu.DIGEST : 0), hdgst, crc);
        b.putShort(Pdu.D_CCCID, (short) cid).putShort(Pdu.D_TTAG, (short) 0).putInt(Pdu.D_OFFSET, 0)
                .putInt(Pdu.D_LENGTH, length).putInt(20, 0);
        seal(b, Pdu.DATA_HLEN, hdgst, crc);
        // padding up to PDO (HPDA), zeros: the buffer is reused, so they are written each time
        int end = b.limit();
        b.limit(pdo);
        for (int i = end; i < pdo; i++) {
            b.put(i, (byte) 0);
        }
    }

    /** R2T (struct nvme_tcp_r2t_pdu). */
    static void r2t(ByteBuffer b, int cid, int ttag, int offset, int length, boolean hdgst, CRC32C crc) {
        header(b, Pdu.R2T, 0, Pdu.R2T_HLEN, 0, Pdu.R2T_HLEN + (hdgst ? Pdu.DIGEST : 0), hdgst, crc);
        b.putShort(Pdu.D_CCCID, (short) cid).putShort(Pdu.D_TTAG, (short) ttag).putInt(Pdu.D_OFFSET, offset)
                .putInt(Pdu.D_LENGTH, length).putInt(20, 0);
        seal(b, Pdu.R2T_HLEN, hdgst, crc);
    }
}
