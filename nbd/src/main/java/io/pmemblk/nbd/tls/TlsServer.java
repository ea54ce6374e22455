package io.pmemblk.nbd.tls;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.Signature;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.SSLPeerUnverifiedException;
import javax.net.ssl.TrustManagerFactory;

/**
 * The server's TLS: its X.509 certificate and key, the CA client certificates must chain to (or none), and the
 * whether TLS is required (proto.md "TLS support": FORCEDTLS) or only offered (SELECTIVETLS), all through the JDK's own TLS ({@code SSLEngine}), TLS 1.3 only. Files are PEM, as nbdkit and
 * qemu-nbd take them: the certificate chain (leaf first), a private key in PKCS#8 ({@code BEGIN PRIVATE KEY},
 * what openssl writes) or PKCS#1 RSA ({@code BEGIN RSA PRIVATE KEY}), and one or more CA certificates.
 * Everything is read and checked once, at start-up; a connection only creates its engine.
 */
public final class TlsServer {
    /** TLS 1.3 only: proto.md asks for 1.2 at least; everything that speaks NBD with TLS today does 1.3. */
    static final String[] PROTOCOLS = {"TLSv1.3"};

    /** Null when TLS is off (NOTLS): STARTTLS is refused. */
    private final SSLContext context;
    private final boolean required;
    private final boolean verifyClients;
    private final String subject;

    private TlsServer(SSLContext context, boolean required, boolean verifyClients, String subject) {
        this.context = context;
        this.required = required;
        this.verifyClients = verifyClients;
        this.subject = subject;
    }

    /** No TLS: STARTTLS is refused (NBD_REP_ERR_POLICY). */
    public static TlsServer off() {
        return new TlsServer(null, false, false, "");
    }

    /**
     * Reads and checks the files: TLS offered to every client.
     * @param required FORCEDTLS: every option but STARTTLS and ABORT is answered NBD_REP_ERR_TLS_REQD until TLS
     *                 runs, and NBD_OPT_EXPORT_NAME before it (which cannot be refused) ends the session; false:
     *                 SELECTIVETLS with no TLS-only export, a client may upgrade or go on in plaintext
     * @param clientCa CA certificates client certificates must chain to (every client then needs one), or null
     * @throws IOException naming the setting, the file and what is wrong with it
     */
    public static TlsServer load(boolean required, Path certificate, Path key, Path clientCa) throws IOException {
        List<X509Certificate> chain = certificates(certificate, "nbd.tls.certificate");
        PrivateKey privateKey = privateKey(key, chain.getFirst());
        try {
            KeyStore ks = KeyStore.getInstance("PKCS12");
            ks.load(null, null);
            char[] none = new char[0];
            ks.setKeyEntry("server", privateKey, none, chain.toArray(new Certificate[0]));
            KeyManagerFactory kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
            kmf.init(ks, none);
            TrustManagerFactory tmf = null;
            if (clientCa != null) {
                KeyStore trust = KeyStore.getInstance("PKCS12");
                trust.load(null, null);
                int i = 0;
                for (X509Certificate ca : certificates(clientCa, "nbd.tls.verify-clients")) {
                    trust.setCertificateEntry("ca" + i++, ca);
                }
                tmf = TrustManagerFactory.getInstance("PKIX");
                tmf.init(trust);
            }
            SSLContext ctx = SSLContext.getInstance("TLSv1.3");
            ctx.init(kmf.getKeyManagers(), tmf == null ? null : tmf.getTrustManagers(), null);
            return new TlsServer(ctx, required, clientCa != null, chain.getFirst().getSubjectX500Principal().getName());
        } catch (GeneralSecurityException e) {
            throw new IOException("nbd.tls: the JDK's TLS cannot use " + certificate + " and " + key + ": " + e.getMessage(), e);
        }
    }

    /** Whether STARTTLS is accepted. */
    public boolean offered() {
        return context != null;
    }

    /** Whether a client must run STARTTLS before anything but ABORT. */
    public boolean required() {
        return required;
    }

    public boolean verifiesClients() {
        return verifyClients;
    }

    /** For the start-up line: what the server presents and what it asks of clients. */
    public String describe() {
        return context == null ? "nbd.tls=off"
                : "nbd.tls=" + (required ? "require" : "on") + " (TLS 1.3, certificate " + subject
                + (verifyClients ? ", client certificates required)" : ", no client certificates)");
    }

    /** Runs the server side of a TLS handshake on a connection that just had STARTTLS acknowledged. */
    public TlsChannel start(SocketChannel raw) throws IOException {
        SSLEngine engine = context.createSSLEngine();
        engine.setUseClientMode(false);
        engine.setEnabledProtocols(PROTOCOLS);
        engine.setNeedClientAuth(verifyClients);
        return TlsChannel.handshake(raw, engine);
    }

    /** The subject of the client's certificate, or null when it sent none. */
    public static String clientSubject(TlsChannel t) {
        try {
            Certificate[] c = t.session().getPeerCertificates();
            return c.length == 0 ? null : ((X509Certificate) c[0]).getSubjectX500Principal().getName();
        } catch (SSLPeerUnverifiedException e) {
            return null;
        }
    }

    // ---------------------------------------------------------------------------------------------- PEM

    private static List<X509Certificate> certificates(Path file, String setting) throws IOException {
        byte[] pem = read(file, setting);
        List<X509Certificate> out = new ArrayList<>();
        try {
            for (Certificate c : CertificateFactory.getInstance("X.509").generateCertificates(new ByteArrayInputStream(pem))) {
                out.add((X509Certificate) c);
            }
        } catch (GeneralSecurityException e) {
            throw new IOException(setting + " " + file + ": not a PEM X.509 certificate (" + e.getMessage()
                    + "); allowed: PEM certificates, -----BEGIN CERTIFICATE-----", e);
        }
        if (out.isEmpty()) {
            throw new IOException(setting + " " + file + ": holds no certificate; allowed: PEM certificates,"
                    + " -----BEGIN CERTIFICATE-----");
        }
        return out;
    }

    private static byte[] read(Path file, String setting) throws IOException {
        try {
            return Files.readAllBytes(file);
        } catch (IOException e) {
            throw new IOException(setting + " " + file + ": cannot be read: " + e, e);
        }
    }

    private static PrivateKey privateKey(Path file, X509Certificate leaf) throws IOException {
        String text = new String(read(file, "nbd.tls.key"), StandardCharsets.US_ASCII);
        String convert = "; convert it with: openssl pkcs8 -topk8 -nocrypt -in " + file + " -out KEY.pem";
        byte[] pkcs8;
        if (text.contains("-----BEGIN PRIVATE KEY-----")) {
            pkcs8 = base64Block(text, "PRIVATE KEY", file);
        } else if (text.contains("-----BEGIN RSA PRIVATE KEY-----")) {
            pkcs8 = Der.rsaPkcs1ToPkcs8(base64Block(text, "RSA PRIVATE KEY", file));
        } else if (text.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----")) {
            throw new IOException("nbd.tls.key " + file + ": the key is encrypted and the server cannot ask for a"
                    + " passphrase; store it unencrypted, readable by the server's user only (chmod 600): openssl"
                    + " pkcs8 -in " + file + " -out KEY.pem");
        } else if (text.contains("-----BEGIN EC PRIVATE KEY-----")) {
            throw new IOException("nbd.tls.key " + file + ": SEC1 EC keys are not read" + convert);
        } else {
            throw new IOException("nbd.tls.key " + file + ": no PEM private key found; allowed: -----BEGIN PRIVATE"
                    + " KEY----- (PKCS#8) or -----BEGIN RSA PRIVATE KEY-----");
        }
        String algorithm = leaf.getPublicKey().getAlgorithm();
        PrivateKey key;
        try {
            key = KeyFactory.getInstance(algorithm).generatePrivate(new PKCS8EncodedKeySpec(pkcs8));
        } catch (GeneralSecurityException e) {
            throw new IOException("nbd.tls.key " + file + ": not a " + algorithm + " private key, which the"
                    + " certificate's public key is (" + e.getMessage() + ")", e);
        }
        if (!belongTogether(key, leaf)) {
            throw new IOException("nbd.tls.key " + file + " does not belong to the certificate in nbd.tls.certificate ("
                    + leaf.getSubjectX500Principal().getName() + "): a signature made with it does not verify"
                    + " with the certificate's public key");
        }
        return key;
    }

    /** Signs a few bytes with the key and checks them with the certificate. */
    private static boolean belongTogether(PrivateKey key, X509Certificate cert) {
        String alg = switch (key.getAlgorithm()) {
            case "RSA" -> "SHA256withRSA";
            case "EC" -> "SHA256withECDSA";
            default -> key.getAlgorithm(); // Ed25519, Ed448: the algorithm is its own signature
        };
        try {
            byte[] probe = "pmemblk".getBytes(StandardCharsets.US_ASCII);
            Signature s = Signature.getInstance(alg);
            s.initSign(key);
            s.update(probe);
            byte[] sig = s.sign();
            Signature v = Signature.getInstance(alg);
            v.initVerify(cert.getPublicKey());
            v.update(probe);
            return v.verify(sig);
        } catch (GeneralSecurityException e) {
            return false;
        }
    }

    private static byte[] base64Block(String text, String label, Path file) throws IOException {
        String begin = "-----BEGIN " + label + "-----";
        String end = "-----END " + label + "-----";
        int b = text.indexOf(begin);
        int e = text.indexOf(end, b);
        if (e < 0) {
            throw new IOException("nbd.tls.key " + file + ": '" + begin + "' without '" + end + "'");
        }
        try {
            return Base64.getMimeDecoder().decode(text.substring(b + begin.length(), e));
        } catch (IllegalArgumentException x) {
            throw new IOException("nbd.tls.key " + file + ": the PEM block is not valid base64", x);
        }
    }
}
