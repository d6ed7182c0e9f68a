// test_common.c — the infrastructure every step relies on: RNG, error metrics, .npy, tables.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compare.h"
#include "gpu.h"
#include "npy.h"
#include "rng.h"
#include "table.h"
#include "timer.h"

Test(common, rng_is_seeded_and_reproducible) {
    Rng a, b, c;
    rng_seed(&a, 42);
    rng_seed(&b, 42);
    rng_seed(&c, 43);
    int same_ab = 1, same_ac = 1;
    for (int i = 0; i < 1000; i++) {
        uint32_t x = rng_u32(&a), y = rng_u32(&b), z = rng_u32(&c);
        same_ab &= (x == y);
        same_ac &= (x == z);
    }
    cr_assert(same_ab, "same seed must give the same stream");
    cr_assert(!same_ac, "different seeds must give different streams");
}

Test(common, rng_uniform_and_normal_moments) {
    Rng r;
    rng_seed(&r, 7);
    enum { N = 200000 };
    double su = 0, sn = 0, sn2 = 0;
    float lo = 1, hi = 0;
    for (int i = 0; i < N; i++) {
        float u = rng_uniform(&r);
        if (u < lo) lo = u;
        if (u > hi) hi = u;
        su += u;
        float z = rng_normal(&r);
        sn += z;
        sn2 += (double)z * z;
    }
    cr_assert(lo >= 0.0f && hi < 1.0f);
    cr_assert_float_eq(su / N, 0.5, 0.01);
    cr_assert_float_eq(sn / N, 0.0, 0.01);
    cr_assert_float_eq(sn2 / N, 1.0, 0.02);
}

Test(common, compare_detects_errors_and_nan) {
    float ref[4] = {1, -2, 4, 0.5f}, out[4];
    memcpy(out, ref, sizeof ref);
    ErrStats s = compare_f32(out, ref, 4);
    cr_assert_eq(s.max_abs, 0.0);
    out[2] = 4.4f;  // error 0.4 against max |ref| 4
    s = compare_f32(out, ref, 4);
    cr_assert_float_eq(s.max_rel, 0.1, 1e-6);
    cr_assert_eq(s.worst, 2);
    out[1] = NAN;
    s = compare_f32(out, ref, 4);
    cr_assert(isinf(s.max_rel) && s.n_bad == 1, "a NaN must never pass");
}

Test(common, npy_roundtrip_f32) {
    char path[] = "/tmp/test_npy_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    float x[6] = {1.5f, -2, 3, 4, 5e-3f, 6e7f};
    size_t shape[2] = {2, 3};
    cr_assert_eq(npy_save_f32(path, x, 2, shape), 0);
    NpyArray a;
    cr_assert_eq(npy_load(path, &a), 0);
    cr_assert_str_eq(a.dtype, "<f4");
    cr_assert_eq(a.ndim, 2);
    cr_assert_eq(a.shape[0], 2);
    cr_assert_eq(a.shape[1], 3);
    cr_assert_eq(memcmp(a.data, x, sizeof x), 0);
    npy_free(&a);
    // A truncated file is an error, not a crash.
    FILE *f = fopen(path, "r+b");
    cr_assert(f);
    cr_assert_eq(ftruncate(fileno(f), 90), 0);
    fclose(f);
    cr_assert_eq(npy_load(path, &a), -1);
    unlink(path);
}

Test(common, table_csv_and_json) {
    Table *t = table_new("demo");
    table_meta(t, "device", "%s", "cpu, \"test\"");
    table_col(t, "version", NULL);
    table_col(t, "ms", "%.2f");
    table_row(t);
    table_str(t, "version", "naive");
    table_num(t, "ms", 12.345);
    table_row(t);
    table_str(t, "version", "fast,er");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    table_print(t, FMT_CSV, f);
    fclose(f);
    cr_assert(strstr(buf, "version,ms\nnaive,12.345\n\"fast,er\",\n"), "csv was:\n%s", buf);
    free(buf);
    f = open_memstream(&buf, &len);
    table_print(t, FMT_JSON, f);
    fclose(f);
    cr_assert(strstr(buf, "\"ms\": null"), "unset number must be null in JSON:\n%s", buf);
    cr_assert(strstr(buf, "\"device\": \"cpu, \\\"test\\\"\""), "json was:\n%s", buf);
    free(buf);
    cr_assert_float_eq(table_get_num(t, 0, "ms"), 12.345, 1e-12);
    table_free(t);
}

// kv_bench on a quantized model on the GPU prints over 32 meta lines (the standard ones, every
// ladder, the quantization's); the table must keep them all, in order.
Test(common, table_keeps_a_hundred_meta_lines) {
    Table *t = table_new("many");
    for (int i = 0; i < 100; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%d", i);
        table_meta(t, key, "v%d", i);
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    table_print(t, FMT_CSV, f);
    fclose(f);
    cr_assert(strstr(buf, "# k0: v0\n") && strstr(buf, "# k99: v99\n") && strstr(buf, "k98") < strstr(buf, "k99"),
              "csv was:\n%.400s", buf);
    free(buf);
    table_free(t);
}

Test(common, median) {
    double v[5] = {5, 1, 4, 2, 3};
    cr_assert_eq(median_d(v, 5), 3.0);
    double w[4] = {4, 1, 3, 2};
    cr_assert_eq(median_d(w, 4), 2.5);
}

Test(common, gpu_info_reports_a_reason_when_absent) {
    GpuInfo g;
    if (gpu_info(&g) == 0) {
        cr_assert(g.cc_major >= 3 && g.sms > 0 && g.name[0], "device info must be filled");
    } else {
        cr_assert(g.reason[0], "no device must come with a reason");
    }
}
