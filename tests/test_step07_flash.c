// test_step07_flash.c — step07's flash attention (step07_kernels/flash_attn.h).
//
// step07_flash (CPU, always run):
//   - the fp32 CPU reference against a naive softmax(Q K^T * scale + mask) V written here on dense
//     matrices (the whole score matrix, then row softmax, then a GEMM with V): causal and not,
//     GQA groups 1 / 4 / 8, head dims 64 / 128 and odd ones;
//   - a varlen batch: each sequence of the launch equals that sequence alone;
//   - the chunked-prefill case: keys 0 .. ctx-1 in a paged pool behind shuffled block tables (block
//     sizes 1, 16, 256), the chunk's own keys after them, against the naive attention of the
//     chunk's rows over the whole concatenated sequence;
//   - the tile plan and the FLOP count's pair formula against enumeration.
// step07_flash_gpu (skips without a CUDA device): every version of the ladder against the CPU
// reference on fresh random inputs with the output poisoned first (NaN) and guard rows after it
// that must stay untouched: GQA ratios 1 / 4 / 8, head dims 64 / 128, lengths 1, 7, 65, 130, 1000
// (multiples of no tile), varlen batches in one launch, chunked prefill through block tables of
// block sizes 1 / 16 / 256, non-causal, bf16 and fp16, and fp32, hd 40 and a misaligned q through the
// fallback; flash_attn (the rung it picks: v2_128 on sm_90) likewise, compared row by row. On sm_90 every tensor-core
// version must run bf16/fp16 at hd 64 / 128 with aligned rows, and must refuse a misaligned q.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "gpu.h"
#include "rng.h"
#include "step01_matmul/matmul_gpu.h"      // matmul_round_to_dtype
#include "step05_paged/paged_attention.h"  // pa_dev_alloc, pa_upload_as, pa_download_f32, pa_sync
#include "step07_kernels/flash_attn.h"

// ---------------------------------------------------------------- the naive attention (test's own)

// One sequence, dense: q (n, H*hd) queries at positions off .. off+n-1; k, v (L, KV*hd) keys at
// positions 0 .. L-1; out (n, H*hd). Scores as a full (n, L) matrix in float, masked to -inf above
// the diagonal (key > off + i) when causal, row softmax, then P V.
static void naive_attention(const float *q, const float *k, const float *v, int n, int L, int off, int H, int KV, int hd,
                            int causal, float *out) {
    const float scale = 1.0f / sqrtf((float)hd);
    float *S = malloc((size_t)n * L * sizeof(float));
    for (int h = 0; h < H; h++) {
        const int kh = h / (H / KV);
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < L; j++) {
                float d = 0;
                for (int e = 0; e < hd; e++) d += q[(size_t)i * H * hd + h * hd + e] * k[(size_t)j * KV * hd + kh * hd + e];
                S[(size_t)i * L + j] = causal && j > off + i ? -INFINITY : d * scale;
            }
            float mx = -INFINITY, sum = 0;
            for (int j = 0; j < L; j++) mx = fmaxf(mx, S[(size_t)i * L + j]);
            for (int j = 0; j < L; j++) sum += S[(size_t)i * L + j] = expf(S[(size_t)i * L + j] - mx);
            for (int j = 0; j < L; j++) S[(size_t)i * L + j] /= sum;
        }
        for (int i = 0; i < n; i++)
            for (int e = 0; e < hd; e++) {
                float acc = 0;
                for (int j = 0; j < L; j++) acc += S[(size_t)i * L + j] * v[(size_t)j * KV * hd + kh * hd + e];
                out[(size_t)i * H * hd + h * hd + e] = acc;
            }
    }
    free(S);
}

// ---------------------------------------------------------------- a test problem

typedef struct {
    int H, KV, hd, nseq, causal, B;
    int *cu, *ctx;          // ctx NULL: no context
    int T, nb;
    float *q, *k, *v;       // (T, H*hd), (T, KV*hd)
    float *kc, *vc;         // pool (pool_rows, KV*hd); rows no context covers are NaN
    int *bt;                // (nseq, nb)
    size_t pool_rows;
} Prob;

// lens[s] new tokens after ctx[s] context tokens (ctx NULL: none); values rounded to dt
// Pool blocks 1 .. n (block 0 is the null block) in a random order: the block tables of a test.
static int *shuffled_blocks(Rng *r, int n) {
    int *b = malloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) b[i] = i + 1;
    for (int i = n - 1; i > 0; i--) {
        const int j = (int)(rng_u32(r) % (unsigned)(i + 1)), t = b[i];
        b[i] = b[j], b[j] = t;
    }
    return b;
}

static Prob prob_new(int H, int KV, int hd, const int *lens, const int *ctx, int nseq, int causal, int B, StDtype dt,
                     unsigned seed) {
    Prob p = {H, KV, hd, nseq, causal, B, NULL, NULL, 0, 1, NULL, NULL, NULL, NULL, NULL, NULL, 0};
    p.cu = malloc((size_t)(nseq + 1) * sizeof(int));
    p.cu[0] = 0;
    int cmax = 0;
    for (int s = 0; s < nseq; s++) p.cu[s + 1] = p.cu[s] + lens[s];
    p.T = p.cu[nseq];
    Rng r;
    rng_seed(&r, seed);
    const size_t qd = (size_t)H * hd, kd = (size_t)KV * hd;
    p.q = rng_new_uniform(&r, (size_t)p.T * qd + 1, -1.0f, 1.0f);
    p.k = rng_new_uniform(&r, (size_t)p.T * kd + 1, -1.0f, 1.0f);
    p.v = rng_new_uniform(&r, (size_t)p.T * kd + 1, -1.0f, 1.0f);
    const MmDtype md = dt == ST_F16 ? MM_F16 : dt == ST_BF16 ? MM_BF16 : MM_F32;
    matmul_round_to_dtype(md, p.q, (long)(p.T * qd)), matmul_round_to_dtype(md, p.k, (long)(p.T * kd));
    matmul_round_to_dtype(md, p.v, (long)(p.T * kd));
    if (ctx) {
        p.ctx = malloc((size_t)nseq * sizeof(int));
        memcpy(p.ctx, ctx, (size_t)nseq * sizeof(int));
        for (int s = 0; s < nseq; s++) cmax = ctx[s] > cmax ? ctx[s] : cmax;
        p.nb = cmax > 0 ? (cmax + B - 1) / B : 1;
        const int nblk = nseq * p.nb + 1;
        p.pool_rows = (size_t)nblk * B;
        p.bt = shuffled_blocks(&r, nblk - 1);  // nseq * nb entries
        p.kc = malloc(p.pool_rows * kd * sizeof(float)), p.vc = malloc(p.pool_rows * kd * sizeof(float));
        for (size_t i = 0; i < p.pool_rows * kd; i++) p.kc[i] = p.vc[i] = NAN;  // a read past a context shows
        for (int s = 0; s < nseq; s++)
            for (int pos = 0; pos < ctx[s]; pos++) {
                const size_t row = (size_t)p.bt[s * p.nb + pos / B] * B + pos % B;
                for (size_t e = 0; e < kd; e++) p.kc[row * kd + e] = rng_uniform(&r) * 2 - 1, p.vc[row * kd + e] = rng_uniform(&r) * 2 - 1;
            }
        matmul_round_to_dtype(md, p.kc, (long)(p.pool_rows * kd)), matmul_round_to_dtype(md, p.vc, (long)(p.pool_rows * kd));
    }
    return p;
}
static void prob_free(Prob *p) {
    free(p->cu), free(p->ctx), free(p->q), free(p->k), free(p->v), free(p->kc), free(p->vc), free(p->bt);
}
static FlashHost prob_host(const Prob *p) {
    return (FlashHost){p->H, p->KV, p->hd, 1.0f / sqrtf((float)p->hd), p->causal, p->nseq, p->cu, p->ctx, p->q, p->k, p->v,
                       p->H * p->hd, p->KV * p->hd, p->kc, p->vc, p->bt, p->nb, p->B};
}

// The naive attention of sequence s over its whole key sequence (context gathered through the
// table, then its own keys): out (n_s, H*hd).
static void naive_seq(const Prob *p, int s, float *out) {
    const int n = p->cu[s + 1] - p->cu[s], c = p->ctx ? p->ctx[s] : 0, L = c + n;
    const size_t kd = (size_t)p->KV * p->hd;
    float *k = malloc((size_t)L * kd * sizeof(float)), *v = malloc((size_t)L * kd * sizeof(float));
    for (int pos = 0; pos < L; pos++) {
        const float *ks, *vs;
        if (pos < c) {
            const size_t row = (size_t)p->bt[s * p->nb + pos / p->B] * p->B + pos % p->B;
            ks = p->kc + row * kd, vs = p->vc + row * kd;
        } else {
            ks = p->k + (size_t)(p->cu[s] + pos - c) * kd, vs = p->v + (size_t)(p->cu[s] + pos - c) * kd;
        }
        memcpy(k + (size_t)pos * kd, ks, kd * sizeof(float)), memcpy(v + (size_t)pos * kd, vs, kd * sizeof(float));
    }
    naive_attention(p->q + (size_t)p->cu[s] * p->H * p->hd, k, v, n, L, c, p->H, p->KV, p->hd, p->causal, out);
    free(k), free(v);
}

static double rel_err(const float *a, const float *b, size_t n) {
    ErrStats e = compare_f32(a, b, n);
    return e.n_bad ? INFINITY : e.max_rel;
}

// ---------------------------------------------------------------- step07_flash: CPU

static void cpu_vs_naive(int H, int KV, int hd, const int *lens, const int *ctx, int nseq, int causal, int B) {
    Prob p = prob_new(H, KV, hd, lens, ctx, nseq, causal, B, ST_F32, 100u + (unsigned)(H * 7 + hd + nseq + B));
    FlashHost h = prob_host(&p);
    const size_t qd = (size_t)H * hd;
    float *out = malloc((size_t)p.T * qd * sizeof(float));
    flash_attn_cpu(&h, out, (int)qd);
    for (int s = 0; s < nseq; s++) {
        const int n = p.cu[s + 1] - p.cu[s];
        float *ref = malloc((size_t)n * qd * sizeof(float));
        naive_seq(&p, s, ref);
        const double e = rel_err(out + (size_t)p.cu[s] * qd, ref, (size_t)n * qd);
        cr_expect(e < 1e-5, "H=%d KV=%d hd=%d causal=%d B=%d seq %d (n=%d ctx=%d): reference vs naive %.3e", H, KV, hd, causal, B,
                  s, n, ctx ? ctx[s] : 0, e);
        free(ref);
    }
    free(out);
    prob_free(&p);
}

Test(step07_flash, reference_matches_naive_causal_gqa) {
    const int one[] = {37};
    cpu_vs_naive(4, 4, 64, one, NULL, 1, 1, 16);   // MHA
    cpu_vs_naive(8, 2, 128, one, NULL, 1, 1, 16);  // GQA 4
    cpu_vs_naive(8, 1, 64, one, NULL, 1, 1, 16);   // MQA (8)
    cpu_vs_naive(6, 3, 10, one, NULL, 1, 1, 16);   // odd head dim
    const int single[] = {1};
    cpu_vs_naive(4, 2, 64, single, NULL, 1, 1, 16);
}

Test(step07_flash, reference_matches_naive_not_causal) {
    const int one[] = {29};
    cpu_vs_naive(4, 1, 64, one, NULL, 1, 0, 16);
}

Test(step07_flash, varlen_batch_is_each_sequence_alone) {
    const int lens[] = {1, 7, 65, 30, 2};
    cpu_vs_naive(8, 2, 64, lens, NULL, 5, 1, 16);
    // and the same sequence gives the same rows whatever it is batched with, bit for bit
    Prob p = prob_new(4, 2, 64, lens, NULL, 5, 1, 16, ST_F32, 7);
    FlashHost h = prob_host(&p);
    float *all = malloc((size_t)p.T * 256 * sizeof(float)), *alone = malloc(65 * 256 * sizeof(float));
    flash_attn_cpu(&h, all, 256);
    const int cu1[] = {0, 65};
    FlashHost h1 = h;
    h1.nseq = 1, h1.cu_seqlens = cu1, h1.q = p.q + (size_t)p.cu[2] * 256, h1.k = p.k + (size_t)p.cu[2] * 128,
    h1.v = p.v + (size_t)p.cu[2] * 128;
    flash_attn_cpu(&h1, alone, 256);
    cr_expect(!memcmp(all + (size_t)p.cu[2] * 256, alone, 65 * 256 * sizeof(float)), "sequence 2 alone differs from batched");
    free(all), free(alone);
    prob_free(&p);
}

Test(step07_flash, chunked_prefill_context_through_block_tables) {
    const int lens[] = {5, 64, 1, 33}, ctx[] = {17, 100, 250, 0};
    const int bs[] = {1, 16, 256};
    for (int i = 0; i < 3; i++) cpu_vs_naive(8, 2, 64, lens, ctx, 4, 1, bs[i]);
    cpu_vs_naive(4, 4, 32, lens, ctx, 4, 0, 16);  // not causal: the chunk sees all its keys
}

Test(step07_flash, plan_and_pair_count) {
    const int cu[] = {0, 1, 1, 130, 1130};  // an empty sequence in the middle
    int tiles[5];
    cr_assert_eq(flash_plan(128, 32, 8, cu, 4, tiles), 1 + 0 + 5 + 32);  // 32 rows a tile at g = 4
    cr_expect(tiles[0] == 0 && tiles[1] == 1 && tiles[2] == 1 && tiles[3] == 6 && tiles[4] == 38);
    cr_expect_eq(flash_plan(64, 8, 8, cu, 4, tiles), 1 + 0 + 3 + 16);
    cr_expect_eq(flash_plan(64, 9, 8, cu, 4, tiles), -1);    // H % KV
    cr_expect_eq(flash_plan(4, 16, 2, cu, 4, tiles), -1);    // g = 8 > tile_m
    const int bad[] = {0, 5, 3};
    cr_expect_eq(flash_plan(64, 4, 4, bad, 2, tiles), -1);  // a negative length
    // pairs: enumeration vs the formula, causal and not, with contexts
    const int ctx[] = {3, 0, 10, 7};
    for (int causal = 0; causal < 2; causal++) {
        double want = 0;
        for (int s = 0; s < 4; s++)
            for (int j = 0; j < cu[s + 1] - cu[s]; j++) want += causal ? ctx[s] + j + 1 : ctx[s] + cu[s + 1] - cu[s];
        cr_expect_eq(flash_visible_pairs(cu, ctx, 4, causal), want, "causal=%d", causal);
    }
    cr_expect_eq(flash_visible_pairs(cu, NULL, 4, 1), 1 + 129.0 * 130 / 2 + 1000.0 * 1001 / 2);
}

// ---------------------------------------------------------------- step07_flash_gpu

#define NEED_GPU()                                                      \
    GpuInfo gi_;                                                        \
    if (gpu_info(&gi_) != 0) cr_skip_test("no CUDA device: %s", gi_.reason)

#define GUARD_ROWS 3
#define GPU_TOL 2e-2  // bf16/fp16 storage of q, k, v, P and out vs the fp32 reference (2 x ERR_TOL_HALF)

// Runs version id (-1: flash_attn, the rung it picks) on problem p; returns the max relative error per
// row against the CPU reference (INFINITY for a non-finite output, a touched guard row or a
// failed launch), or NAN when the version does not take the call here (-2).
// misalign: q starts one element past a 16-byte boundary (as q inside an odd-offset buffer): every
// tensor-core version must refuse it and flash_attn fall back.
static double gpu_run(const Prob *p, StDtype dt, int id, const float *ref, const GpuInfo *gi, int misalign) {
    const size_t qd = (size_t)p->H * p->hd, kd = (size_t)p->KV * p->hd, rows = (size_t)p->T + GUARD_ROWS;
    const size_t es = dt == ST_F32 ? 4 : 2;
    void *dq_alloc = pa_dev_alloc((size_t)p->T * qd * 4 + 16), *dq = (char *)dq_alloc + (misalign ? es : 0), *dk = pa_dev_alloc((size_t)p->T * kd * 4 + 16);
    void *dv = pa_dev_alloc((size_t)p->T * kd * 4 + 16), *dout = pa_dev_alloc(rows * qd * 4);
    int *dcu = pa_dev_alloc((size_t)(p->nseq + 1) * 4), *dtiles = pa_dev_alloc((size_t)(p->nseq + 1) * 4);
    void *dkc = NULL, *dvc = NULL;
    int *dctx = NULL, *dbt = NULL;
    cr_assert(dq_alloc && dk && dv && dout && dcu && dtiles);
    pa_upload_as(dt, dq, p->q, (size_t)p->T * qd);
    pa_upload_as(dt, dk, p->k, (size_t)p->T * kd), pa_upload_as(dt, dv, p->v, (size_t)p->T * kd);
    pa_upload(dcu, p->cu, (size_t)(p->nseq + 1) * 4);
    if (p->ctx) {
        dkc = pa_dev_alloc(p->pool_rows * kd * 4), dvc = pa_dev_alloc(p->pool_rows * kd * 4);
        dctx = pa_dev_alloc((size_t)p->nseq * 4), dbt = pa_dev_alloc((size_t)p->nseq * p->nb * 4);
        cr_assert(dkc && dvc && dctx && dbt);
        pa_upload_as(dt, dkc, p->kc, p->pool_rows * kd), pa_upload_as(dt, dvc, p->vc, p->pool_rows * kd);
        pa_upload(dctx, p->ctx, (size_t)p->nseq * 4), pa_upload(dbt, p->bt, (size_t)p->nseq * p->nb * 4);
    }
    FlashAttn fa = {dt, p->H, p->KV, p->hd, 1.0f / sqrtf((float)p->hd), p->causal, p->nseq, dcu, dctx, dq, (int)qd, dk, dv,
                    (int)kd, dkc, dvc, dbt, p->nb, p->B, dout, (int)qd, dtiles, 0, NULL, p->T};
    const int tile_m = id < 0 ? flash_attn_tile_m(&fa) : flash_find_version(id)->tile_m;
    int *tiles = malloc((size_t)(p->nseq + 1) * sizeof(int));
    fa.ntiles = flash_plan(tile_m, p->H, p->KV, p->cu, p->nseq, tiles);
    cr_assert(fa.ntiles >= 0);
    pa_upload(dtiles, tiles, (size_t)(p->nseq + 1) * 4);
    float *out = malloc(rows * qd * sizeof(float));
    for (size_t i = 0; i < (size_t)p->T * qd; i++) out[i] = NAN;      // every output row must be written
    for (size_t i = (size_t)p->T * qd; i < rows * qd; i++) out[i] = 3.0f;  // guard rows: never touched
    pa_upload_as(dt, dout, out, rows * qd);
    const int rc = id < 0 ? flash_attn(&fa) : flash_attn_run(&fa, id);
    double err = NAN;
    if (rc != -2) {
        cr_expect(rc == 1 || (rc == 0 && fa.ntiles == 0), "version %d returned %d", id, rc);
        err = rc == 1 && !pa_sync() ? 0 : INFINITY;
        if (err == 0) {
            pa_download_f32(dt, out, dout, rows * qd);
            for (size_t i = (size_t)p->T * qd; i < rows * qd; i++)
                if (out[i] != 3.0f) err = INFINITY;
            // row by row (every head of a row against that row's largest value): a late row of a long
            // sequence averages many values and is small, so a sequence-wide max would hide its errors
            for (int r = 0; r < p->T; r++) {
                const double e = rel_err(out + (size_t)r * qd, ref + (size_t)r * qd, qd);
                if (!(e <= err)) err = e;
            }
        }
    } else {
        // a tensor-core version must take bf16 / fp16 at hd 64 / 128 on sm_80+ (every one fits the
        // shared memory of sm_90; sm_86 / sm_89 may refuse the largest)
        // (v6 and up: sm_90a code, compute capability 9.0 exactly)
        const int arch_ok = id >= 6 ? gi->cc_major == 9 && gi->cc_minor == 0 : gi->cc_major >= 9;
        // (a kv_only version copies rectangles of k and v: no context keys from the pool)
        const FlashVersion *fv = id >= 0 ? flash_find_version(id) : NULL;
        const int keys_ok = !(fv && fv->kv_only) || !p->ctx;
        const int must = id != 0 && dt != ST_F32 && (p->hd == 64 || p->hd == 128) && arch_ok && keys_ok && !misalign;
        cr_expect(!must, "version %d refused a call it must take (%s, hd %d, sm_%d%d)", id, dt == ST_F16 ? "fp16" : "bf16",
                  p->hd, gi->cc_major, gi->cc_minor);
        if (id == 0) cr_expect(0, "the fallback refused a call");
    }
    if (misalign && id > 0) cr_expect(rc == -2, "version %d took a misaligned q", id);
    const FlashVersion *ver = id >= 0 ? flash_find_version(id) : NULL;
    if (ver && ver->kv_only && p->ctx) cr_expect(rc == -2, "%s took a call with context keys in the pool", ver->name);
    void *d[] = {dq_alloc, dk, dv, dout, dcu, dtiles, dkc, dvc, dctx, dbt};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        if (d[i]) pa_dev_free(d[i]);
    free(tiles), free(out);
    return err;
}

// Every version and flash_attn on one problem.
static void gpu_versions(int H, int KV, int hd, const int *lens, const int *ctx, int nseq, int causal, int B, StDtype dt,
                         int misalign) {
    GpuInfo gi;
    cr_assert_eq(gpu_info(&gi), 0);
    Prob p = prob_new(H, KV, hd, lens, ctx, nseq, causal, B, dt, 900u + (unsigned)(H + KV * 3 + hd + nseq * 5 + B));
    FlashHost h = prob_host(&p);
    const size_t qd = (size_t)H * hd;
    float *ref = malloc((size_t)p.T * qd * sizeof(float));
    flash_attn_cpu(&h, ref, (int)qd);
    const char *dn = dt == ST_F16 ? "fp16" : dt == ST_BF16 ? "bf16" : "fp32";
    cr_assert(flash_num_versions() >= 8, "the ladder has v0 .. v7");
    for (int vi = -1; vi < flash_num_versions(); vi++) {
        const int id = vi < 0 ? -1 : flash_version(vi)->id;
        const double e = gpu_run(&p, dt, id, ref, &gi, misalign);
        if (isnan(e)) continue;  // not on this device / dtype (gpu_run checked that it may refuse)
        cr_expect(e <= (dt == ST_F32 ? 1e-4 : GPU_TOL), "%s: %s H=%d KV=%d hd=%d nseq=%d (T=%d) ctx=%s B=%d causal=%d%s: err %.3e",
                  vi < 0 ? "flash_attn" : flash_version(vi)->name, dn, H, KV, hd, nseq, p.T, ctx ? "yes" : "no", B, causal,
                  misalign ? " misaligned q" : "", e);
    }
    free(ref);
    prob_free(&p);
}
static void gpu_all_versions(int H, int KV, int hd, const int *lens, const int *ctx, int nseq, int causal, int B, StDtype dt) {
    gpu_versions(H, KV, hd, lens, ctx, nseq, causal, B, dt, 0);
}

// The engine's layout (flash_attn.h: q_rows, k = v = NULL): each sequence's rows at their own offset
// in a larger flat batch with other rows between them (the engine's decode rows, which must stay
// untouched), a sequence with no rows there, and every key, the chunk's own too, read from the pool
// through a shuffled block table. Every version against the same fp32 reference as the plain layout.
static void gpu_engine_layout(int H, int KV, int hd, const int *lens, const int *ctx, int nseq, int B, StDtype dt) {
    GpuInfo gi;
    cr_assert_eq(gpu_info(&gi), 0);
    Prob p = prob_new(H, KV, hd, lens, ctx, nseq, 1, B, dt, 1300u + (unsigned)(H + KV * 3 + hd + nseq * 5 + B));
    FlashHost h = prob_host(&p);
    const size_t qd = (size_t)H * hd, kd = (size_t)KV * hd, es = dt == ST_F32 ? 4 : 2;
    float *ref = malloc((size_t)p.T * qd * sizeof(float));
    flash_attn_cpu(&h, ref, (int)qd);
    // the pool: every key of sequence s at table position p (ctx + n keys), blocks shuffled
    int lmax = 1;
    for (int s = 0; s < nseq; s++) lmax = ctx[s] + lens[s] > lmax ? ctx[s] + lens[s] : lmax;
    const int nb = (lmax + B - 1) / B, nblk = nseq * nb + 1;
    const size_t prow = (size_t)nblk * B;
    Rng r;
    rng_seed(&r, 77u + (unsigned)B);
    int *bt = shuffled_blocks(&r, nseq * nb);
    float *kc = malloc(prow * kd * sizeof(float)), *vc = malloc(prow * kd * sizeof(float));
    for (size_t i = 0; i < prow * kd; i++) kc[i] = vc[i] = NAN;
    for (int s = 0; s < nseq; s++)
        for (int pos = 0; pos < ctx[s] + lens[s]; pos++) {
            const size_t row = (size_t)bt[s * nb + pos / B] * B + pos % B;
            const float *ks, *vs;
            if (pos < ctx[s]) {
                const size_t old = (size_t)p.bt[s * p.nb + pos / B] * B + pos % B;
                ks = p.kc + old * kd, vs = p.vc + old * kd;
            } else {
                ks = p.k + (size_t)(p.cu[s] + pos - ctx[s]) * kd, vs = p.v + (size_t)(p.cu[s] + pos - ctx[s]) * kd;
            }
            memcpy(kc + row * kd, ks, kd * sizeof(float)), memcpy(vc + row * kd, vs, kd * sizeof(float));
        }
    // the rows: sequence s from row q_rows[s] = cu[s] + 3 s + 2; the rows between are others'
    const int T2 = p.T + 3 * nseq + 2;
    int *qrows = malloc((size_t)nseq * sizeof(int));
    float *q2 = malloc((size_t)T2 * qd * sizeof(float)), *out = malloc((size_t)T2 * qd * sizeof(float));
    for (size_t i = 0; i < (size_t)T2 * qd; i++) q2[i] = NAN;
    for (int s = 0; s < nseq; s++) {
        qrows[s] = p.cu[s] + 3 * s + 2;
        memcpy(q2 + (size_t)qrows[s] * qd, p.q + (size_t)p.cu[s] * qd, (size_t)lens[s] * qd * sizeof(float));
    }
    void *dq = pa_dev_alloc((size_t)T2 * qd * es), *dout = pa_dev_alloc((size_t)T2 * qd * es);
    void *dkc = pa_dev_alloc(prow * kd * es), *dvc = pa_dev_alloc(prow * kd * es);
    int *dcu = pa_dev_alloc((size_t)(nseq + 1) * 4), *dtiles = pa_dev_alloc((size_t)(nseq + 1) * 4);
    int *dctx = pa_dev_alloc((size_t)nseq * 4), *dbt = pa_dev_alloc((size_t)nseq * nb * 4), *drows = pa_dev_alloc((size_t)nseq * 4);
    cr_assert(dq && dout && dkc && dvc && dcu && dtiles && dctx && dbt && drows);
    pa_upload_as(dt, dq, q2, (size_t)T2 * qd);
    pa_upload_as(dt, dkc, kc, prow * kd), pa_upload_as(dt, dvc, vc, prow * kd);
    pa_upload(dcu, p.cu, (size_t)(nseq + 1) * 4), pa_upload(dctx, ctx, (size_t)nseq * 4);
    pa_upload(dbt, bt, (size_t)nseq * nb * 4), pa_upload(drows, qrows, (size_t)nseq * 4);
    FlashAttn fa = {dt, H, KV, hd, 1.0f / sqrtf((float)hd), 1, nseq, dcu, dctx, dq, (int)qd, NULL, NULL,
                    (int)kd, dkc, dvc, dbt, nb, B, dout, (int)qd, dtiles, 0, drows, 0};
    int *tiles = malloc((size_t)(nseq + 1) * sizeof(int));
    int ran = 0;
    for (int vi = -1; vi < flash_num_versions(); vi++) {
        const int id = vi < 0 ? -1 : flash_version(vi)->id;
        const char *name = vi < 0 ? "flash_attn" : flash_version(vi)->name;
        fa.ntiles = flash_plan(id < 0 ? flash_attn_tile_m(&fa) : flash_find_version(id)->tile_m, H, KV, p.cu, nseq, tiles);
        cr_assert(fa.ntiles > 0);
        pa_upload(dtiles, tiles, (size_t)(nseq + 1) * 4);
        for (int row = 0; row < T2; row++)
            for (size_t e = 0; e < qd; e++) out[(size_t)row * qd + e] = 3.0f;  // rows no sequence owns: never touched
        for (int s = 0; s < nseq; s++)
            for (size_t e = 0; e < (size_t)lens[s] * qd; e++) out[(size_t)qrows[s] * qd + e] = NAN;  // all written
        pa_upload_as(dt, dout, out, (size_t)T2 * qd);
        const int rc = id < 0 ? flash_attn(&fa) : flash_attn_run(&fa, id);
        if (vi >= 0 && flash_version(vi)->kv_only) cr_expect_eq(rc, -2, "%s took keys from the pool (q_rows, k = NULL)", name);
        if (rc == -2) continue;  // this version does not take the call here (gpu_run checks which must)
        cr_assert_eq(rc, 1, "%s returned %d", name, rc);
        cr_assert_eq(pa_sync(), 0, "%s", name);
        pa_download_f32(dt, out, dout, (size_t)T2 * qd);
        double err = 0;
        int touched = 0;
        for (int s = 0, row = 0; row < T2; row++) {
            while (s < nseq && row >= qrows[s] + lens[s]) s++;
            if (s < nseq && row >= qrows[s]) {
                const double e = rel_err(out + (size_t)row * qd, ref + (size_t)(p.cu[s] + row - qrows[s]) * qd, qd);
                if (!(e <= err)) err = e;
            } else {
                for (size_t e = 0; e < qd; e++) touched += out[(size_t)row * qd + e] != 3.0f;
            }
        }
        cr_expect_eq(touched, 0, "%s: %d elements written in rows no sequence owns", name, touched);
        cr_expect(err <= (dt == ST_F32 ? 1e-4 : GPU_TOL), "%s (engine layout, H=%d KV=%d hd=%d B=%d): err %.3e", name, H, KV,
                  hd, B, err);
        ran++;
    }
    cr_expect(ran >= 1 + (dt != ST_F32 && (hd == 64 || hd == 128) && gi.cc_major >= 9 ? 5 : 1), "versions run: %d", ran);
    void *d[] = {dq, dout, dkc, dvc, dcu, dtiles, dctx, dbt, drows};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) pa_dev_free(d[i]);
    free(ref), free(bt), free(kc), free(vc), free(qrows), free(q2), free(out), free(tiles);
    prob_free(&p);
}

Test(step07_flash_gpu, engine_layout_row_offsets_and_keys_in_the_pool) {
    NEED_GPU();
    const int lens[] = {64, 0, 7, 130, 1}, ctx[] = {1000, 5, 0, 300, 37};
    gpu_engine_layout(16, 8, 128, lens, ctx, 5, 16, ST_BF16);  // Qwen3's heads
    gpu_engine_layout(32, 8, 128, lens, ctx, 5, 1980, ST_BF16);  // one block a sequence: step04's slots
    gpu_engine_layout(8, 1, 64, lens, ctx, 5, 1, ST_F16);
    gpu_engine_layout(8, 2, 64, lens, ctx, 5, 16, ST_F32);  // the fallback
}

Test(step07_flash_gpu, lengths_not_multiple_of_any_tile) {
    NEED_GPU();
    const int lens[] = {1, 7, 65, 130, 1000};
    for (int i = 0; i < 5; i++) {
        gpu_all_versions(8, 8, 128, &lens[i], NULL, 1, 1, 16, ST_BF16);  // MHA
        gpu_all_versions(8, 2, 64, &lens[i], NULL, 1, 1, 16, ST_BF16);   // GQA 4
    }
}

Test(step07_flash_gpu, gqa_ratios_and_head_dims) {
    NEED_GPU();
    const int n[] = {130};
    const int gq[][2] = {{4, 4}, {8, 2}, {16, 2}};  // groups 1, 4, 8
    for (int i = 0; i < 3; i++)
        for (int d = 64; d <= 128; d += 64) {
            gpu_all_versions(gq[i][0], gq[i][1], d, n, NULL, 1, 1, 16, ST_BF16);
            gpu_all_versions(gq[i][0], gq[i][1], d, n, NULL, 1, 1, 16, ST_F16);
        }
}

Test(step07_flash_gpu, varlen_batch_one_launch) {
    NEED_GPU();
    const int lens[] = {1, 7, 65, 130, 300, 2, 129, 64};
    gpu_all_versions(32, 8, 128, lens, NULL, 8, 1, 16, ST_BF16);
    gpu_all_versions(16, 2, 64, lens, NULL, 8, 1, 16, ST_F16);
    const int with_empty[] = {5, 0, 70};
    gpu_all_versions(8, 2, 128, with_empty, NULL, 3, 1, 16, ST_BF16);
}

Test(step07_flash_gpu, chunked_prefill_paged_context) {
    NEED_GPU();
    const int lens[] = {64, 1, 7, 130}, ctx[] = {1000, 37, 0, 300};
    const int bs[] = {1, 16, 256};
    for (int i = 0; i < 3; i++) {
        gpu_all_versions(16, 8, 128, lens, ctx, 4, 1, bs[i], ST_BF16);
        gpu_all_versions(8, 1, 64, lens, ctx, 4, 1, bs[i], ST_F16);
    }
}

Test(step07_flash_gpu, not_causal_and_fp32_fallback) {
    NEED_GPU();
    const int lens[] = {65, 130}, ctx[] = {20, 0};
    gpu_all_versions(8, 2, 128, lens, ctx, 2, 0, 16, ST_BF16);
    gpu_all_versions(8, 2, 64, lens, NULL, 2, 1, 16, ST_F32);  // every tensor-core version refuses; v0 runs
    gpu_all_versions(6, 3, 40, lens, ctx, 2, 1, 16, ST_BF16);  // hd 40: the fallback only
    gpu_versions(8, 2, 128, lens, ctx, 2, 1, 16, ST_BF16, 1);   // q not 16-byte aligned: the fallback only
}
