/**
 * virtio-blk over vhost-user: the device's configuration space and features, and one thread per virtqueue
 * that turns the guest's requests into block-layer requests on guest memory (the one copy is guest RAM <-> pmem).
 */
package io.pmemblk.vhost.blk;
