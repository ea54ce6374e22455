/**
 * Both sides of a split virtqueue and of vhost-user share one layout ({@code io.pmemblk.vhost.spec}); the driver's
 * side of them, as a guest and a vhost-user front end use it ({@code io.pmemblk.vhost.driver}), serves vhost's tests
 * and the host-side vhost load. The back-end (io.pmemblk.vhost) reads only the layouts.
 */
module io.pmemblk.vhost.driver {
    requires transitive io.pmemblk.posix; // the front end's unix socket, SCM_RIGHTS

    exports io.pmemblk.vhost.spec;
    exports io.pmemblk.vhost.driver;
}
