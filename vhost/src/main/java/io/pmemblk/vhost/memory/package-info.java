/**
 * The guest's RAM as QEMU shares it: an immutable table of mapped regions, looked up by guest-physical address
 * (descriptor buffers) or by QEMU's own virtual address (the ring addresses of SET_VRING_ADDR); the connection's
 * memory table that maps, registers and publishes it; and what keeps it mapped while a request may touch it.
 */
package io.pmemblk.vhost.memory;
