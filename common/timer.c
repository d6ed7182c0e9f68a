// timer.c — see timer.h.
#define _POSIX_C_SOURCE 200809L
#include "timer.h"

#include <stdlib.h>
#include <time.h>

double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double median_d(double *v, int n) {
    if (n <= 0) return 0.0;
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return (n % 2) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

TimeStats time_stats(double *v, int n) {
    TimeStats s = {0, 0, 0, 0, 0, n};
    if (n <= 0) return s;
    s.median = median_d(v, n);  // sorts v
    s.min = v[0];
    s.max = v[n - 1];
    s.p10 = v[(int)(0.1 * (n - 1) + 0.5)];
    s.p90 = v[(int)(0.9 * (n - 1) + 0.5)];
    return s;
}

TimeStats bench_cpu_stats(void (*fn)(void *ctx), void *ctx, int warmup, int reps) {
    if (reps < 1) reps = 1;
    if (reps > 1000) reps = 1000;
    for (int i = 0; i < warmup; i++) fn(ctx);
    double t[1000];
    for (int i = 0; i < reps; i++) {
        double t0 = now_sec();
        fn(ctx);
        t[i] = now_sec() - t0;
    }
    return time_stats(t, reps);
}

double bench_cpu(void (*fn)(void *ctx), void *ctx, int warmup, int reps) {
    return bench_cpu_stats(fn, ctx, warmup, reps).median;
}
