// Does every vCPU stop using a page's old translation once another thread replaced the mapping?
// The crash this looks for: JVMs died in the QEMU TCG guest with SIGSEGV at wild addresses. A JVM replaces mappings under
// running threads all the time (heap commit and uncommit, code cache, CDS: mmap MAP_FIXED over a live range); the
// kernel shoots the old translation down on every CPU before mmap returns. An emulated TLB that keeps it lets a
// thread read the freed page: stale data, a wild pointer.
//
// The writer maps a fresh page over the same address (MAP_FIXED), stores the next generation number in it, then
// publishes that number (release). Readers on the other CPUs load the published number (acquire) and then the
// page: the page can never hold less than what was published before it was read.
//
// Usage: remap-check SECONDS READERS
// Output: "STALE ..." lines (first 10), RESULT remap.{remaps,reads,stale}=N; exit 1 when any read was stale.
// Build: cc -O2 -pthread -o remap-check remap-check.c
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static volatile uint64_t *page;
static _Atomic uint64_t published;
static _Atomic int stop;
static _Atomic long reads, stale;

static void *reader(void *arg) {
    (void)arg;
    long n = 0, bad = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        uint64_t want = atomic_load_explicit(&published, memory_order_acquire);
        uint64_t got = page[0];
        uint64_t after = atomic_load_explicit(&published, memory_order_acquire);
        n++;
        // 0: a fresh page not written yet. Otherwise the page holds what was published before it was read, or
        // the one generation being written: anything older is an old page, anything newer is not ours at all.
        if (got != 0 && (got < want || got > after + 1)) {
            if (atomic_fetch_add(&stale, 1) < 10)
                printf("STALE read %llu after generation %llu was published (%llu after the read)\n",
                       (unsigned long long)got, (unsigned long long)want, (unsigned long long)after);
            bad++;
        }
    }
    atomic_fetch_add(&reads, n);
    (void)bad;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s SECONDS READERS\n", argv[0]);
        return 2;
    }
    int secs = atoi(argv[1]), n = atoi(argv[2]);
    long ps = sysconf(_SC_PAGESIZE);
    void *base = mmap(NULL, (size_t)ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) { perror("mmap"); return 2; }
    page = base;
    page[0] = 1;
    atomic_store(&published, 1);
    pthread_t *t = calloc((size_t)n, sizeof *t);
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, reader, NULL);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    long remaps = 0;
    for (uint64_t gen = 2;; gen++) {
        // A fresh zero page over the old one (readers see 0 until the store), its number, then publish it.
        void *p = mmap(base, (size_t)ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (p != base) { perror("mmap MAP_FIXED"); return 2; }
        remaps++;
        page[0] = gen;
        atomic_store_explicit(&published, gen, memory_order_release);
        if ((remaps & 255) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec - start.tv_sec >= secs) break;
        }
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    printf("RESULT remap.remaps=%ld\nRESULT remap.reads=%ld\nRESULT remap.stale=%ld\n", remaps, atomic_load(&reads),
           atomic_load(&stale));
    return atomic_load(&stale) == 0 ? 0 : 1;
}
