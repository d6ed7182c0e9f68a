// timer.h — wall-clock timing and the median-of-N benchmark loop for CPU code.
// defines: now_sec, median_d, TimeStats, time_stats, bench_cpu, bench_cpu_stats
// GPU code is timed with CUDA events instead: see gpu.h (gpu_bench).
#pragma once
#ifdef __cplusplus
extern "C" {
#endif

// Monotonic wall clock in seconds.
double now_sec(void);

// Median of n values (the array is sorted in place).
double median_d(double *v, int n);

// Run fn(ctx) `warmup` times untimed, then `reps` times timed one by one;
// return the median time of one call in seconds. reps is clamped to [1, 1000].
double bench_cpu(void (*fn)(void *ctx), void *ctx, int warmup, int reps);

// The spread of n timings, printed next to every median: min, 10th percentile, median, 90th
// percentile, max (nearest-rank; the array is sorted in place). n = 0 gives all zeros.
typedef struct {
    double min, p10, median, p90, max;
    int n;
} TimeStats;
TimeStats time_stats(double *v, int n);
// bench_cpu with the spread: seconds per call.
TimeStats bench_cpu_stats(void (*fn)(void *ctx), void *ctx, int warmup, int reps);

#ifdef __cplusplus
}
#endif
