/**
 * The split virtqueue from the device's side (virtio 1.2 section 2.7): the ring layout in guest memory, popping
 * descriptor chains with every check a hostile guest makes necessary, pushing used entries, notification
 * suppression with or without EVENT_IDX, and the vhost-user inflight region that lets a restarted back-end
 * resubmit what the guest is still waiting for.
 */
package io.pmemblk.vhost.virtq;
