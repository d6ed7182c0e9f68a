// cpu_env.c — see cpu_env.h.
#define _GNU_SOURCE
#include "cpu_env.h"

#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

// OpenBLAS's own entry points (declared by its cblas.h; repeated so another CBLAS header builds).
char *openblas_get_corename(void);
char *openblas_get_config(void);
void openblas_set_num_threads(int);
int openblas_get_num_threads(void);

// --device cuda: the CPU pools do no timed work, so the one extra program start is not worth it.
static int gpu_only(char **argv) {
    for (int i = 1; argv[i]; i++)
        if ((!strcmp(argv[i], "--device") && argv[i + 1] && !strcmp(argv[i + 1], "cuda")) || !strcmp(argv[i], "--device=cuda"))
            return 1;
    return 0;
}

static double g_load_at_start = -1;  // 1-minute load average when the program started

void cpu_env_init(char **argv) {
    double l[1];
    if (getloadavg(l, 1) == 1) g_load_at_start = l[0];
    if (!getenv("OMP_WAIT_POLICY") && !getenv("LLM_CPU_ENV_DONE") && !gpu_only(argv)) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        setenv("LLM_CPU_ENV_DONE", "1", 1);  // never loop, whatever exec does
        execv("/proc/self/exe", argv);
        fprintf(stderr, "warning: could not re-execute with OMP_WAIT_POLICY=passive; CPU times may vary between runs\n");
    }
    // As many BLAS threads as OpenMP threads (OMP_NUM_THREADS=1 makes everything single-threaded),
    // unless the user set OpenBLAS's own variable.
    if (!getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(omp_get_max_threads());
}

const char *cpu_env_describe(void) {
    static char buf[512];
    const char *wp = getenv("OMP_WAIT_POLICY");
    int k = snprintf(buf, sizeof buf, "%d OpenMP threads (OMP_WAIT_POLICY=%s) + OpenBLAS %d threads, kernels %s",
                     omp_get_max_threads(), wp ? wp : "unset: active spinning", openblas_get_num_threads(), blas_core_name());
    // Other programs running on the same cores: the one thing no thread policy fixes. Say so.
    // (Measured when the program started, before its own threads count in it.)
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (k > 0 && (size_t)k < sizeof buf && g_load_at_start >= 0 && ncpu > 0)
        snprintf(buf + k, sizeof buf - (size_t)k, "; load average %.2f on %ld CPUs at start%s", g_load_at_start, ncpu,
                 g_load_at_start > 0.5 * (double)ncpu + 0.25 ? ": other programs share the cores, expect a wide spread between runs"
                                                             : "");
    return buf;
}

const char *blas_core_name(void) {
    const char *c = openblas_get_corename();
    return c && *c ? c : "unknown";
}

// Instruction-set level of an OpenBLAS x86 core name: 3 AVX-512, 2 AVX2+FMA, 1 AVX, 0 SSE only,
// -1 a name this table does not know (then nothing is claimed).
static int core_level(const char *c) {
    static const char *const l3[] = {"SkylakeX", "Cooperlake", "Sapphirerapids", NULL};
    static const char *const l2[] = {"Haswell", "Zen", "Excavator", "Skylake", NULL};
    static const char *const l1[] = {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller", NULL};
    static const char *const l0[] = {"Generic", "Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom",
                                     "Katmai", "Coppermine", "Northwood", "Banias", "Opteron", "Barcelona",
                                     "Bobcat", "Nano", "Athlon", NULL};
    const char *const *lv[] = {l0, l1, l2, l3};
    for (int l = 0; l < 4; l++)
        for (const char *const *n = lv[l]; *n; n++)
            if (!strcasecmp(c, *n)) return l;
    return -1;
}

int blas_core_warning(char *buf, size_t n) {
    if (n) buf[0] = 0;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    const int cpu = __builtin_cpu_supports("avx512f")                                        ? 3
                    : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 2
                    : __builtin_cpu_supports("avx")                                          ? 1
                                                                                             : 0;
    const char *core = blas_core_name();
    const int lib = core_level(core);
    // Only SSE- or AVX-only kernels on a CPU with AVX2 (or AVX on an AVX CPU) are "generic": AVX2
    // kernels on an AVX-512 CPU (OpenBLAS's choice on some AMD parts) cost far less and are not reported.
    if (lib < 0 || lib >= cpu || lib >= 2) return 0;
    static const char *const isa[] = {"SSE", "AVX", "AVX2", "AVX-512"};
    static const char *const fix[] = {"", "Sandybridge", "Haswell", "SkylakeX"};
    const char *forced = getenv("OPENBLAS_CORETYPE");
    char how[160];
    if (forced) snprintf(how, sizeof how, "OPENBLAS_CORETYPE=%s is set: unset it or set OPENBLAS_CORETYPE=%s", forced, fix[cpu]);
    else snprintf(how, sizeof how, "run with OPENBLAS_CORETYPE=%s", fix[cpu]);
    snprintf(buf, n,
             "OpenBLAS runs its generic '%s' (%s) kernels but this CPU has %s: the library GEMM, every ceiling "
             "measured with it and every %% of it are too low. Fix: %s, or install a DYNAMIC_ARCH OpenBLAS "
             "(Debian/Ubuntu: libopenblas0-pthread); then rerun build/bin/roofline",
             core, isa[lib], isa[cpu], how);
    return 1;
#else
    return 0;
#endif
}
