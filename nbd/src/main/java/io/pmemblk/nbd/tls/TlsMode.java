package io.pmemblk.nbd.tls;

/** How a server treats {@code NBD_OPT_STARTTLS} (proto.md, "TLS support": the three server modes). */
public enum TlsMode {
    /** NOTLS: STARTTLS is refused with NBD_REP_ERR_POLICY. */
    OFF,
    /** SELECTIVETLS with the export not TLS-only: a client may upgrade, or go on in plaintext. */
    ON,
    /**
     * FORCEDTLS: every option but STARTTLS and ABORT is answered NBD_REP_ERR_TLS_REQD until TLS runs, and
     * NBD_OPT_EXPORT_NAME before it (which cannot be refused) ends the session.
     */
    REQUIRE
}
