package io.pmemblk.vhost.virtq;

/**
 * The driver broke the virtqueue's rules (a head, index, chain or table virtio 1.2 section 2.7 forbids, or a
 * buffer outside guest memory): the queue stops processing, as virtio allows a device to do
 * (DEVICE_NEEDS_RESET, section 2.1.1), and the message says what was wrong and what is allowed. Made only when a
 * queue breaks, never per request.
 */
public final class BrokenRingException extends Exception {
    private static final long serialVersionUID = 1L;

    public BrokenRingException(String message) {
        super(message, null, false, false);
    }
}
