package io.pmemblk.settings;

/** A setting that cannot be used: the message is one line naming the key, the value given and what is allowed. */
public final class SettingsException extends Exception {
    private static final long serialVersionUID = 1L;

    public SettingsException(String message) {
        super(message);
    }
}
