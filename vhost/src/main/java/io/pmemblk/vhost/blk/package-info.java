/**
 * virtio-blk over vhost-user: the device's configuration space and features, and one thread per virtqueue
 * ({@link io.pmemblk.vhost.blk.VhostBlkQueue}) that turns the guest's requests into block-layer requests on guest
 * memory ({@link io.pmemblk.vhost.blk.BlkRequests}) and answers them ({@link io.pmemblk.vhost.blk.BlkAnswers});
 * the one copy is guest RAM <-> pmem.
 */
package io.pmemblk.vhost.blk;
