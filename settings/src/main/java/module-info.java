/** Every setting's key, default, validation and documentation, read from defaults, a file and overrides. */
module io.pmemblk.settings {
    requires transitive io.pmemblk.pmem;
    requires io.pmemblk.posix; // geteuid, for the auto paths

    exports io.pmemblk.settings;
}
