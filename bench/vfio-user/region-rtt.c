/*
 * What one vfio-user register write costs between two processes, client side, without pmemblk's client in the
 * way (docs/performance.md, "The peer at its best, and the DMA device in a process of its own"): N REGION_WRITEs of
 * 4 bytes on one unix socket, each waiting for its reply (a round trip), then N more with No_reply (posted, as
 * pmemblk's doorbell goes), closed by one REGION_READ that comes back only after the server took them all. The
 * first pass warms both sides; the second is printed. Message layouts: QEMU's docs/interop/vfio-user.rst
 * ("Header", VFIO_USER_VERSION = 1, VFIO_USER_REGION_READ = 9, VFIO_USER_REGION_WRITE = 10).
 *
 *   gcc -O2 -Wall -o /tmp/region-rtt bench/vfio-user/region-rtt.c
 *   pmemblk dma-device --socket /tmp/d.sock --channels 1 &  /tmp/region-rtt /tmp/d.sock 20000 0 0x98
 *   ~/.cache/libvfio-user-efd091b/bin/gpio-pci-idio-16 /tmp/g.sock &  /tmp/region-rtt /tmp/g.sock 20000 2 0
 *
 * Arguments: SOCKET N [REGION [OFFSET]] (default region 2, offset 0: libvfio-user's gpio sample's BAR2; for
 * pmemblk dma-device, BAR0 is region 0 and 0x98 is channel 0's CHANCMP, which an unstarted channel only stores).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

struct hdr { uint16_t id, cmd; uint32_t size, flags, err; } __attribute__((packed));
struct acc { uint64_t off; uint32_t region, count; } __attribute__((packed));
enum { VERSION = 1, REGION_READ = 9, REGION_WRITE = 10, F_NO_REPLY = 0x10, F_ERROR = 0x20 };

static int fd;

static void send_all(const void *b, size_t n) {
    const char *p = b;
    while (n) {
        ssize_t r = send(fd, p, n, 0);
        if (r <= 0) { perror("send"); exit(1); }
        p += r; n -= (size_t)r;
    }
}

static void recv_all(void *b, size_t n) {
    char *p = b;
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r <= 0) { perror("recv"); exit(1); }
        p += r; n -= (size_t)r;
    }
}

/* Reads one reply; an error reply ends the run (the figures would be of refusals). */
static void reply(void) {
    struct hdr h;
    char buf[4096];
    recv_all(&h, sizeof h);
    if (h.size < sizeof h || h.size - sizeof h > sizeof buf) { fprintf(stderr, "reply of %u bytes\n", h.size); exit(1); }
    recv_all(buf, h.size - sizeof h);
    if (h.flags & F_ERROR) { fprintf(stderr, "error reply to command %u: errno %u\n", h.cmd, h.err); exit(1); }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s SOCKET N [REGION [OFFSET]]\n", argv[0]); return 2; }
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    long n = atol(argv[2]);
    uint32_t region = argc > 3 ? (uint32_t)atoi(argv[3]) : 2;
    uint64_t off = argc > 4 ? strtoull(argv[4], 0, 0) : 0;
    strncpy(a.sun_path, argv[1], sizeof a.sun_path - 1);
    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (connect(fd, (void *)&a, sizeof a)) { perror("connect"); return 1; }

    const char *caps = "{\"capabilities\":{\"max_msg_fds\":8}}";
    struct { struct hdr h; uint16_t major, minor; char json[64]; } __attribute__((packed)) v = {0};
    v.h.cmd = VERSION;
    v.h.size = (uint32_t)(sizeof v.h + 4 + strlen(caps) + 1);
    v.minor = 2;
    strcpy(v.json, caps);
    send_all(&v, v.h.size);
    reply();

    struct { struct hdr h; struct acc a; uint32_t data; } __attribute__((packed)) w = {0};
    w.h.cmd = REGION_WRITE; w.h.size = sizeof w; w.a.region = region; w.a.off = off; w.a.count = 4;
    struct { struct hdr h; struct acc a; } __attribute__((packed)) r = {0};
    r.h.cmd = REGION_READ; r.h.size = sizeof r; r.a.region = region; r.a.off = off; r.a.count = 4;
    for (int pass = 0; pass < 2; pass++) {
        double t0 = now();
        for (long i = 0; i < n; i++) { w.h.id = (uint16_t)i; w.data = (uint32_t)i; send_all(&w, sizeof w); reply(); }
        double waited = (now() - t0) / n * 1e9;
        t0 = now();
        w.h.flags = F_NO_REPLY;
        for (long i = 0; i < n; i++) { w.h.id = (uint16_t)i; w.data = (uint32_t)i; send_all(&w, sizeof w); }
        w.h.flags = 0;
        send_all(&r, sizeof r);
        reply();
        double posted = (now() - t0) / n * 1e9;
        if (pass == 1)
            printf("REGION_WRITE (4 bytes) with reply: %.0f ns each; with No_reply: %.0f ns each (%ld writes)\n",
                   waited, posted, n);
    }
    return 0;
}
