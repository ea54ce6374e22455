// Does the (emulated) CPU keep a thread's vector registers across preemption and signal delivery?
// The crash this looks for: JVMs died in the QEMU TCG guest with SIGSEGV at wild addresses. The JIT keeps data in
// vector registers (array copies, string intrinsics move 32-byte blocks through ymm); if a context switch or a
// signal's save/restore (XSAVE/XRSTOR of the AVX state) loses the upper halves, copied references become garbage.
//
// Each thread loads 15 vector registers with its own pattern, spins on integers only (where the kernel preempts
// it and delivers signals), and compares every register with its pattern, again and again. Any difference is
// printed (thread, register, the 64-bit lanes seen and wanted) and counted.
//
// Usage: vector-state-check SECONDS THREADS ymm|xmm SIGNALS_PER_SECOND
//   ymm: 256-bit AVX registers (the upper halves are what XSAVE's AVX component holds); xmm: 128-bit SSE only.
//   A SIGALRM handler that itself writes the vector registers (as glibc's memset does) runs at the given rate.
// Output: "RESULT vector.{mode,threads,checks,bad_checks}=..." and "BAD ..." lines; exit 1 when any check failed.
// Build: cc -O2 -pthread -o vector-state-check vector-state-check.c (no -mavx needed: the AVX code is inline asm).
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int use_ymm;
static volatile int stop;
static volatile long total_checks, total_bad;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

struct worker {
    int id;
    uint64_t pattern[16][4] __attribute__((aligned(32)));
    uint64_t seen[16][4] __attribute__((aligned(32)));
};

// Loads ymm1..15 (or xmm1..15) from pattern, then `rounds` times: spin, compare each register with its pattern.
// Returns 0 after all rounds, or the number (1..15) of the first register that differed, with all registers
// stored in seen at that moment.
// One asm block for both register files: LOAD, CHECK and STORE (defined before each use) say how one register is
// loaded, compared with its pattern and saved; TAIL ends the block (vzeroupper after AVX code).
#define EACH_REGISTER(M) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)
#define ROUNDS_ASM(TAIL)                                                                                          \
    __asm__ volatile(                                                                                             \
        EACH_REGISTER(LOAD)                                                                                       \
        "1:\n\t"                                                                                                  \
        "mov %[spin], %%rdx\n\t"                                                                                  \
        "2: dec %%rdx\n\t jnz 2b\n\t"                                                                            \
        EACH_REGISTER(CHECK)                                                                                      \
        "dec %[rounds]\n\t jnz 1b\n\t"                                                                           \
        "xor %[bad], %[bad]\n\t jmp 4f\n\t"                                                                      \
        "3:\n\t"                                                                                                  \
        EACH_REGISTER(STORE)                                                                                      \
        "4:\n\t" TAIL                                                                                             \
        : [bad] "=&r"(bad), [rounds] "+r"(rounds)                                                                 \
        : [p] "r"(w->pattern), [s] "r"(w->seen), [spin] "r"(spin)                                                 \
        : "rax", "rdx", "cc", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",   \
          "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15")

static long run_rounds(struct worker *w, long rounds, long spin) {
    long bad;
    if (use_ymm) {
#define LOAD(r) "vmovdqa " #r "*32(%[p]), %%ymm" #r "\n\t"
#define CHECK(r) "vpcmpeqq " #r "*32(%[p]), %%ymm" #r ", %%ymm0\n\t vpmovmskb %%ymm0, %%eax\n\t" \
                 "mov $" #r ", %[bad]\n\t cmp $-1, %%eax\n\t jne 3f\n\t"
#define STORE(r) "vmovdqa %%ymm" #r ", " #r "*32(%[s])\n\t"
        ROUNDS_ASM("vzeroupper\n\t");
#undef LOAD
#undef CHECK
#undef STORE
    } else {
#define LOAD(r) "movdqa " #r "*32(%[p]), %%xmm" #r "\n\t"
#define CHECK(r) "movdqa %%xmm" #r ", %%xmm0\n\t pcmpeqd " #r "*32(%[p]), %%xmm0\n\t pmovmskb %%xmm0, %%eax\n\t" \
                 "mov $" #r ", %[bad]\n\t cmp $0xffff, %%eax\n\t jne 3f\n\t"
#define STORE(r) "movdqa %%xmm" #r ", " #r "*32(%[s])\n\t"
        ROUNDS_ASM("");
#undef LOAD
#undef CHECK
#undef STORE
    }
    return bad;
}

static void *work(void *arg) {
    struct worker *w = arg;
    long checks = 0, bad = 0;
    sigset_t alrm;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    pthread_sigmask(SIG_UNBLOCK, &alrm, NULL);
    int lanes = use_ymm ? 4 : 2;
    for (int r = 0; r < 16; r++)
        for (int l = 0; l < 4; l++)
            w->pattern[r][l] = 0x5a5a000000000000ull ^ ((uint64_t)w->id << 40) ^ ((uint64_t)r << 8) ^ (uint64_t)l
                               ^ ((uint64_t)(r * 4 + l) * 0x9e3779b97f4a7c15ull >> 24);
    while (!stop) {
        long reg = run_rounds(w, 1000, 2000);
        checks += 1000;
        if (reg != 0) {
            bad++;
            pthread_mutex_lock(&out_lock);
            for (int r = 1; r < 16; r++) {
                if (memcmp(w->seen[r], w->pattern[r], (size_t)lanes * 8) == 0) continue;
                printf("BAD thread %d %s%d: seen", w->id, use_ymm ? "ymm" : "xmm", r);
                for (int l = 0; l < lanes; l++) printf(" %016llx", (unsigned long long)w->seen[r][l]);
                printf(" want");
                for (int l = 0; l < lanes; l++) printf(" %016llx", (unsigned long long)w->pattern[r][l]);
                printf("\n");
            }
            fflush(stdout);
            pthread_mutex_unlock(&out_lock);
        }
    }
    __sync_fetch_and_add(&total_checks, checks);
    __sync_fetch_and_add(&total_bad, bad);
    return NULL;
}

// The handler dirties the vector registers: the kernel must restore the interrupted thread's from the signal frame.
static volatile long handled;
static void on_alarm(int sig) {
    (void)sig;
    __sync_fetch_and_add(&handled, 1);
    if (use_ymm) {
        __asm__ volatile("vpcmpeqd %%ymm1, %%ymm1, %%ymm1\n\t vmovdqa %%ymm1, %%ymm2\n\t vmovdqa %%ymm1, %%ymm9\n\t"
                         "vmovdqa %%ymm1, %%ymm15\n\t vzeroupper" ::: "xmm1", "xmm2", "xmm9", "xmm15");
    } else {
        __asm__ volatile("pcmpeqd %%xmm1, %%xmm1\n\t movdqa %%xmm1, %%xmm2\n\t movdqa %%xmm1, %%xmm9\n\t"
                         "movdqa %%xmm1, %%xmm15" ::: "xmm1", "xmm2", "xmm9", "xmm15");
    }
}

int main(int argc, char **argv) {
    if (argc != 5 || (strcmp(argv[3], "ymm") != 0 && strcmp(argv[3], "xmm") != 0)) {
        fprintf(stderr, "usage: %s SECONDS THREADS ymm|xmm SIGNALS_PER_SECOND\n", argv[0]);
        return 2;
    }
    int secs = atoi(argv[1]), n = atoi(argv[2]), hz = atoi(argv[4]);
    use_ymm = strcmp(argv[3], "ymm") == 0;
    if (use_ymm && !__builtin_cpu_supports("avx2")) {
        printf("RESULT vector.mode=ymm-unsupported\n");
        return 0;
    }
    if (hz > 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_alarm;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGALRM, &sa, NULL);
        struct itimerval it = {{0, 1000000 / hz}, {0, 1000000 / hz}};
        setitimer(ITIMER_REAL, &it, NULL);
    }
    // The alarm is for the workers, not for this thread's sleep (the kernel would pick it first): block it here
    // while the workers are created (they inherit the mask), then unblock it in each worker.
    sigset_t alrm;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &alrm, NULL);
    struct worker *w = aligned_alloc(64, sizeof(struct worker) * (size_t)n);
    pthread_t *t = calloc((size_t)n, sizeof *t);
    for (int i = 0; i < n; i++) {
        w[i].id = i + 1;
        pthread_create(&t[i], NULL, work, &w[i]);
    }
    // SIGALRM may land on this thread and cut a sleep short: sleep until the deadline.
    struct timespec end, now;
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += secs;
    do {
        struct timespec d = {0, 100000000};
        nanosleep(&d, NULL);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (now.tv_sec < end.tv_sec || (now.tv_sec == end.tv_sec && now.tv_nsec < end.tv_nsec));
    stop = 1;
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    printf("RESULT vector.mode=%s\nRESULT vector.threads=%d\nRESULT vector.signals_per_second=%d\n"
           "RESULT vector.signals_handled=%ld\nRESULT vector.checks=%ld\nRESULT vector.bad_checks=%ld\n", argv[3], n, hz,
           handled, total_checks, total_bad);
    return total_bad == 0 ? 0 : 1;
}
