package io.pmemblk.nvme;

/**
 * NVMe command, completion and data-structure layouts, written once. Sources: NVM Express Base Specification
 * 1.3 / 1.4 (SQE 4.2, CQE 4.6, status codes 4.6.1.2, Identify 5.15, Get Log Page 5.14, Features 5.21,
 * properties 3.1) and NVMe over Fabrics 1.1 (Connect 3.3, Property Get/Set 3.4/3.5, Discovery Log 5.3), as Linux
 * spells them in include/linux/nvme.h. Little-endian throughout.
 */
public final class Nvme {
    private Nvme() {}

    // ---- Submission queue entry (struct nvme_common_command), 64 bytes
    public static final int SQE_SIZE = 64, CQE_SIZE = 16;
    public static final int SQE_OPCODE = 0, SQE_FLAGS = 1, SQE_CID = 2, SQE_NSID = 4, SQE_DPTR = 24, SQE_CDW10 = 40,
            SQE_CDW11 = 44, SQE_CDW12 = 48, SQE_CDW13 = 52, SQE_CDW14 = 56, SQE_CDW15 = 60;
    /** FUSE, bits 1:0 of SQE_FLAGS: first/second command of a fused pair (Identify FUSES 0: none supported). */
    public static final int FUSE_MASK = 0x03;
    /** PSDT, bits 7:6 of SQE_FLAGS: 01, SGL for the data (NVME_CMD_SGL_METABUF), the only kind NVMe/TCP carries. */
    public static final int PSDT_MASK = 0xC0, PSDT_SGL = 0x40;
    /** The data pointer as an SGL descriptor (struct nvme_sgl_desc): address, length, type in the last byte. */
    public static final int SGL_ADDR = SQE_DPTR, SGL_LENGTH = SQE_DPTR + 8, SGL_TYPE = SQE_DPTR + 15;
    /** Data block descriptor, subtype offset: data in the capsule at the address's offset (nvme_tcp_set_sg_inline). */
    public static final int SGL_INCAPSULE = 0x01;
    /** Transport SGL data block, subtype transport-specific: data by R2T/H2CData or C2HData (nvme_tcp_set_sg_host_data). */
    public static final int SGL_TRANSPORT = 0x5A;

    // ---- Completion queue entry (struct nvme_completion), 16 bytes
    public static final int CQE_RESULT = 0, CQE_SQHD = 8, CQE_SQID = 10, CQE_CID = 12, CQE_STATUS = 14;

    // ---- Opcodes
    public static final int ADMIN_GET_LOG_PAGE = 0x02, ADMIN_IDENTIFY = 0x06, ADMIN_ABORT = 0x08, ADMIN_SET_FEATURES = 0x09,
            ADMIN_GET_FEATURES = 0x0A, ADMIN_AER = 0x0C, ADMIN_KEEP_ALIVE = 0x18, FABRICS = 0x7F;
    public static final int IO_FLUSH = 0x00, IO_WRITE = 0x01, IO_READ = 0x02, IO_WRITE_ZEROES = 0x08, IO_DSM = 0x09;
    /** Fabrics command type, byte 4 of a fabrics SQE (struct nvmf_common_command). */
    public static final int FCTYPE = 4;
    public static final int FCTYPE_PROPERTY_SET = 0x00, FCTYPE_CONNECT = 0x01, FCTYPE_PROPERTY_GET = 0x04;

    // ---- Status (the 15-bit field above the phase bit: DNR bit 14, SCT bits 10:8, SC bits 7:0, as Linux's NVME_SC_*)
    public static final int SCT_GENERIC = 0, SCT_COMMAND = 1, SCT_MEDIA = 2;
    public static final int DNR = 0x4000;
    public static final int SC_SUCCESS = 0x00, SC_INVALID_OPCODE = 0x01, SC_INVALID_FIELD = 0x02,
            SC_DATA_TRANSFER_ERROR = 0x04, SC_INTERNAL = 0x06, SC_ABORT_REQUESTED = 0x07,
            SC_INVALID_NS = 0x0B, SC_CMD_SEQ_ERROR = 0x0C, SC_SGL_INVALID_DATA_LENGTH = 0x0F,
            SC_SGL_INVALID_TYPE = 0x11, SC_SGL_INVALID_OFFSET = 0x16, SC_TRANSIENT_TRANSPORT = 0x22,
            SC_LBA_RANGE = 0x80, SC_CAPACITY_EXCEEDED = 0x81, SC_NS_WRITE_PROTECTED = 0x20;
    /** Command specific (SCT 1). */
    public static final int SC_ASYNC_LIMIT = 0x05, SC_INVALID_LOG_PAGE = 0x09, SC_FEATURE_NOT_CHANGEABLE = 0x0E,
            SC_CONNECT_FORMAT = 0x80, SC_CONNECT_CTRL_BUSY = 0x81, SC_CONNECT_INVALID_PARAM = 0x82,
            SC_CONNECT_INVALID_HOST = 0x84, SC_MAX_TRANSFER_EXCEEDED = 0x8C;  // unused: reserved name
    /** Media (SCT 2). */
    public static final int SC_WRITE_FAULT = 0x80, SC_READ_ERROR = 0x81;

    /** The status half-word of a CQE (phase bit 0 stays 0 on fabrics). */
    public static short status(int sct, int sc, boolean dnr) {
        return (short) (((dnr ? DNR : 0) | (sct << 8) | sc) << 1);
    }

    public static final short OK = 0;

    // ---- Fabrics Connect (struct nvmf_connect_command, struct nvmf_connect_data)
    public static final int CONNECT_RECFMT = 40, CONNECT_QID = 42, CONNECT_SQSIZE = 44, CONNECT_CATTR = 46, CONNECT_KATO = 48;
    /** CATTR bit 2: the host disables SQ flow control (SQHD 0xFFFF, C2HData SUCCESS allowed). */
    public static final int CATTR_DISABLE_SQFLOW = 1 << 2;
    public static final int CONNECT_DATA_SIZE = 1024;
    public static final int CD_HOSTID = 0, CD_CNTLID = 16, CD_SUBNQN = 256, CD_HOSTNQN = 512, NQN_FIELD = 256;
    public static final int HOST_ID_SIZE = 16;
    /** IATTR/IPO of a Connect Invalid Parameters result (IPO_IATTR_CONNECT_DATA / _SQE). */
    public static int ipoData(int offset) {
        return (1 << 16) | offset;
    }
    public static final int DYNAMIC_CNTLID = 0xFFFF;
    /** The admin queue the Linux host asks for (NVME_AQ_DEPTH): MQES must allow it. */
    public static final int ADMIN_QUEUE_DEPTH = 32;

    // ---- Property Get/Set (struct nvmf_property_get_command / _set_command)
    public static final int PROP_ATTRIB = 40, PROP_OFFSET = 44, PROP_VALUE = 48;
    /** ATTRIB bits 2:0, the property's size (NVMe-oF 1.1 figures 17 and 19); the other values are reserved. */
    public static final int PROP_SIZE_4 = 0, PROP_SIZE_8 = 1;
    public static final int PROP_CAP = 0x00, PROP_VS = 0x08, PROP_CC = 0x14, PROP_CSTS = 0x1C;
    /** CC (NVMe base 1.3 figure 78): EN bit 0, CSS 6:4, MPS 10:7, AMS 13:11, SHN 15:14, IOSQES 19:16, IOCQES 23:20. */
    public static final int CC_EN = 1, CC_CSS_SHIFT = 4, CC_MPS_SHIFT = 7, CC_AMS_SHIFT = 11, CC_SHN_SHIFT = 14,
            CC_SHN_MASK = 3 << 14, CC_IOSQES_SHIFT = 16, CC_IOCQES_SHIFT = 20;
    /** log2 of the entry sizes CC.IOSQES and CC.IOCQES must name: 64-byte SQEs, 16-byte CQEs (NVME_NVM_IOSQES/IOCQES). */
    public static final int SQE_SIZE_SHIFT = 6, CQE_SIZE_SHIFT = 4;
    /** CSTS: RDY bit 0, CFS bit 1 (Controller Fatal Status), SHST 3:2. */
    public static final int CSTS_RDY = 1, CSTS_CFS = 2, CSTS_SHST_COMPLETE = 2 << 2;
    public static final int VERSION_1_3 = 0x00010300;

    // ---- Identify (CNS in CDW10 bits 7:0)
    public static final int CNS_NAMESPACE = 0x00, CNS_CONTROLLER = 0x01, CNS_ACTIVE_NS_LIST = 0x02, CNS_NS_DESCRIPTORS = 0x03,
            CNS_CS_NAMESPACE = 0x05, CNS_CS_CONTROLLER = 0x06;
    public static final int IDENTIFY_SIZE = 4096;
    /** Identify Controller fields (struct nvme_id_ctrl). */
    public static final int IC_VID = 0, IC_SSVID = 2, IC_SN = 4, IC_MN = 24, IC_FR = 64, IC_RAB = 72, IC_CMIC = 76, IC_MDTS = 77,
            IC_CNTLID = 78, IC_VER = 80, IC_OAES = 92, IC_CNTRLTYPE = 111, IC_ACL = 258, IC_AERL = 259, IC_FRMW = 260,
            IC_LPA = 261, IC_ELPE = 262, IC_KAS = 320, IC_SQES = 512, IC_CQES = 513, IC_MAXCMD = 514, IC_NN = 516,
            IC_ONCS = 520, IC_VWC = 525, IC_SGLS = 536, IC_SUBNQN = 768, IC_IOCCSZ = 1792, IC_IORCSZ = 1796,
            IC_ICDOFF = 1800, IC_MSDBD = 1803;
    public static final int CNTRLTYPE_IO = 1, CNTRLTYPE_DISCOVERY = 2;
    public static final int ONCS_DSM = 1 << 2, ONCS_WRITE_ZEROES = 1 << 3;
    /** SGLS: SGLs supported (bits 1:0 = 01b) and offsets in data block descriptors (bit 20): what nvmet-tcp says. */
    public static final int SGLS_SUPPORTED = 1, SGLS_OFFSET = 1 << 20;
    /** CMIC bit 1: the subsystem may have several controllers (one per host connection). */
    public static final int CMIC_MULTI_CTRL = 1 << 1;
    /** LPA bit 2: extended data for Get Log Page (NUMDU, LPO). */
    public static final int LPA_EXTENDED = 1 << 2;
    /** Identify Namespace fields (struct nvme_id_ns). */
    public static final int IN_NSZE = 0, IN_NCAP = 8, IN_NUSE = 16, IN_NSFEAT = 24, IN_NLBAF = 25, IN_FLBAS = 26, IN_NMIC = 30,
            IN_NGUID = 104, IN_EUI64 = 120, IN_LBAF0 = 128;
    /** Namespace identification descriptor types (NIDT). */
    public static final int NIDT_EUI64 = 1, NIDT_NGUID = 2, NIDT_UUID = 3, NIDT_CSI = 4;

    // ---- Get Log Page
    public static final int LID_ERROR = 0x01, LID_SMART = 0x02, LID_FW_SLOT = 0x03, LID_CHANGED_NS = 0x04, LID_DISCOVERY = 0x70;
    // ---- Features
    public static final int FID_VWC = 0x06, FID_NUM_QUEUES = 0x07, FID_ASYNC_EVENT = 0x0B, FID_KATO = 0x0F;

    // ---- Discovery log page (struct nvmf_disc_rsp_page_hdr / _entry), NVMe-oF 1.1 5.3
    public static final int DISC_GENCTR = 0, DISC_NUMREC = 8, DISC_RECFMT = 16, DISC_HEADER = 1024, DISC_ENTRY = 1024;
    public static final int DE_TRTYPE = 0, DE_ADRFAM = 1, DE_SUBTYPE = 2, DE_TREQ = 3, DE_PORTID = 4, DE_CNTLID = 6,
            DE_ASQSZ = 8, DE_TRSVCID = 32, DE_SUBNQN = 256, DE_TRADDR = 512, DE_TSAS = 768;
    public static final int TRTYPE_TCP = 3, ADRFAM_IPV4 = 1, ADRFAM_IPV6 = 2, SUBTYPE_DISCOVERY = 3, SUBTYPE_NVME = 2;
    /** TREQ: secure channel not required (01b) | SQ flow control disable supported (bit 2). */
    public static final int TREQ_NOT_REQUIRED_SQFLOW = 0x02 | 0x04;
    public static final String DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery";
}
