package io.pmemblk.queueing.testing;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HexFormat;

/** Tests' fingerprint of bytes or a whole file: equal digests, equal contents (a device or image left untouched). */
public final class Digests {
    private Digests() {
    }

    /** The SHA-256 of {@code bytes}, in lower-case hex. */
    public static String sha256(byte[] bytes) {
        try {
            return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(bytes));
        } catch (NoSuchAlgorithmException e) {
            throw new AssertionError("every JDK has SHA-256", e);
        }
    }

    /** The SHA-256 of the whole file at {@code file}, in lower-case hex. */
    public static String sha256(Path file) throws IOException {
        return sha256(Files.readAllBytes(file));
    }
}
