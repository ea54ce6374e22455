package io.pmemblk.nvme;

import io.pmemblk.queueing.Request;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.zip.CRC32C;

/**
 * One tag's command state on an I/O queue (the NVMe command a block request serves) and the headers of its
 * answer, allocated once per tag: the hot path fills them in place.
 */
final class IoSlot {
    final int tag;
    Request request;
    int cid;
    int opcode;
    /** WRITE waiting for H2CData: bytes asked by the R2T and received so far. */
    boolean awaitingData;
    int length;
    int received;
    /** An NVMe status that overrides the request's errno (a data digest error: Transient Transport Error). */
    short override;
    /** DSM: the slot answering the command, and (on it) the ranges still running and the worst status seen. */
    IoSlot parent;
    int remaining;
    short worst;
    /** C2HData header (with its digest and HPDA padding), data digest, CapsuleResp (with digest). */
    final ByteBuffer c2h = ByteBuffer.allocateDirect(Pdu.DATA_HLEN + Pdu.DIGEST + 128).order(ByteOrder.LITTLE_ENDIAN);
    final ByteBuffer ddgst = ByteBuffer.allocateDirect(Pdu.DIGEST).order(ByteOrder.LITTLE_ENDIAN);
    final ByteBuffer rsp = ByteBuffer.allocateDirect(Pdu.RSP_HLEN + Pdu.DIGEST).order(ByteOrder.LITTLE_ENDIAN);
    final ByteBuffer r2t = ByteBuffer.allocateDirect(Pdu.R2T_HLEN + Pdu.DIGEST).order(ByteOrder.LITTLE_ENDIAN);
    final CRC32C crc = new CRC32C();

    IoSlot(int tag) {
        this.tag = tag;
    }

    void reset(Request r, int cid, int opcode) {
        this.request = r;
        this.cid = cid;
        this.opcode = opcode;
        this.awaitingData = false;
        this.length = 0;
        this.received = 0;
        this.override = Nvme.OK;
        this.parent = null;
        this.remaining = 0;
        this.worst = Nvme.OK;
    }
}
