// ceilings.c — see ceilings.h.
#include "ceilings.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "table.h"

const char *ceilings_path(void) {
    const char *p = getenv("LLM_CEILINGS");
    return p && *p ? p : "build/ceilings.json";
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
