/**
 * libc through the FFM API: the one place that binds libc symbols. Callers need no native access of their own;
 * the launcher grants it to this module by name ({@code --enable-native-access=io.pmemblk.posix,...}).
 */
module io.pmemblk.posix {
    exports io.pmemblk.posix;
}
