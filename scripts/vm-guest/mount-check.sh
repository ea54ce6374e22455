#!/bin/sh
# Scenario "mount", run inside the guest by scripts/vm-test (through scripts/vm).
#   mount-check.sh write   mkfs.ext4 on /dev/vda (the NBD export), files of several sizes, their
#                          sha256 sums stored on the disk and printed as "SUM <hash> <name>"
#   mount-check.sh verify  e2fsck -fn must be clean; every stored sum is checked and printed again
# Lines starting with "RESULT " are read by the host.
set -eu
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
DEV=/dev/vda
MNT=/mnt/disk
SIZES="4K 64K 1M 8M 32M"

[ -b "$DEV" ] || { echo "no $DEV: the NBD export is not attached"; exit 2; }
mkdir -p "$MNT"

case "${1:-}" in
write)
    mkfs.ext4 -q -F "$DEV"
    mount "$DEV" "$MNT"
    for s in $SIZES; do head -c "$s" /dev/urandom >"$MNT/file-$s"; done
    (cd "$MNT" && sha256sum file-* >SHA256SUMS)
    sed 's/^/SUM /' "$MNT/SHA256SUMS"
    umount "$MNT"
    # shellcheck disable=SC2086 # counts the words
    result written "$(set -- $SIZES; echo $#)"
    ;;
verify)
    # -n: read-only check; exit 0 only when the filesystem is clean.
    if e2fsck -fn "$DEV" >/tmp/fsck.out 2>&1; then
        result fsck clean
    else
        cat /tmp/fsck.out
        result fsck dirty
        exit 1
    fi
    mount -o ro "$DEV" "$MNT"
    sed 's/^/SUM /' "$MNT/SHA256SUMS"
    (cd "$MNT" && sha256sum -c --quiet SHA256SUMS)
    result verified "$(wc -l <"$MNT/SHA256SUMS")"
    umount "$MNT"
    ;;
*)
    echo "usage: mount-check.sh write|verify" >&2
    exit 2
    ;;
esac
