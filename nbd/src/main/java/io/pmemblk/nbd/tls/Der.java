package io.pmemblk.nbd.tls;

import java.io.ByteArrayOutputStream;

/** Just enough DER (ITU-T X.690) to put a PKCS#1 RSA key into the PKCS#8 envelope the JDK reads. */
final class Der {
    private Der() {}

    /** rsaEncryption, 1.2.840.113549.1.1.1 (RFC 8017 appendix C), DER-encoded with its tag. */
    private static final byte[] RSA_ENCRYPTION_OID = {0x06, 0x09, 0x2a, (byte) 0x86, 0x48, (byte) 0x86, (byte) 0xf7,
            0x0d, 0x01, 0x01, 0x01};

    /**
     * RFC 5208 PrivateKeyInfo: SEQUENCE { INTEGER 0, SEQUENCE { rsaEncryption, NULL }, OCTET STRING pkcs1 }.
     */
    static byte[] rsaPkcs1ToPkcs8(byte[] pkcs1) {
        byte[] version = {0x02, 0x01, 0x00};
        byte[] algorithm = tlv(0x30, concat(RSA_ENCRYPTION_OID, new byte[] {0x05, 0x00}));
        return tlv(0x30, concat(version, algorithm, tlv(0x04, pkcs1)));
    }

    static byte[] tlv(int tag, byte[] content) {
        ByteArrayOutputStream o = new ByteArrayOutputStream(content.length + 6);
        o.write(tag);
        int n = content.length;
        if (n < 0x80) {
            o.write(n);
        } else {
            int bytes = (32 - Integer.numberOfLeadingZeros(n) + 7) / 8;
            o.write(0x80 | bytes);
            for (int i = bytes - 1; i >= 0; i--) {
                o.write(n >>> (8 * i));
            }
        }
        o.writeBytes(content);
        return o.toByteArray();
    }

    private static byte[] concat(byte[]... parts) {
        ByteArrayOutputStream o = new ByteArrayOutputStream();
        for (byte[] p : parts) {
            o.writeBytes(p);
        }
        return o.toByteArray();
    }
}
