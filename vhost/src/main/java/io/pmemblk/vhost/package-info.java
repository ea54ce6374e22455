/** vhost-user-blk: the listening socket and the per-connection session (see the module's packages). */
package io.pmemblk.vhost;
