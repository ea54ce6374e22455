import sys
p='pmem-blk/src/main/java/io/pmemblk/pmem/PmemRegion.java'
s=open(p).read()
M={
'M1_writer_does_not_drain_flush_drains':[('''        if (isPmem) {
            persistence.drain();
        } else {
            dirty = true; // after''','''        if (isPmem) {
            // MUTATION: NT stores left undrained; FUA and FLUSH drain on their own thread (the old design)
        } else {
            dirty = true; // after'''),('''        if (!isPmem) {
            sync(offset, length);
        }''','''        if (!isPmem) {
            sync(offset, length);
        } else {
            persistence.drain();
        }''')],
'M2_no_drain_after_nt_copy':[('''        if (isPmem) {
            persistence.drain();
        } else {
            dirty = true; // after''','''        if (isPmem) {
            // MUTATION: no drain
        } else {
            dirty = true; // after''')],
'M3_no_writeback_for_device_writes':[('''        if (isPmem) {
            persistence.writeBack(range);
            persistence.drain();
        } else {
            dirty = true;''','''        if (isPmem) {
            persistence.drain(); // MUTATION: no write-back
        } else {
            dirty = true;''')],
'M4_no_msync_for_fua':[('''        if (!isPmem) {
            sync(offset, length);
        }''','''        if (!isPmem) {
            // MUTATION: no msync
        }''')],
'M5_flush_does_not_msync':[('''            sync(0, memory.byteSize());''','''            if (false) sync(0, memory.byteSize()); // MUTATION: no msync''')],
'M6_no_msync_for_fua_device_writes':[('''            if (fua) {
                sync(offset, length);
            }''','''            // MUTATION: no msync for FUA''')],
'M7_failed_msync_not_kept':[('''                writeBackFailure = "write-back "''','''                String notKept = "write-back "'''),('''            first = writeBackFailure;''','''            first = "MUTATION: the failure is not kept";''')],
'M10_no_sync_at_start':[('''            r.syncAtStart();''','''            // MUTATION: r.syncAtStart();''')],
'M8_no_fsync_after_create':[('''                r.persistence.syncCreated(path);''','''                if (false) r.persistence.syncCreated(path); // MUTATION: no fsync''')],
'M9_device_writes_not_drained':[('''        if (isPmem) {
            persistence.writeBack(range);
            persistence.drain();
        } else {
            dirty = true;''','''        if (isPmem) {
            persistence.writeBack(range); // MUTATION: no drain
        } else {
            dirty = true;''')],
}
for a,b in M[sys.argv[1]]:
    assert s.count(a)==1, (sys.argv[1], a)
    s=s.replace(a,b)
open(p,'w').write(s)
