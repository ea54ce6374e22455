package io.pmemblk.settings;

import java.io.IOException;
import java.nio.file.FileSystems;
import java.nio.file.attribute.GroupPrincipal;

/** The group a socket is given (vhost.socket-group, dma-device --socket-group): one lookup for every caller. */
public final class Groups {
    private Groups() {}

    /**
     * A group by name or number, as chown(1) takes it.
     *
     * @throws IllegalArgumentException naming the text, when the system does not know the group
     */
    public static GroupPrincipal byNameOrNumber(String t) {
        // The JDK takes any int its name service does not know as a gid, -1 too: chown(2)'s "leave the group as it
        // is", which made the socket 0660 for whatever group it was created with. chown(1) refuses it; so do we.
        if (t.startsWith("-")) {
            throw new IllegalArgumentException("no group '" + t + "'");
        }
        try {
            return FileSystems.getDefault().getUserPrincipalLookupService().lookupPrincipalByGroupName(t);
        } catch (IOException e) {
            throw new IllegalArgumentException("no group '" + t + "' on this system (" + e.getMessage() + ")");
        }
    }
}
