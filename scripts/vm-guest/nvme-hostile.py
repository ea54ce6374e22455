#!/usr/bin/env python3
"""Hostile NVMe/TCP peers against a running target (pmemblk serve's NVMe/TCP frontend, or the kernel's nvmet-tcp as
the baseline): every malformed PDU, wrong digest, wrong length and wrong sequence is sent from a raw socket, each on
a connection of its own, and each must be answered (C2HTermReq, or a completion with the status the specification
names) or the connection closed within a bound. Meanwhile a well-behaved host of our own, on its own connection,
writes and reads back a block after every case (other hosts are served), and at the end canaries around every range
a case aimed at, the namespace's first and last blocks and, when --pool names the target's backing file, its size
and bytes, show nothing was written outside what the good host wrote.

Layouts: NVMe/TCP PDUs from the NVMe/TCP transport specification 1.0 as Linux's include/linux/nvme-tcp.h writes
them (common header 8 bytes; ICReq/ICResp 128; CapsuleCmd 8+64; CapsuleResp 8+16; H2CData/C2HData/R2T/TermReq 24);
commands and completions from the NVMe base specification as include/linux/nvme.h writes them (struct nvme_common_
command, nvmf_connect_command, nvmf_property_{get,set}_command, nvmf_connect_data, nvme_completion).

Output: "RESULT hostile.CASE=answer" lines (what the target did) and "RESULT hostile.status=pass|fail"; on a failure
"RESULT hostile.why=..." naming the case, what was expected and what was seen. Exit 0 only when every case passed.

Usage: nvme-hostile.py --addr 127.0.0.1 --port 4420 --nqn NQN [--pool FILE] [--stall-bound S] [--only CASE,...]
"""
import argparse
import hashlib
import os
import select
import socket
import struct
import sys
import time

# --- PDU layouts (include/linux/nvme-tcp.h) -------------------------------------------------------------------
ICREQ, ICRESP, H2C_TERM, C2H_TERM, CMD, RSP, H2C_DATA, C2H_DATA, R2T = 0, 1, 2, 3, 4, 5, 6, 7, 9
F_HDGST, F_DDGST, F_DATA_LAST, F_DATA_SUCCESS = 1, 2, 4, 8
HLEN = {ICREQ: 128, ICRESP: 128, H2C_TERM: 24, C2H_TERM: 24, CMD: 72, RSP: 24, H2C_DATA: 24, C2H_DATA: 24, R2T: 24}
FES_NAMES = {1: "invalid PDU header field", 2: "PDU sequence error", 3: "header digest error",
             4: "data transfer out of range", 5: "data transfer limit exceeded", 6: "unsupported parameter"}
DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery"

# --- NVMe opcodes and status codes (NVMe base specification; include/linux/nvme.h) ----------------------------
OP_FLUSH, OP_WRITE, OP_READ, OP_WRITE_ZEROES = 0x00, 0x01, 0x02, 0x08
ADM_IDENTIFY, ADM_SET_FEATURES, ADM_KEEP_ALIVE = 0x06, 0x09, 0x18
OP_FABRICS, FCTYPE_PROP_SET, FCTYPE_CONNECT, FCTYPE_PROP_GET = 0x7F, 0x00, 0x01, 0x04
SGL_INCAPSULE = 0x01    # (NVME_SGL_FMT_DATA_DESC << 4) | NVME_SGL_FMT_OFFSET
SGL_TRANSPORT = 0x5A    # (NVME_TRANSPORT_SGL_DATA_DESC << 4) | NVME_SGL_FMT_TRANSPORT_A
CMD_FLAGS_SGL = 0x40    # NVME_CMD_SGL_METABUF: PSDT = SGL for data
SC_SUCCESS, SC_INVALID_OPCODE, SC_INVALID_FIELD = 0x00, 0x01, 0x02
SC_DATA_XFER_ERROR, SC_SGL_INVALID_DATA_LEN, SC_SGL_INVALID_OFFSET = 0x04, 0x0F, 0x16
SC_TRANSIENT_TRANSPORT, SC_LBA_RANGE = 0x22, 0x80
STATUS_NAMES = {0x00: "success", 0x01: "invalid opcode", 0x02: "invalid field", 0x04: "data transfer error",
                0x06: "internal error", 0x0B: "invalid namespace", 0x0D: "SGL segment descriptor invalid",
                0x0F: "SGL data length invalid", 0x11: "SGL descriptor type invalid", 0x22: "transient transport error",
                0x16: "SGL offset invalid", 0x80: "LBA out of range", 0x81: "capacity exceeded"}
PROP_CC, PROP_CSTS = 0x14, 0x1C
CC_ENABLE = 1 | (6 << 16) | (4 << 20)   # EN, IOSQES 2^6 = 64, IOCQES 2^4 = 16 (nvmet refuses other sizes)


def crc32c(data, crc=0):
    """CRC32C (Castagnoli, reflected 0x82F63B78) as the NVMe/TCP digests use it: init ~0, final xor ~0."""
    crc ^= 0xFFFFFFFF
    t = _CRC_TABLE
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()
assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C


def status_text(sc):
    sct, code = (sc >> 8) & 7, sc & 0xFF
    return "SCT %d SC 0x%02x (%s)" % (sct, code, STATUS_NAMES.get(code, "?") if sct == 0 else "?")


class Closed(Exception):
    """The target closed the connection (reset or EOF)."""


class TermReq(Exception):
    """The target sent a C2HTermReq."""
    def __init__(self, fes, fei):
        super().__init__("C2HTermReq FES 0x%02x (%s), FEI 0x%x" % (fes, FES_NAMES.get(fes, "?"), fei))
        self.fes, self.fei = fes, fei


class Host:
    """A minimal, well-behaved NVMe/TCP host: one queue per connection, one command at a time."""

    def __init__(self, addr, port, timeout=30.0, hdgst=False, ddgst=False):
        self.sock = socket.create_connection((addr, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.hdgst, self.ddgst = hdgst, ddgst
        self.cid = 0
        self.bytewise = False
        self.maxh2c = 0
        self.cntlid = 0xFFFF
        self.peer = None   # the admin queue of an I/O queue's controller, closed with it

    def close(self):
        for s in (self.sock, self.peer.sock if self.peer else None):
            try:
                if s:
                    s.close()
            except OSError:
                pass

    # -- wire ------------------------------------------------------------------------------------------------
    def send(self, raw):
        if self.bytewise:   # one byte per segment: the target must reassemble every PDU
            for i in range(len(raw)):
                self.sock.sendall(raw[i:i + 1])
        else:
            self.sock.sendall(raw)

    def recv_exact(self, n):
        buf = bytearray()
        deadline = time.monotonic() + self.timeout
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no complete PDU from the target in %.0f s (%d of %d bytes)" % (self.timeout, len(buf), n))
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(n - len(buf))
            except ConnectionResetError:
                raise Closed("connection reset by the target")
            except socket.timeout:
                continue
            if not chunk:
                raise Closed("connection closed by the target")
            buf += chunk
        return bytes(buf)

    def pdu(self, ptype, flags, specific, data=b"", pdo=None, hlen=None, plen=None, hd=None, dd=None, hval=None,
            dval=None):
        """A PDU: common header + type-specific header [+ HDGST] [+ pad to PDO] [+ data + DDGST]. Fields may be
        forced to make it wrong on purpose: hlen, pdo, plen, the digests' presence (hd, dd) and values (hval, dval)."""
        hd = self.hdgst if hd is None else hd
        dd = self.ddgst if dd is None else dd
        if ptype == ICREQ:
            hd = dd = False
        dd = dd and bool(data)
        if hd:
            flags |= F_HDGST
        if dd:
            flags |= F_DDGST
        real_hlen = 8 + len(specific)
        after_hdr = real_hlen + (4 if hd else 0)
        if pdo is None:
            pdo = after_hdr if data else 0
        total = (max(pdo, after_hdr) if data else after_hdr) + len(data) + (4 if dd else 0)
        out = struct.pack("<BBBBI", ptype, flags, real_hlen if hlen is None else hlen, pdo,
                          total if plen is None else plen) + specific
        if hd:
            out += struct.pack("<I", crc32c(out) if hval is None else hval)
        if data:
            out += b"\0" * max(0, pdo - len(out))
            out += data
            if dd:
                out += struct.pack("<I", crc32c(data) if dval is None else dval)
        return out

    def read_pdu(self):
        ch = self.recv_exact(8)
        ptype, flags, hlen, pdo, plen = struct.unpack("<BBBBI", ch)
        if plen < 8 or plen > (1 << 24):
            raise AssertionError("target sent a PDU of type %d with plen %d" % (ptype, plen))
        rest = self.recv_exact(plen - 8)
        raw = ch + rest
        if ptype == C2H_TERM:
            fes, fei = struct.unpack_from("<HI", raw, 8)
            raise TermReq(fes, fei)
        spec = raw[8:hlen]
        off = hlen
        if flags & F_HDGST:
            want = crc32c(raw[:hlen])
            got = struct.unpack_from("<I", raw, hlen)[0]
            if want != got:
                raise AssertionError("target's header digest 0x%08x, computed 0x%08x (type %d)" % (got, want, ptype))
            off += 4
        data = b""
        if pdo and plen > pdo:
            end = plen - (4 if flags & F_DDGST else 0)
            data = raw[pdo:end]
            if flags & F_DDGST:
                got = struct.unpack_from("<I", raw, end)[0]
                if got != crc32c(data):
                    raise AssertionError("target's data digest 0x%08x, computed 0x%08x" % (got, crc32c(data)))
        return ptype, flags, spec, data

    # -- connection ------------------------------------------------------------------------------------------
    @staticmethod
    def icreq_spec(pfv=0, hpda=0, digest=0, maxr2t=0):
        """ICReq's PDU-specific header: PFV, HPDA, DGST, MAXR2T, then 112 reserved bytes (struct nvme_tcp_icreq_pdu)."""
        return struct.pack("<HBBI", pfv, hpda, digest, maxr2t) + b"\0" * 112

    def icreq(self, pfv=0, hpda=0, maxr2t=0, hlen=None, plen=None):
        digest = (1 if self.hdgst else 0) | (2 if self.ddgst else 0)
        self.send(self.pdu(ICREQ, 0, Host.icreq_spec(pfv, hpda, digest, maxr2t), hlen=hlen, plen=plen))
        ptype, _, spec, _ = self.read_pdu()
        if ptype != ICRESP:
            raise AssertionError("ICReq answered by PDU type %d, not ICResp" % ptype)
        rpfv, cpda, rdigest, self.maxh2c = struct.unpack_from("<HBBI", spec, 0)
        if rpfv != 0 or cpda != 0:
            raise AssertionError("ICResp PFV %d CPDA %d (this host wants 0 and 0)" % (rpfv, cpda))
        if rdigest != digest:
            raise AssertionError("ICResp digest 0x%x, asked 0x%x" % (rdigest, digest))

    def next_cid(self):
        self.cid = (self.cid + 1) & 0xFFFF
        return self.cid

    def command(self, sqe, data=b"", incapsule=True, expect_read=0, raw=False):
        """Sends one command (64-byte SQE with the command id filled in) and its data, in the capsule or on R2T;
        returns (status, result dw0, data read). raw=True returns after sending (the caller reads)."""
        sqe = bytearray(sqe)
        # PSDT = SGL on every command: a fabrics target refuses PRPs (nvmet_req_init: Invalid Field in flags)
        sqe[1] |= CMD_FLAGS_SGL
        cid = self.next_cid()
        struct.pack_into("<H", sqe, 2, cid)
        if data and incapsule:
            self.send(self.pdu(CMD, 0, bytes(sqe), data))
        else:
            self.send(self.pdu(CMD, 0, bytes(sqe)))
        if raw:
            return cid
        got = bytearray()
        while True:
            ptype, flags, spec, pdata = self.read_pdu()
            if ptype == R2T:
                rcid, ttag, off, length = struct.unpack_from("<HHII", spec, 0)
                if rcid != cid or off + length > len(data):
                    raise AssertionError("R2T for cid %d offset %d length %d; command %d has %d bytes" % (rcid, off, length, cid, len(data)))
                pos = off
                while pos < off + length:
                    n = min(off + length - pos, self.maxh2c or length)
                    last = F_DATA_LAST if pos + n == off + length else 0
                    self.send(self.pdu(H2C_DATA, last, struct.pack("<HHIII", cid, ttag, pos, n, 0), data[pos:pos + n]))
                    pos += n
            elif ptype == C2H_DATA:
                rcid, _, off, length = struct.unpack_from("<HHII", spec, 0)
                if rcid != cid or off != len(got) or length != len(pdata):
                    raise AssertionError("C2HData cid %d offset %d length %d (have %d bytes, %d in the PDU)" % (rcid, off, length, len(got), len(pdata)))
                got += pdata
                if flags & F_DATA_SUCCESS:
                    return 0, 0, bytes(got)
            elif ptype == RSP:
                dw0, _, _, _, rcid, st = struct.unpack_from("<IIHHHH", spec, 0)
                if rcid != cid:
                    raise AssertionError("CapsuleResp for cid %d, expected %d" % (rcid, cid))
                return (st >> 1) & 0x7FF, dw0, bytes(got)   # SCT and SC; DNR and More dropped
            else:
                raise AssertionError("unexpected PDU type %d while waiting for cid %d" % (ptype, cid))

    def connect(self, nqn, hostnqn, qid=0, sqsize=31, kato_ms=0, cntlid=0xFFFF):
        sqe = bytearray(64)
        sqe[0], sqe[1], sqe[4] = OP_FABRICS, CMD_FLAGS_SGL, FCTYPE_CONNECT
        struct.pack_into("<QI3xB", sqe, 24, 0, 1024, SGL_INCAPSULE)
        struct.pack_into("<HHHBxI", sqe, 40, 0, qid, sqsize, 0, kato_ms)
        cdata = bytearray(1024)
        cdata[0:16] = hashlib.md5(hostnqn.encode()).digest()
        struct.pack_into("<H", cdata, 16, cntlid)
        cdata[256:256 + len(nqn)] = nqn.encode()
        cdata[512:512 + len(hostnqn)] = hostnqn.encode()
        st, dw0, _ = self.command(sqe, bytes(cdata))
        if st != 0:
            raise AssertionError("Connect qid %d to %s: %s" % (qid, nqn, status_text(st)))
        if qid == 0:
            self.cntlid = dw0 & 0xFFFF
        return dw0

    def prop(self, offset, value=None, size8=False):
        sqe = bytearray(64)
        sqe[0], sqe[4] = OP_FABRICS, FCTYPE_PROP_GET if value is None else FCTYPE_PROP_SET
        sqe[40] = 1 if size8 else 0
        struct.pack_into("<I", sqe, 44, offset)
        if value is not None:
            struct.pack_into("<Q", sqe, 48, value)
        st, dw0, _ = self.command(sqe)
        if st != 0:
            raise AssertionError("Property %s 0x%x: %s" % ("Get" if value is None else "Set", offset, status_text(st)))
        return dw0

    def enable(self):
        self.prop(PROP_CC, CC_ENABLE)
        deadline = time.monotonic() + self.timeout
        while not self.prop(PROP_CSTS) & 1:
            if time.monotonic() > deadline:
                raise AssertionError("CSTS.RDY not set %.0f s after CC.EN" % self.timeout)
            time.sleep(0.01)

    def identify(self, cns, nsid=0):
        sqe = bytearray(64)
        sqe[0], sqe[1] = ADM_IDENTIFY, CMD_FLAGS_SGL
        struct.pack_into("<I", sqe, 4, nsid)
        struct.pack_into("<QI3xB", sqe, 24, 0, 4096, SGL_TRANSPORT)
        struct.pack_into("<I", sqe, 40, cns)
        st, _, data = self.command(sqe)
        if st != 0 or len(data) != 4096:
            raise AssertionError("Identify CNS %d: %s, %d bytes" % (cns, status_text(st), len(data)))
        return data

    @staticmethod
    def rw_sqe(op, slba, nblocks, nbytes, sgl=SGL_INCAPSULE, fua=False, nsid=1):
        sqe = bytearray(64)
        sqe[0], sqe[1] = op, CMD_FLAGS_SGL
        struct.pack_into("<I", sqe, 4, nsid)
        struct.pack_into("<QI3xB", sqe, 24, 0, nbytes, sgl)
        struct.pack_into("<QI", sqe, 40, slba, ((nblocks - 1) & 0xFFFF) | ((1 << 30) if fua else 0))
        return sqe


class Session:
    """An admin queue and one I/O queue to the subsystem, each on its own connection (as the Linux host does)."""

    def __init__(self, args, hdgst=False, ddgst=False, bytewise=False, kato_ms=0):
        self.admin = Host(args.addr, args.port, args.timeout, hdgst, ddgst)
        self.admin.bytewise = bytewise
        self.admin.icreq()
        self.admin.connect(args.nqn, args.hostnqn, 0, 31, kato_ms)
        self.admin.enable()
        # The Linux host always sets the queue count before connecting I/O queues (nvme_set_queue_count).
        sqe = bytearray(64)
        sqe[0] = ADM_SET_FEATURES
        struct.pack_into("<II", sqe, 40, 0x07, 0)
        self.admin.command(sqe)
        ns = self.admin.identify(0, 1)
        self.nsze = struct.unpack_from("<Q", ns, 0)[0]
        flbas = ns[26] & 0xF
        self.lbads = ns[128 + 4 * flbas + 2]
        self.bs = 1 << self.lbads
        ctrl = self.admin.identify(1)
        self.ioccsz = struct.unpack_from("<I", ctrl, 1792)[0]
        self.icd = max(0, self.ioccsz * 16 - 64)
        self.io = self.io_queue(args, hdgst, ddgst, bytewise)

    def io_queue(self, args, hdgst=False, ddgst=False, bytewise=False):
        q = Host(args.addr, args.port, args.timeout, hdgst, ddgst)
        q.bytewise = bytewise
        q.icreq()
        q.connect(args.nqn, args.hostnqn, 1, 31, 0, self.admin.cntlid)
        return q

    def write(self, slba, data, fua=False, q=None):
        q = q or self.io
        n = len(data) // self.bs
        inc = len(data) <= self.icd
        st, _, _ = q.command(Host.rw_sqe(OP_WRITE, slba, n, len(data), SGL_INCAPSULE if inc else SGL_TRANSPORT, fua), data, inc)
        return st

    def read(self, slba, nblocks, q=None):
        q = q or self.io
        st, _, data = q.command(Host.rw_sqe(OP_READ, slba, nblocks, nblocks * self.bs, SGL_TRANSPORT))
        return st, data

    def close(self):
        self.io.close()
        self.admin.close()


# --- the cases -------------------------------------------------------------------------------------------------
def pattern(tag, n):
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.sha256(b"%s:%d" % (tag.encode(), i)).digest()
        i += 1
    return bytes(out[:n])


def outcome(h, bound):
    """What the target does next on a connection it should give up on: ('term', fes), ('closed', secs) or
    ('rsp', status) for a completion, ('open', secs) when nothing happened within the bound."""
    t0 = time.monotonic()
    h.timeout = bound
    try:
        while True:
            ptype, _, spec, _ = h.read_pdu()
            if ptype == RSP:
                return "rsp", (struct.unpack_from("<IIHHHH", spec, 0)[5] >> 1) & 0x7FF
            if ptype == R2T:
                return "r2t", 0
    except TermReq as e:
        # After a C2HTermReq the target must close the connection (transport spec 3.6.2.2): wait for it.
        try:
            h.timeout = max(1.0, bound - (time.monotonic() - t0))
            h.recv_exact(1)
            return "term-open", e.fes
        except (Closed, TimeoutError, OSError):
            return "term", e.fes
    except Closed:
        return "closed", time.monotonic() - t0
    except TimeoutError:
        return "open", time.monotonic() - t0


class Run:
    def __init__(self, args):
        self.args = args
        self.failures = []
        self.answers = {}
        self.targets = []   # (slba, nblocks) ranges a case aimed at; their canaries are checked at the end

    def note(self, name, answer):
        self.answers[name] = answer
        print("RESULT hostile.%s=%s" % (name, answer), flush=True)

    def fail(self, name, why):
        self.failures.append("%s: %s" % (name, why))
        print("nvme-hostile: FAIL %s: %s" % (name, why), flush=True)


def expect_fatal(run, name, h, bound, allow_status=()):
    """The case's connection must end: a C2HTermReq followed by a close, or a close, within bound; a completion
    with one of allow_status is also accepted (a command-level answer the specification allows)."""
    kind, val = outcome(h, bound)
    h.close()
    if getattr(h, "peer", None):
        h.peer.close()
    if kind == "term":
        run.note(name, "C2HTermReq FES 0x%02x (%s), closed" % (val, FES_NAMES.get(val, "?")))
    elif kind == "closed":
        run.note(name, "closed after %.1f s" % val)
    elif kind == "rsp" and val in allow_status:
        run.note(name, "completion %s" % status_text(val))
    elif kind == "term-open":
        run.fail(name, "C2HTermReq FES 0x%02x but the connection stayed open (the spec: the sender closes after a TermReq)" % val)
    else:
        run.fail(name, "expected a C2HTermReq or a close within %.0f s, saw %s %s" % (bound, kind, status_text(val) if kind == "rsp" else "%.1f" % val if isinstance(val, float) else val))


def fresh(args, **kw):
    h = Host(args.addr, args.port, args.timeout, **kw)
    return h


def admin_ready(args, **kw):
    """A connection that finished ICReq and an admin Connect (so its PDUs reach the command parser)."""
    h = fresh(args, **kw)
    h.icreq()
    h.connect(args.nqn, args.hostnqn, 0, 31, 0)
    return h


def io_ready(args, sess=None, **kw):
    """An I/O queue (qid 1) on a controller of its own: a target refuses a second queue 1 on one controller
    (nvmet: "qid 1 has already been created"), and one case's end must not take the good host's controller."""
    a = fresh(args)
    a.icreq()
    a.connect(args.nqn, args.hostnqn, 0, 31, 0)
    a.enable()
    sqe = bytearray(64)
    sqe[0] = ADM_SET_FEATURES
    struct.pack_into("<II", sqe, 40, 0x07, 0)
    a.command(sqe)
    h = fresh(args, **kw)
    h.icreq()
    h.connect(args.nqn, args.hostnqn, 1, 31, 0, a.cntlid)
    h.peer = a
    return h


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--addr", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=4420)
    ap.add_argument("--nqn", required=True)
    ap.add_argument("--hostnqn", default="nqn.2014-08.org.nvmexpress:uuid:5e1f0000-0000-4000-8000-00000000beef")
    ap.add_argument("--pool", help="the target's backing file (namespace at offset 0): size and canaries checked")
    ap.add_argument("--timeout", type=float, default=30.0, help="bound on any answer from the target")
    ap.add_argument("--bound", type=float, default=10.0, help="bound for a bad connection's answer or close")
    ap.add_argument("--stall-bound", type=float, default=0, help="bound for the target to close a peer stalled "
                    "mid-PDU before any Connect (0: reported, not asserted)")
    ap.add_argument("--kato-ms", type=int, default=5000, help="KATO of the stalled connected peer")
    ap.add_argument("--only", default="", help="comma-separated case names")
    args = ap.parse_args()
    run = Run(args)
    t_start = time.monotonic()

    pool_size = os.path.getsize(args.pool) if args.pool else None
    good = Session(args)
    bs, nsze, icd = good.bs, good.nsze, good.icd
    print("nvme-hostile: namespace %d blocks of %d bytes, in-capsule data %d bytes, MAXH2CDATA %d" % (nsze, bs, icd, good.io.maxh2c), flush=True)
    if pool_size is not None and pool_size < nsze * bs:
        run.fail("setup", "pool %s is %d bytes, the namespace %d" % (args.pool, pool_size, nsze * bs))
    # Regions: each case aims at its own blocks in the middle; canaries on either side and at both ends.
    base = max(64, (nsze // 2) // 64 * 64)
    canary = {}

    def put_canary(slba, n=1):
        data = pattern("canary-%d" % slba, n * bs)
        st = good.write(slba, data)
        if st != 0:
            raise AssertionError("canary write at %d: %s" % (slba, status_text(st)))
        canary[slba] = data

    for lba in (0, nsze - 1, nsze - 2):
        put_canary(lba)
    for k in range(32):
        put_canary(base + k * 4 - 1)
        put_canary(base + k * 4 + 2)
    slot = [0]

    def region(n=2):
        s = base + slot[0] * 4
        slot[0] += 1
        run.targets.append((s, n))
        return s

    def good_io(after):
        """The good host's I/O must complete after every case (another host served meanwhile)."""
        lba = base - 8
        data = pattern("good-%s" % after, bs)
        try:
            st = good.write(lba, data)
            st2, back = good.read(lba, 1)
        except Exception as e:  # noqa: BLE001 - reported as the failure it is
            run.fail(after, "the good host's I/O after this case failed: %s" % e)
            return False
        if st or st2 or back != data:
            run.fail(after, "the good host's write+read after this case: write %s, read %s, data %s" % (
                status_text(st), status_text(st2), "equal" if back == data else "DIFFERENT"))
            return False
        return True

    B = args.bound
    cases = []

    def case(fn):
        cases.append(fn)
        return fn

    @case
    def icreq_bad_hlen():
        h = fresh(args)
        h.send(h.pdu(ICREQ, 0, Host.icreq_spec(), hlen=0x20))
        expect_fatal(run, "icreq_bad_hlen", h, B)

    @case
    def icreq_bad_plen():
        h = fresh(args)
        h.send(h.pdu(ICREQ, 0, Host.icreq_spec(), plen=0x7FFFFFF0))
        expect_fatal(run, "icreq_bad_plen", h, B)

    @case
    def icreq_pfv1():
        h = fresh(args)
        h.send(h.pdu(ICREQ, 0, Host.icreq_spec(pfv=1)))
        expect_fatal(run, "icreq_pfv1", h, B)

    @case
    def cmd_before_icreq():
        h = fresh(args)
        h.send(h.pdu(CMD, 0, bytes(Host.rw_sqe(OP_FLUSH, 0, 1, 0))))
        expect_fatal(run, "cmd_before_icreq", h, B)

    @case
    def second_icreq():
        h = admin_ready(args)
        h.send(h.pdu(ICREQ, 0, Host.icreq_spec()))
        expect_fatal(run, "second_icreq", h, B)

    @case
    def unknown_type():
        h = admin_ready(args)
        h.send(struct.pack("<BBBBI", 0x0F, 0, 24, 0, 24) + b"\0" * 16)
        expect_fatal(run, "unknown_type", h, B)

    @case
    def c2h_type_from_host():
        h = admin_ready(args)   # a controller-to-host type sent by the host
        h.send(h.pdu(RSP, 0, b"\0" * 16))
        expect_fatal(run, "c2h_type_from_host", h, B)

    @case
    def cmd_bad_hlen():
        h = io_ready(args, good)
        h.send(h.pdu(CMD, 0, bytes(Host.rw_sqe(OP_FLUSH, 0, 1, 0)), hlen=0x40))
        expect_fatal(run, "cmd_bad_hlen", h, B)

    @case
    def cmd_pdo_inside_header():
        s = region()
        h = io_ready(args, good)
        data = pattern("pdo", bs)
        h.send(h.pdu(CMD, 0, bytes(Host.rw_sqe(OP_WRITE, s, 1, bs)), data, pdo=16))
        expect_fatal(run, "cmd_pdo_inside_header", h, B)

    @case
    def cmd_pdo_past_plen():
        s = region()
        h = io_ready(args, good)
        sqe = bytes(Host.rw_sqe(OP_WRITE, s, 1, bs))
        raw = bytearray(h.pdu(CMD, 0, sqe, pattern("pdo2", bs)))
        raw[3] = 0xF0   # PDO 240, the PDU still as long as before: data would start past... and overlap nothing sane
        struct.pack_into("<I", raw, 4, 72 + bs)
        h.send(bytes(raw))
        expect_fatal(run, "cmd_pdo_past_plen", h, B)

    @case
    def cmd_huge_plen():
        h = io_ready(args, good)
        raw = bytearray(h.pdu(CMD, 0, bytes(Host.rw_sqe(OP_WRITE, region(), 1, bs)), pattern("huge", bs)))
        struct.pack_into("<I", raw, 4, 0x7FFFFFFF)
        h.send(bytes(raw))
        expect_fatal(run, "cmd_huge_plen", h, B)

    @case
    def incapsule_longer_than_sgl():
        # the SGL says one block, the capsule carries two: the transport spec makes the data length the SGL's
        s = region()
        h = io_ready(args, good)
        h.send(h.pdu(CMD, 0, bytes(Host.rw_sqe(OP_WRITE, s, 1, bs)), pattern("long", 2 * bs)))
        expect_fatal(run, "incapsule_longer_than_sgl", h, B, (SC_SGL_INVALID_DATA_LEN, SC_INVALID_FIELD, SC_DATA_XFER_ERROR))

    @case
    def sgl_longer_than_nlb():
        # NLB says one block, the SGL and the capsule two: a data length past the command
        s = region()
        h = io_ready(args, good)
        h.send(h.pdu(CMD, 0, bytes(Host.rw_sqe(OP_WRITE, s, 1, 2 * bs)), pattern("nlb", 2 * bs)))
        expect_fatal(run, "sgl_longer_than_nlb", h, B, (SC_SGL_INVALID_DATA_LEN, SC_INVALID_FIELD, SC_DATA_XFER_ERROR))

    @case
    def incapsule_over_icd():
        if icd == 0:
            run.note("incapsule_over_icd", "skipped: no in-capsule data")
            return
        n = (icd // bs) + 1
        s = region(n)
        h = io_ready(args, good)
        h.send(h.pdu(CMD, 0, bytes(Host.rw_sqe(OP_WRITE, s, n, n * bs)), pattern("icd", n * bs)))
        expect_fatal(run, "incapsule_over_icd", h, B, (SC_SGL_INVALID_DATA_LEN, SC_SGL_INVALID_OFFSET, SC_INVALID_FIELD, SC_DATA_XFER_ERROR))

    @case
    def h2cdata_unasked():
        h = io_ready(args, good)
        h.send(h.pdu(H2C_DATA, F_DATA_LAST, struct.pack("<HHIII", 0x77, 0x1234, 0, bs, 0), pattern("unasked", bs)))
        expect_fatal(run, "h2cdata_unasked", h, B)

    def r2t_write(name, mutate):
        """A write too big for the capsule: the target's R2T, then an H2CData changed by mutate(R2T) -> bytes."""
        n = max(2, (icd // bs) + 2)
        s = region(n)
        h = io_ready(args, good)
        cid = h.command(Host.rw_sqe(OP_WRITE, s, n, n * bs, SGL_TRANSPORT), raw=True)
        try:
            ptype, _, spec, _ = h.read_pdu()
        except (TermReq, Closed, TimeoutError) as e:
            run.fail(name, "no R2T for a %d-byte write: %s" % (n * bs, e))
            h.close()
            return
        if ptype != R2T:
            run.fail(name, "a %d-byte write answered by PDU type %d, not R2T" % (n * bs, ptype))
            h.close()
            return
        _, ttag, off, length = struct.unpack_from("<HHII", spec, 0)
        h.send(mutate(h, cid, ttag, off, length))
        expect_fatal(run, name, h, B, (SC_DATA_XFER_ERROR, SC_SGL_INVALID_DATA_LEN, SC_TRANSIENT_TRANSPORT))

    @case
    def h2cdata_past_r2t():
        r2t_write("h2cdata_past_r2t", lambda h, cid, ttag, off, length: h.pdu(
            H2C_DATA, F_DATA_LAST, struct.pack("<HHIII", cid, ttag, off + bs, length, 0), pattern("past", length)))

    @case
    def h2cdata_wrong_ttag():
        r2t_write("h2cdata_wrong_ttag", lambda h, cid, ttag, off, length: h.pdu(
            H2C_DATA, F_DATA_LAST, struct.pack("<HHIII", cid, ttag ^ 0x5555, off, length, 0), pattern("ttag", length)))

    @case
    def h2cdata_length_mismatch():
        # DATAL says the R2T's length, the PDU carries one block less
        r2t_write("h2cdata_length_mismatch", lambda h, cid, ttag, off, length: h.pdu(
            H2C_DATA, F_DATA_LAST, struct.pack("<HHIII", cid, ttag, off, length, 0), pattern("short", length - bs)))

    @case
    def h2cdata_zero_length():
        r2t_write("h2cdata_zero_length", lambda h, cid, ttag, off, length: struct.pack(
            "<BBBBIHHIII", H2C_DATA, F_DATA_LAST, 24, 0, 24, cid, ttag, off, 0, 0))

    @case
    def hdgst_wrong():
        h = io_ready(args, hdgst=True)
        h.send(h.pdu(CMD, 0, bytes(Host.rw_sqe(OP_FLUSH, 0, 1, 0)), hval=0xDEADBEEF))
        expect_fatal(run, "hdgst_wrong", h, B)

    @case
    def hdgst_missing_flag():
        # digests negotiated, the PDU without its HDGST flag and digest
        h = io_ready(args, hdgst=True)
        h.send(h.pdu(CMD, 0, bytes(Host.rw_sqe(OP_FLUSH, 0, 1, 0)), hd=False))
        expect_fatal(run, "hdgst_missing_flag", h, B)

    @case
    def ddgst_wrong():
        # a data digest error: the spec lets the target end the command (transient transport error) or the
        # connection; either way the data must not land
        s = region()
        h = io_ready(args, ddgst=True)
        h.send(h.pdu(CMD, 0, bytes(Host.rw_sqe(OP_WRITE, s, 1, bs)), pattern("ddgst", bs), dval=0x0BADF00D))
        expect_fatal(run, "ddgst_wrong", h, B, (SC_TRANSIENT_TRANSPORT, SC_DATA_XFER_ERROR))

    @case
    def lba_out_of_range():
        h = io_ready(args, good)
        answers = []
        for slba, n in ((nsze, 1), (nsze - 1, 2), ((1 << 63) | 5, 1), (nsze - 2, 0x10000)):
            nb = n * bs if n * bs <= icd else bs
            st, _, _ = h.command(Host.rw_sqe(OP_WRITE, slba, n, nb), pattern("oor", nb))
            answers.append(st)
            if st not in (SC_LBA_RANGE, SC_SGL_INVALID_DATA_LEN, SC_INVALID_FIELD):
                run.fail("lba_out_of_range", "write of %d blocks at LBA %d (namespace %d blocks): expected LBA out of range, saw %s" % (n, slba, nsze, status_text(st)))
                h.close()
                return
        st, _, _ = h.command(Host.rw_sqe(OP_READ, nsze - 1, 2, 2 * bs, SGL_TRANSPORT))
        answers.append(st)
        h.close()
        if st != SC_LBA_RANGE:
            run.fail("lba_out_of_range", "read of 2 blocks at the last LBA: expected LBA out of range, saw %s" % status_text(st))
            return
        run.note("lba_out_of_range", " ".join(status_text(a) for a in answers))

    @case
    def unknown_opcode():
        h = io_ready(args, good)
        sqe = Host.rw_sqe(0xEE, 0, 1, 0)
        st, _, _ = h.command(sqe)
        h.close()
        if st != SC_INVALID_OPCODE:
            run.fail("unknown_opcode", "I/O opcode 0xEE: expected invalid opcode, saw %s" % status_text(st))
        else:
            run.note("unknown_opcode", status_text(st))

    @case
    def bad_nsid():
        h = io_ready(args, good)
        st, _, _ = h.command(Host.rw_sqe(OP_READ, 0, 1, bs, SGL_TRANSPORT, nsid=0x7777))
        h.close()
        if (st & 0xFF) != 0x0B:
            run.fail("bad_nsid", "read on NSID 0x7777: expected invalid namespace, saw %s" % status_text(st))
        else:
            run.note("bad_nsid", status_text(st))

    @case
    def io_queue_bad_cntlid():
        h = fresh(args)
        h.icreq()
        try:
            h.connect(args.nqn, args.hostnqn, 1, 31, 0, (good.admin.cntlid + 0x100) & 0xFFEF)
        except AssertionError as e:
            h.close()
            run.note("io_queue_bad_cntlid", "refused: %s" % e)
            return
        except (TermReq, Closed) as e:
            h.close()
            run.note("io_queue_bad_cntlid", "refused: %s" % e)
            return
        h.close()
        run.fail("io_queue_bad_cntlid", "an I/O queue Connect naming a controller that does not exist was accepted")

    @case
    def bytewise():
        # every PDU of a whole session split into 1-byte segments: served as if whole
        s = region()
        try:
            sess = Session(args, hdgst=True, ddgst=True, bytewise=True)
            data = pattern("bytewise", bs)
            st = sess.write(s, data)
            st2, back = sess.read(s, 1)
            sess.close()
        except Exception as e:  # noqa: BLE001
            run.fail("bytewise", "a session sent one byte at a time (digests on): %s" % e)
            return
        if st or st2 or back != data:
            run.fail("bytewise", "one byte at a time: write %s, read %s, data %s" % (status_text(st), status_text(st2), "equal" if back == data else "DIFFERENT"))
            return
        canary[s] = data   # written on purpose: the canary check expects it
        run.targets.remove((s, 2))
        run.note("bytewise", "served (write and read back equal, digests on)")

    @case
    def stall_before_connect():
        # half an ICReq, then nothing: other hosts served meanwhile; closed within --stall-bound if given
        h = fresh(args)
        h.send(h.pdu(ICREQ, 0, Host.icreq_spec())[:60])
        ok = good_io("stall_before_connect")
        bound = args.stall_bound or 3   # not asserted without --stall-bound: a short look
        kind, val = outcome(h, bound)
        h.close()
        if kind == "open" and args.stall_bound:
            run.fail("stall_before_connect", "a peer stalled mid-ICReq still connected after %.0f s" % args.stall_bound)
        elif ok:
            run.note("stall_before_connect", "others served; the stalled peer %s" % (
                "still connected after %.0f s (not asserted)" % val if kind == "open" else "%s %s" % (kind, val)))

    @case
    def stall_mid_capsule():
        # a controller with KATO, then half a command capsule: the keep-alive timer must end it
        h = fresh(args)
        h.icreq()
        h.connect(args.nqn, args.hostnqn, 0, 31, args.kato_ms)
        h.enable()
        h.send(h.pdu(CMD, 0, bytes(Host.rw_sqe(ADM_KEEP_ALIVE, 0, 1, 0, nsid=0)))[:40])
        ok = good_io("stall_mid_capsule")
        bound = 2 * args.kato_ms / 1000 + B
        kind, val = outcome(h, bound)
        h.close()
        if kind in ("closed", "term"):
            if ok:
                run.note("stall_mid_capsule", "others served; the stalled controller ended: %s %s" % (kind, val))
        else:
            run.fail("stall_mid_capsule", "a controller with KATO %d ms stalled mid-capsule: expected a close within %.0f s, saw %s" % (args.kato_ms, bound, kind))

    only = set(filter(None, args.only.split(",")))
    for fn in cases:
        if only and fn.__name__ not in only:
            continue
        t0 = time.monotonic()
        try:
            fn()
        except (TermReq, Closed, TimeoutError, AssertionError, OSError) as e:
            run.fail(fn.__name__, "the case could not be set up: %s" % e)
        print("nvme-hostile: %s (%.1f s)" % (fn.__name__, time.monotonic() - t0), flush=True)
        if fn.__name__ not in ("stall_before_connect", "stall_mid_capsule"):
            good_io(fn.__name__)

    # Nothing written outside what the good host wrote: every canary reads back, every aimed-at range still
    # holds what was there before (zeros or an earlier run's bytes: compared with a read before is not possible
    # for a case that might have written, so the ranges are checked not to hold any case's pattern).
    bad = []
    for lba, data in sorted(canary.items()):
        st, back = good.read(lba, len(data) // bs)
        if st or back != data:
            bad.append("LBA %d (%s)" % (lba, "read " + status_text(st) if st else "changed"))
    hostile_tags = ["pdo", "pdo2", "huge", "long", "nlb", "icd", "past", "ttag", "short", "ddgst", "unasked", "oor"]
    for s, n in run.targets:
        st, back = good.read(s, n)
        for k in range(n):
            blk = back[k * bs:(k + 1) * bs]
            for t in hostile_tags:
                # the patterns are sha256 streams: the first 32 bytes identify a block of any of them
                if blk[:32] == pattern(t, 32):
                    bad.append("LBA %d holds the rejected '%s' data" % (s + k, t))
    if pool_size is not None:
        now = os.path.getsize(args.pool)
        if now != pool_size:
            bad.append("pool file %d bytes, was %d" % (now, pool_size))
        with open(args.pool, "rb") as f:
            for lba, data in sorted(canary.items()):
                f.seek(lba * bs)
                if f.read(len(data)) != data:
                    bad.append("pool file at LBA %d differs from the canary (namespace not at offset 0?)" % lba)
                    break
            f.seek(nsze * bs)
            tail = f.read(1 << 20)
            if any(tail):
                bad.append("pool file past the namespace holds %d non-zero bytes" % sum(1 for b in tail if b))
    if bad:
        run.fail("canaries", "; ".join(bad[:8]))
    else:
        run.note("canaries", "%d canaries intact, %d aimed-at ranges hold no rejected data%s" % (
            len(canary), len(run.targets), ", pool file unchanged in size" if pool_size is not None else ""))
    ok = good_io("end")
    good.close()
    print("RESULT hostile.secs=%.0f" % (time.monotonic() - t_start))
    if run.failures or not ok:
        print("RESULT hostile.why=%s" % " | ".join(run.failures)[:900])
        print("RESULT hostile.status=fail")
        return 1
    print("RESULT hostile.status=pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
