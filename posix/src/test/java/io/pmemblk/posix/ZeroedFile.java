package io.pmemblk.posix;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;

/** A file of zeros for a test that reads, writes, locks or maps it through a descriptor of its own. */
final class ZeroedFile {
    private ZeroedFile() {}

    /** Writes {@code size} zero bytes to {@code file} and opens it O_RDWR; the caller closes the descriptor. */
    static int openReadWrite(Path file, int size) throws IOException {
        Files.write(file, new byte[size]);
        return FileCalls.open(file.toString(), FileCalls.O_RDWR, 0);
    }
}
