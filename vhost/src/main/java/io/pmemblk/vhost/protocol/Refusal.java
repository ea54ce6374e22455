package io.pmemblk.vhost.protocol;

/**
 * A message refused: answered with a REPLY_ACK failure when the front-end asked for one, else the connection
 * closes. The message names the field, its value and what is allowed.
 */
public final class Refusal extends Exception {
    private static final long serialVersionUID = 1L;

    public Refusal(String message) {
        super(message, null, false, false);
    }
}
