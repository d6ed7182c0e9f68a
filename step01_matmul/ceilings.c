// ceilings.c — see ceilings.h.
#define _GNU_SOURCE
#include "ceilings.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "table.h"

const char *ceilings_path(void) {
    static char path[4200];
    const char *p = getenv("LLM_CEILINGS");
    if (p && *p) return p;
    if (!path[0]) {
        // build/bin/<program> (or build/tests/run_tests): the file sits in build/, one level up
        char exe[4096];
        const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        char *slash = n > 0 ? (exe[n] = 0, strrchr(exe, '/')) : NULL;
        if (slash) {
            *slash = 0;
            snprintf(path, sizeof path, "%s/../ceilings.json", exe);
            char *real = realpath(exe, NULL);  // print build/ceilings.json, not build/bin/../
            if (real) {
                char *up = strrchr(real, '/');
                if (up && up != real) *up = 0;
                snprintf(path, sizeof path, "%s/ceilings.json", real);
                free(real);
            }
        } else {
            snprintf(path, sizeof path, "build/ceilings.json");
        }
    }
    return path;
}

double ceilings_gemm_tflops(const Ceilings *c, int gpu, const char *dtype, char *note, size_t note_len) {
    if (note && note_len) note[0] = 0;
    if (!gpu) return c->cpu_sgemm_gflops / 1e3;
    if (!strcmp(dtype, "fp32") || !strcmp(dtype, "float32") || !strcmp(dtype, "f32")) return c->gpu_sgemm_tflops;
    if (!strcmp(dtype, "fp16") || !strcmp(dtype, "float16") || !strcmp(dtype, "f16")) return c->gpu_fp16_tflops;
    if (c->gpu_bf16_tflops > 0) return c->gpu_bf16_tflops;
    if (note && note_len)
        snprintf(note, note_len, "%s has no bf16 GEMM ceiling (no bf16 tensor cores before sm_80): the fp16 ceiling is used",
                 c->gpu_name[0] ? c->gpu_name : "this GPU");
    return c->gpu_fp16_tflops;
}

static double num(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : 0.0;
}

static void str(json_t *o, const char *k, char *dst, size_t n) {
    const char *s = json_string_value(json_object_get(o, k));
    snprintf(dst, n, "%s", s ? s : "");
}

int ceilings_load(Ceilings *c) {
    memset(c, 0, sizeof *c);
    json_error_t e;
    json_t *o = json_load_file(ceilings_path(), 0, &e);
    if (!o) return -1;
    if (!json_is_object(o)) {
        json_decref(o);
        return -1;
    }
    str(o, "cpu_name", c->cpu_name, sizeof c->cpu_name);
    c->cpu_threads = (int)num(o, "cpu_threads");
    c->cpu_copy_gbps = num(o, "cpu_copy_gbps");
    c->cpu_read_gbps = num(o, "cpu_read_gbps");
    c->cpu_write_gbps = num(o, "cpu_write_gbps");
    c->cpu_fp32_gflops = num(o, "cpu_fp32_gflops");
    c->cpu_sgemm_gflops = num(o, "cpu_sgemm_gflops");
    str(o, "cpu_blas_core", c->cpu_blas_core, sizeof c->cpu_blas_core);
    str(o, "cpu_blas_warning", c->cpu_blas_warning, sizeof c->cpu_blas_warning);
    str(o, "gpu_name", c->gpu_name, sizeof c->gpu_name);
    c->gpu_copy_gbps = num(o, "gpu_copy_gbps");
    c->gpu_read_gbps = num(o, "gpu_read_gbps");
    c->gpu_write_gbps = num(o, "gpu_write_gbps");
    c->gpu_fp32_tflops = num(o, "gpu_fp32_tflops");
    c->gpu_sgemm_tflops = num(o, "gpu_sgemm_tflops");
    c->gpu_fp16_tflops = num(o, "gpu_fp16_tflops");
    c->gpu_bf16_tflops = num(o, "gpu_bf16_tflops");
    json_decref(o);
    return 0;
}

int ceilings_save(const Ceilings *c) {
    json_t *o = json_object();
    json_object_set_new(o, "cpu_name", json_string(c->cpu_name));
    json_object_set_new(o, "cpu_threads", json_integer(c->cpu_threads));
    json_object_set_new(o, "cpu_copy_gbps", json_real(c->cpu_copy_gbps));
    json_object_set_new(o, "cpu_read_gbps", json_real(c->cpu_read_gbps));
    json_object_set_new(o, "cpu_write_gbps", json_real(c->cpu_write_gbps));
    json_object_set_new(o, "cpu_fp32_gflops", json_real(c->cpu_fp32_gflops));
    json_object_set_new(o, "cpu_sgemm_gflops", json_real(c->cpu_sgemm_gflops));
    json_object_set_new(o, "cpu_blas_core", json_string(c->cpu_blas_core));
    json_object_set_new(o, "cpu_blas_warning", json_string(c->cpu_blas_warning));
    json_object_set_new(o, "gpu_name", json_string(c->gpu_name));
    json_object_set_new(o, "gpu_copy_gbps", json_real(c->gpu_copy_gbps));
    json_object_set_new(o, "gpu_read_gbps", json_real(c->gpu_read_gbps));
    json_object_set_new(o, "gpu_write_gbps", json_real(c->gpu_write_gbps));
    json_object_set_new(o, "gpu_fp32_tflops", json_real(c->gpu_fp32_tflops));
    json_object_set_new(o, "gpu_sgemm_tflops", json_real(c->gpu_sgemm_tflops));
    json_object_set_new(o, "gpu_fp16_tflops", json_real(c->gpu_fp16_tflops));
    json_object_set_new(o, "gpu_bf16_tflops", json_real(c->gpu_bf16_tflops));
    json_object_set_new(o, "commit", json_string(build_commit()));
    int rc = json_dump_file(o, ceilings_path(), JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (rc) fprintf(stderr, "warning: could not write %s\n", ceilings_path());
    return rc;
}
