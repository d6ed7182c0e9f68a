// golden_util.c — the checkpoints, goldens and vLLM's rule of golden_util.h.
#include "golden_util.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int ckpt_list(Ckpt *out, int max, const char *need) {
    DIR *d = opendir(MODELS_DIR);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        char p[600];
        struct stat st;
        if (e->d_name[0] == '.' || strlen(e->d_name) > 200) continue;
        snprintf(p, sizeof p, "%s/%s/%.300s", MODELS_DIR, e->d_name, need);
        if (stat(p, &st) != 0) continue;
        snprintf(out[n].dir, sizeof out[n].dir, "%s/%s", MODELS_DIR, e->d_name);
        snprintf(out[n].name, sizeof out[n].name, "%s", e->d_name);
        snprintf(p, sizeof p, "%s/%s/goldens/greedy.json", MODELS_DIR, e->d_name);
        out[n].has_golden = stat(p, &st) == 0;
        n++;
    }
    closedir(d);
    for (int i = 1; i < n; i++)  // insertion sort by name
        for (int j = i; j > 0 && strcmp(out[j - 1].name, out[j].name) > 0; j--) {
            Ckpt t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    // TEST_MODELS=name[,name...]: only these checkpoints (tools/gpu_sanitize.sh sets it for
    // racecheck, whose instrumentation makes one model's worth of kernels take minutes)
    const char *only = getenv("TEST_MODELS");
    if (only && *only) {
        int m = 0;
        for (int i = 0; i < n; i++) {
            const char *p = only;
            const size_t len = strlen(out[i].name);
            int keep = 0;
            while (*p && !keep) {
                const size_t w = strcspn(p, ",");
                keep = w == len && strncmp(p, out[i].name, w) == 0;
                p += w + (p[w] == ',');
            }
            if (keep) out[m++] = out[i];
        }
        fprintf(stderr, "[models] TEST_MODELS=%s: %d of %d checkpoints\n", only, m, n);
        n = m;
    }
    return n;
}

int golden_read(const char *dir, Golden *g, int required) {
    char p[700];
    snprintf(p, sizeof p, "%.300s/goldens/greedy.json", dir);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    if (!j && !required) return 0;
    cr_assert(j, "%s: %s", p, je.text);
    const json_t *pid = json_object_get(j, "prompt_ids"), *gen = json_object_get(j, "generated_ids");
    const json_t *t5 = json_object_get(j, "top5_ids");
    cr_assert(json_is_array(pid) && json_is_array(gen) && json_is_array(t5), "%s: malformed", p);
    g->np = (int)json_array_size(pid), g->ng = (int)json_array_size(gen);
    g->prompt = malloc((size_t)g->np * sizeof(int));
    g->gen = malloc((size_t)g->ng * sizeof(int));
    g->top5 = malloc((size_t)g->ng * 5 * sizeof(int));
    for (int i = 0; i < g->np; i++) g->prompt[i] = (int)json_integer_value(json_array_get(pid, i));
    for (int i = 0; i < g->ng; i++) {
        g->gen[i] = (int)json_integer_value(json_array_get(gen, i));
        for (int k = 0; k < 5; k++) g->top5[i * 5 + k] = (int)json_integer_value(json_array_get(json_array_get(t5, i), k));
    }
    json_decref(j);
    return 1;
}

void golden_free(Golden *g) { free(g->prompt), free(g->gen), free(g->top5); }

int in_top5(const int *top5, int id) {
    for (int k = 0; k < 5; k++)
        if (top5[k] == id) return 1;
    return 0;
}

int vllm_first_diff(const int *a, const int *a5, const int *b, const int *b5, int n, int *ok) {
    *ok = 1;
    for (int i = 0; i < n; i++)
        if (a[i] != b[i]) {
            *ok = in_top5(b5 + 5 * i, a[i]) && in_top5(a5 + 5 * i, b[i]);
            return i;
        }
    return n;
}

int vllm_expect(const char *what, const int *a, const int *a5, const int *b, const int *b5, int n) {
    int ok;
    const int i = vllm_first_diff(a, a5, b, b5, n, &ok);
    cr_expect(ok, "%s: step %d: %d vs %d, not in each other's top-5", what, i, i < n ? a[i] : -1, i < n ? b[i] : -1);
    return i;
}

void ckpt_models_load(const Ckpt *c, CkptModels *L) {
    char err[512];
    cr_assert_eq(model_load(c->dir, &L->w, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cpu_model_load(&L->w, &L->cm, err, sizeof err), 0, "%s", err);
    L->gm = gpu_model_load(&L->w, err, sizeof err);
    cr_assert(L->gm, "%s", err);
    L->f32 = L->w.layers[0].wq->dtype == ST_F32;
}

void ckpt_models_free(CkptModels *L) {
    gpu_model_free(L->gm);
    cpu_model_free(&L->cm);
    model_free(&L->w);
}

int each_golden_ckpt(void (*fn)(const Ckpt *ck, const Golden *G, CkptModels *L, void *arg), void *arg) {
    Ckpt ck[64];
    const int n = ckpt_list(ck, 64, "config.json");
    int done = 0;
    for (int i = 0; i < n; i++) {
        if (!ck[i].has_golden) continue;
        Golden G;
        golden_load(ck[i].dir, &G);
        CkptModels L;
        ckpt_models_load(&ck[i], &L);
        fn(&ck[i], &G, &L, arg);
        golden_free(&G);
        ckpt_models_free(&L);
        done++;
    }
    return done;
}
