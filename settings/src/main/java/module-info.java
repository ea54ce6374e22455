/** Every setting's key, default, validation and documentation, read from defaults, a file and overrides. */
module io.pmemblk.settings {
    requires io.pmemblk.posix; // geteuid, for the auto paths

    exports io.pmemblk.settings;
}
