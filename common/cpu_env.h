// cpu_env.h — the conditions every CPU timing runs under: one thread policy, and which kernels
// OpenBLAS (the library the CPU is measured against) actually runs.
// defines: cpu_env_init, cpu_env_describe, blas_core_warning, blas_core_name
//
// Threads. The CPU code has two thread pools: OpenMP's (our loops: norms, attention) and
// OpenBLAS's (the projections). By default libgomp's idle workers spin for a while after each
// parallel region, on the cores OpenBLAS's threads are about to need; on a small or shared
// machine one spinning thread can stall the other pool for a whole time slice, and identical
// runs then differ 2-10x. cpu_env_init sets OMP_WAIT_POLICY=passive (idle OpenMP threads sleep)
// unless the user chose a policy, and gives OpenBLAS as many threads as OpenMP so the two pools
// (never active at the same time: no BLAS call is made inside a parallel region) never ask for
// more cores than there are. libgomp reads OMP_WAIT_POLICY once, when it is loaded, so
// cpu_env_init re-executes the program once with the variable set (one more program start:
// milliseconds, more where the CUDA libraries are linked; skipped for --device cuda).
// OMP_WAIT_POLICY set by the user is kept; LLM_CPU_ENV_DONE=1 skips the re-exec (libgomp's default
// spinning, for comparison: step03_kvcache/results/kv_bench_tiny_cpu_twice.txt).
//
// Kernels. A DYNAMIC_ARCH OpenBLAS picks its kernels for the CPU it finds at load time; in a VM
// or container that hides CPU features, or with OPENBLAS_CORETYPE set, it may run generic SSE
// kernels (core "Prescott", "Core2", ...) at a fraction of the machine's speed. Every table that
// uses the library as a ceiling prints blas_core_warning's line when that happens.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// Call first in main (before any OpenMP region or BLAS call). May re-execute the program.
void cpu_env_init(char **argv);
// One line: "2 OpenMP threads (OMP_WAIT_POLICY=passive) + OpenBLAS 2 threads, core SkylakeX".
const char *cpu_env_describe(void);
// The kernel family OpenBLAS runs (openblas_get_corename), e.g. "SkylakeX", "Haswell", "Prescott".
const char *blas_core_name(void);
// 1 and a one-line warning with the fix in buf when OpenBLAS runs SSE- or AVX-only kernels on a
// CPU that has more (e.g. "Prescott" on an AVX-512 CPU); 0 and buf = "" otherwise.
int blas_core_warning(char *buf, size_t n);

#ifdef __cplusplus
}
#endif
