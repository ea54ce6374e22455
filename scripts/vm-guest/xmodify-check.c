/* HotSpot's patch of a compiled method's verified entry (NativeJump::patch_verified_entry on x86_64: a 2x "jmp
 * self" word, then byte 4, then bytes 0-3 of a 5-byte jmp, each store atomic), done over and over by one thread
 * while another keeps calling the patched entry. Legal cross-modifying code on x86 hardware: every state the
 * executing CPU can fetch is a whole old or new instruction (or the spin). Returns are 1 (old code) or 2 (jumped
 * to the stub); anything else, a SIGSEGV or a SIGILL is an instruction fetched torn. Usage: xmodify SECONDS */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static volatile int stop;
static uint8_t *code;          /* entry at code + 64 (16-aligned: the 4-byte word stays in one cache line) */
static const uint8_t old_entry[8] = {0x89, 0x84, 0x24, 0x00, 0xff, 0xff, 0xff, 0x90}; /* mov %eax,-0x100(%rsp); nop */
static uint8_t new_entry[5];   /* jmp stub */
static unsigned long patches;

static void store32(uint8_t *p, const uint8_t *v) { uint32_t w; memcpy(&w, v, 4); __atomic_store_n((uint32_t *)p, w, __ATOMIC_SEQ_CST); }
static void store8(uint8_t *p, uint8_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }

/* patch the 5 bytes at e to v, HotSpot's way */
static void patch(uint8_t *e, const uint8_t *v) {
    static const uint8_t spin[4] = {0xeb, 0xfe, 0xeb, 0xfe};
    store32(e, spin);
    store8(e + 4, v[4]);
    store32(e, v);
}

static void *patcher(void *arg) {
    (void)arg;
    while (!stop) {
        patch(code + 64, new_entry);
        for (volatile int d = 0; d < 200; d++) { } /* dwell: let the caller run the new code too */
        patch(code + 64, old_entry);
        for (volatile int d = 0; d < 200; d++) { }
        patches += 2;
    }
    return NULL;
}

static void on_fault(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    char msg[160];
    int n = snprintf(msg, sizeof msg, "RESULT xmodify.fault=%s addr=%p after %lu patches\n",
                     sig == SIGSEGV ? "SIGSEGV" : sig == SIGILL ? "SIGILL" : "SIGBUS", si->si_addr, patches);
    write(1, msg, n);
    _exit(3);
}

int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 10;
    struct sigaction sa = {0};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL); sigaction(SIGILL, &sa, NULL); sigaction(SIGBUS, &sa, NULL);
    code = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) { perror("mmap"); return 2; }
    memset(code, 0xcc, 4096);
    /* entry: old_entry, then mov $1,%eax; ret.  stub at +128: mov $2,%eax; ret */
    memcpy(code + 64, old_entry, 8);
    const uint8_t ret1[6] = {0xb8, 1, 0, 0, 0, 0xc3}, ret2[6] = {0xb8, 2, 0, 0, 0, 0xc3};
    memcpy(code + 72, ret1, 6);
    memcpy(code + 128, ret2, 6);
    int32_t rel = (int32_t)((code + 128) - (code + 64 + 5));
    new_entry[0] = 0xe9; memcpy(new_entry + 1, &rel, 4);
    int (*entry)(void) = (int (*)(void))(code + 64);
    pthread_t t;
    pthread_create(&t, NULL, patcher, NULL);
    time_t end = time(NULL) + seconds;
    unsigned long calls = 0, bad = 0, ones = 0, twos = 0;
    while (time(NULL) < end) {
        for (int i = 0; i < 100000; i++) {
            int r = entry();
            if (r == 1) ones++; else if (r == 2) twos++; else bad++;
        }
        calls += 100000;
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("RESULT xmodify.calls=%lu old=%lu new=%lu bad=%lu patches=%lu fault=none\n", calls, ones, twos, bad, patches);
    return bad ? 1 : 0;
}
