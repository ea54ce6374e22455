/** Every setting's key, default, validation and documentation, read from defaults, a file and overrides. */
module io.pmemblk.settings {
    requires transitive io.pmemblk.pmem;

    exports io.pmemblk.settings;
}
