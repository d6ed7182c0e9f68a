// test_step05_gpu.c — step05's CUDA side: the paged kernels (paged_attention.h) against their
// fp32 CPU references, and the paged runner (gpu_runner_new_paged) against the CPU, the step04
// slot runner and transformers' goldens.
//
// Kernels, on fresh random inputs, with every pool row that no context covers (block 0, the
// tail of each last block, unused blocks) poisoned with NaN so that a read past a context shows,
// and outputs poisoned before each run:
//   - the K/V write through the slot mapping (padding slots -1, shuffled slots, fp32/bf16/fp16),
//     exact against the CPU write of the same rounded values; unmapped rows stay NaN;
//   - paged decode v1 and v2 (and the rule) on block sizes 1, 16, 256, block tables of shuffled
//     non-contiguous blocks, GQA groups 1, 3, 4, 7, 8, head dims 64 and 128, odd context lengths
//     (1, 17, 130, 513, 1000, 2049), a padding item (no keys: zeros) and a causal 3-row chunk;
//   - the gather (exact) on row widths that take the 16-, 4- and 2-byte copies;
//   - the fused prefill kernel (paged_prefill, and its SIMT kernel alone) on several chunks in
//     one launch: 1, 5, 64, 97 rows over contexts that start mid-block or at 0, block sizes 1, 7,
//     16, 256, GQA groups 1, 2, 3, 4, 8, head dims 64 and 128, fp32/bf16/fp16 caches, fp32 and
//     cache-dtype outputs; rows outside every chunk must stay untouched;
//   - the runner's attention path over a paged pool (short chunks through paged decode, long ones
//     through the gather + GEMM path, and each forced for all) against step02's attention_at_cpu.
// Runner, on every checkpoint under tests/data/models/, block sizes 1, 16, 256:
//   - a mixed batch (prefill chunks, partial chunks, decodes, padding) against step03's CPU
//     cached forward, and with the GEMM path forced for every sequence against the step04 slot
//     runner bit for bit (the same K/V, gathered, go through the same GEMMs);
//   - the greedy continuation of each checkpoint's prompt against transformers' by vLLM's rule,
//     and the three block sizes against each other by the same rule;
//   - the long-chunk path fused vs gathered: the mixed batch above with each (against the CPU),
//     and greedy tokens of a random-weight bf16 model with head_dim 128 (the tensor-core kernel)
//     identical by vLLM's rule.
// Every test skips (and says why) without a CUDA device.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs_util.h"
#include "compare.h"
#include "golden_util.h"
#include "gpu.h"
#include "model.h"
#include "rng.h"
#include "step01_matmul/matmul_gpu.h"  // matmul_round_to_dtype
#include "step03_kvcache/kvcache.h"
#include "step04_batching/runner_gpu.h"
#include "step05_paged/paged_attention.h"
#include "step05_paged/paged_prefill.h"

#define NEED_GPU()                                                      \
    GpuInfo gi_;                                                        \
    if (gpu_info(&gi_) != 0) cr_skip_test("no CUDA device: %s", gi_.reason)

#define TOL_F32 1e-3   // logits max|diff| / max|logit|, GPU fp32 vs CPU fp32 (as step02/04)
#define TOL_BF16 4e-2  // GPU bf16 vs CPU fp32

static void round_to(StDtype dt, float *x, size_t n) {
    if (dt == ST_BF16) matmul_round_to_dtype(MM_BF16, x, (long)n);
    if (dt == ST_F16) matmul_round_to_dtype(MM_F16, x, (long)n);
}

// A pool of nblk blocks of B rows (kd wide, NaN everywhere) and block tables of ns sequences
// whose contexts are lens[i]: blocks handed out from a shuffled list of 1 .. nblk-1, so no table
// is contiguous or in order; the covered rows filled with uniform(-1, 1).
typedef struct {
    int B, nblk, stride, ns;
    int *bt;       // (ns, stride)
    float *k, *v;  // (nblk * B, kd)
} Pool;

static void pool_make(Pool *p, Rng *r, int B, const int *lens, int ns, int kd) {
    int need = 0, maxb = 1;
    for (int i = 0; i < ns; i++) {
        const int nb = (lens[i] + B - 1) / B;
        need += nb, maxb = nb > maxb ? nb : maxb;
    }
    p->B = B, p->nblk = need + 3, p->stride = maxb + 1, p->ns = ns;  // 2 blocks nobody holds + the null block
    int *perm = malloc((size_t)p->nblk * sizeof(int));
    for (int i = 0; i < p->nblk - 1; i++) perm[i] = i + 1;
    for (int i = p->nblk - 2; i > 0; i--) {
        const int j = (int)(rng_u32(r) % (unsigned)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    p->bt = calloc((size_t)ns * p->stride, sizeof(int));
    const size_t rows = (size_t)p->nblk * B;
    p->k = malloc(rows * kd * sizeof(float)), p->v = malloc(rows * kd * sizeof(float));
    for (size_t i = 0; i < rows * kd; i++) p->k[i] = p->v[i] = NAN;
    int at = 0;
    for (int i = 0; i < ns; i++) {
        const int nb = (lens[i] + B - 1) / B;
        for (int b = 0; b < nb; b++) p->bt[(size_t)i * p->stride + b] = perm[at++];
        for (int pos = 0; pos < lens[i]; pos++) {
            const size_t row = (size_t)p->bt[(size_t)i * p->stride + pos / B] * B + pos % B;
            rng_fill_uniform(r, p->k + row * kd, (size_t)kd, -1.0f, 1.0f);
            rng_fill_uniform(r, p->v + row * kd, (size_t)kd, -1.0f, 1.0f);
        }
    }
    free(perm);
}
static void pool_free(Pool *p) { free(p->bt), free(p->k), free(p->v); }

// ---------------------------------------------------------------- K/V write

Test(step05_gpu, kv_write_through_slot_mapping_matches_cpu, .timeout = 120) {
    NEED_GPU();
    const StDtype dts[] = {ST_F32, ST_BF16, ST_F16};
    const int kds[] = {1024, 128, 72};
    Rng r;
    rng_seed(&r, 505);
    for (int di = 0; di < 3; di++)
        for (int ki = 0; ki < 3; ki++) {
            const StDtype dt = dts[di];
            const int kd = kds[ki], T = 37, ld = kd + 8, rows = 300;
            float *k = rng_new_uniform(&r, (size_t)T * ld, -2.0f, 2.0f), *v = rng_new_uniform(&r, (size_t)T * ld, -2.0f, 2.0f);
            int slots[37], perm[300];
            for (int i = 0; i < rows; i++) perm[i] = i;
            for (int i = rows - 1; i > 0; i--) {
                const int j = (int)(rng_u32(&r) % (unsigned)(i + 1)), t = perm[i];
                perm[i] = perm[j], perm[j] = t;
            }
            for (int t = 0; t < T; t++) slots[t] = t % 6 == 5 ? -1 : perm[t];  // every 6th row padding
            float *kc = malloc((size_t)rows * kd * 4), *vc = malloc((size_t)rows * kd * 4);
            float *kr = malloc((size_t)rows * kd * 4), *vr = malloc((size_t)rows * kd * 4);
            for (size_t i = 0; i < (size_t)rows * kd; i++) kr[i] = vr[i] = NAN;
            float *k_rounded = malloc((size_t)T * ld * 4), *v_rounded = malloc((size_t)T * ld * 4);
            memcpy(k_rounded, k, (size_t)T * ld * 4), memcpy(v_rounded, v, (size_t)T * ld * 4);
            round_to(dt, k_rounded, (size_t)T * ld), round_to(dt, v_rounded, (size_t)T * ld);
            paged_kv_write_cpu(k_rounded, v_rounded, ld, slots, T, kd, kr, vr);
            const size_t es = dt == ST_F32 ? 4 : 2;
            float *dk = pa_dev_alloc((size_t)T * ld * 4), *dv = pa_dev_alloc((size_t)T * ld * 4);
            int *ds = pa_dev_alloc(sizeof slots);
            void *dkc = pa_dev_alloc((size_t)rows * kd * es), *dvc = pa_dev_alloc((size_t)rows * kd * es);
            cr_assert(dk && dv && ds && dkc && dvc);
            pa_upload(dk, k, (size_t)T * ld * 4), pa_upload(dv, v, (size_t)T * ld * 4), pa_upload(ds, slots, sizeof slots);
            float *nan = malloc((size_t)rows * kd * 4);
            for (size_t i = 0; i < (size_t)rows * kd; i++) nan[i] = NAN;
            pa_upload_as(dt, dkc, nan, (size_t)rows * kd), pa_upload_as(dt, dvc, nan, (size_t)rows * kd);
            cr_assert_eq(paged_kv_write(dt, dk, dv, ld, ds, T, kd, dkc, dvc), 0);
            cr_assert_eq(pa_sync(), 0);
            pa_download_f32(dt, kc, dkc, (size_t)rows * kd), pa_download_f32(dt, vc, dvc, (size_t)rows * kd);
            size_t bad = 0, written = 0;
            for (size_t i = 0; i < (size_t)rows * kd; i++) {
                const int same_k = isnan(kr[i]) ? isnan(kc[i]) : kc[i] == kr[i];
                const int same_v = isnan(vr[i]) ? isnan(vc[i]) : vc[i] == vr[i];
                bad += !same_k || !same_v;
                written += !isnan(kr[i]);
            }
            cr_expect_eq(bad, 0, "%s kd=%d: %zu of %d elements differ from the CPU write (%zu written)",
                         st_dtype_name(dt), kd, bad, rows * kd, written);
            cr_expect_eq(written, (size_t)(T - T / 6) * kd, "the test's own count");
            pa_dev_free(dk), pa_dev_free(dv), pa_dev_free(ds), pa_dev_free(dkc), pa_dev_free(dvc);
            free(k), free(v), free(kc), free(vc), free(kr), free(vr), free(k_rounded), free(v_rounded), free(nan);
        }
}

// ---------------------------------------------------------------- decode v1 / v2

typedef struct {
    int H, KV, hd;
} Shape;

Test(step05_gpu, paged_decode_v1_v2_match_cpu_on_odd_shapes, .timeout = 300) {
    NEED_GPU();
    const Shape shapes[] = {{4, 4, 64}, {6, 2, 128}, {32, 8, 128}, {14, 2, 128}, {16, 2, 64}, {8, 2, 256}, {16, 8, 128}};
    // sequences: contexts; items: sequence 5 gives a causal 3-row chunk, sequence 6 is padding (0 keys)
    const int lens[] = {1, 17, 130, 513, 1000, 2049, 0};
    const int NS = 7, B_[] = {1, 16, 256};
    const StDtype dts[] = {ST_F32, ST_BF16, ST_F16};
    int rows[16], seqs[16], ilen[16], n = 0;
    for (int i = 0; i < NS; i++) {
        if (i == 5)
            for (int j = 0; j < 3; j++) rows[n] = n, seqs[n] = i, ilen[n] = lens[i] - 2 + j, n++;
        else
            rows[n] = n, seqs[n] = i, ilen[n] = lens[i], n++;
    }
    int maxlen = 0;
    for (int w = 0; w < n; w++) maxlen = ilen[w] > maxlen ? ilen[w] : maxlen;
    const int nsms = pa_num_sms();
    cr_assert(nsms > 0);
    if (!getenv("PAGED_DECODE_V1_CTAS")) {  // the default: v1 from PA_V1_CTAS_PER_SM (1.5) CTAs per SM
        cr_expect_eq(paged_decode_choose(256, 8, 4096, 132), 1, "the rule: 2048 CTAs fill 132 SMs without splitting");
        cr_expect_eq(paged_decode_choose(32, 8, 4096, 132), 1, "the rule: 256 CTAs on 132 SMs stay whole");
        cr_expect_eq(paged_decode_choose(24, 8, 4096, 132), 2, "the rule: 192 CTAs on 132 SMs split at 4k");
        cr_expect_eq(paged_decode_choose(4, 8, 32768, 132), 2, "the rule: 32 CTAs split");
        cr_expect_eq(paged_decode_choose(24, 8, PA_PART, 132), 1, "the rule: one partition needs no split");
        cr_expect_eq(paged_decode_choose(1, 1, PA_PART, 132), 1, "the rule: one partition needs no split");
    }
    Rng r;
    rng_seed(&r, 5005);
    int runs = 0;
    double worst[2][2] = {{0}};  // [tensor-core loop][fp32 output], half caches
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int bi = 0; bi < 3; bi++)
            for (int di = 0; di < 3; di++) {
                const int H = shapes[s].H, KV = shapes[s].KV, hd = shapes[s].hd, qd = H * hd, kd = KV * hd, B = B_[bi];
                const StDtype dt = dts[di];
                const size_t es = dt == ST_F32 ? 4 : 2;
                if (!paged_decode_supported(dt, H, KV, hd)) {  // fp32 rows of 64 16-byte vectors: more than a warp
                    cr_expect(dt == ST_F32 && hd > 128, "%s hd %d refused", st_dtype_name(dt), hd);
                    continue;
                }
                Pool p;
                pool_make(&p, &r, B, lens, NS, kd);
                const size_t prow = (size_t)p.nblk * B;
                float *q = rng_new_uniform(&r, (size_t)n * qd, -1.0f, 1.0f);
                round_to(dt, p.k, prow * kd), round_to(dt, p.v, prow * kd);  // the reference sees what the device holds
                float *ref = malloc((size_t)n * qd * 4), *out = malloc((size_t)n * qd * 4);
                paged_decode_cpu(q, qd, p.k, p.v, p.bt, p.stride, B, rows, seqs, ilen, n, H, KV, hd, 1.0f / sqrtf((float)hd),
                                 ref, qd);
                float *dq = pa_dev_alloc((size_t)n * qd * 4);
                void *dk = pa_dev_alloc(prow * kd * es), *dv = pa_dev_alloc(prow * kd * es), *dout = pa_dev_alloc((size_t)n * qd * 4);
                int *dbt = pa_dev_alloc((size_t)NS * p.stride * 4), *dit = pa_dev_alloc(3 * 16 * 4);
                const size_t part_cap = (size_t)H * ((maxlen + PA_PART - 1) / PA_PART) * hd * 2;  // 2 items per group
                float *po = pa_dev_alloc(part_cap * 4), *pm = pa_dev_alloc(part_cap / hd * 8);
                cr_assert(dq && dk && dv && dout && dbt && dit && po && pm);
                pa_upload(dq, q, (size_t)n * qd * 4);
                pa_upload_as(dt, dk, p.k, prow * kd), pa_upload_as(dt, dv, p.v, prow * kd);
                pa_upload(dbt, p.bt, (size_t)NS * p.stride * 4);
                pa_upload(dit, rows, (size_t)n * 4), pa_upload(dit + 16, seqs, (size_t)n * 4), pa_upload(dit + 32, ilen, (size_t)n * 4);
                static const char *const VER_NAME[] = {"",
                                                       "v1",
                                                       "v2",
                                                       "the rule",
                                                       "v2 variant 1 (lb4)",
                                                       "v2 variant 2 (u8)",
                                                       "v2 variant 3 (the first loop)",
                                                       "v2 variant 4 (mma)",
                                                       "v2 variant 5 (mma, 2 tiles)",
                                                       "v2 variant 6 (mma, lb4)",
                                                       "v2 variant 7 (mma, P split)",
                                                       "v1 variant 3 (the first loop)",
                                                       "v1 variant 4 (mma)",
                                                       "v1 variant 8 (mma, 8 warps)",
                                                       "v1 variant 9 (mma, 16 warps)",
                                                       "v2 variant 8 (mma, 8 warps)",
                                                       "v2 variant 9 (mma, 16 warps)"};
                // v1, v2 and the rule with their default loops (the tensor-core loop where paged_decode_mma_ok),
                // v2 with the loop variants 1 .. 7, v1 with variants 3 and 4, both with 8 and 9
                for (int ver = 1; ver <= 16; ver++) {
                    const int variant = ver <= 3 ? 0 : ver <= 10 ? ver - 3 : ver <= 12 ? ver - 8 : ver <= 14 ? ver - 5 : ver - 7;
                    const int out_f32 = dt == ST_F32 || ((ver == 2 || ver == 10 || ver == 13 || ver == 16) && s == 1);
                    PagedDecode a = {dt, H, KV, hd, 1.0f / sqrtf((float)hd), dq, qd, dk, dv, dbt, p.stride, B,
                                     dit, dit + 16, dit + 32, n, maxlen, dout, qd, out_f32, po, pm, part_cap, 0,
                                     variant, NULL, 0};
                    // the tensor-core loops round q and P to the cache dtype (as FlashAttention does): ~2.5e-3 of
                    // the largest output in fp32 (a numpy model of the loop); P in two parts (variant 7) restores 2e-3
                    // (variant 0: the SIMT loop for a GQA group of at most paged_decode_simt_max_g() heads)
                    const int mma_loop = paged_decode_mma_ok(dt, hd) &&
                                         ((variant == 0 && H / KV > paged_decode_simt_max_g()) || (variant >= 4 && variant != 7));
                    for (size_t i = 0; i < (size_t)n * qd; i++) out[i] = NAN;
                    pa_upload_as(out_f32 ? ST_F32 : dt, dout, out, (size_t)n * qd);
                    const int nl = ver == 1 || (ver >= 11 && ver <= 14) ? paged_decode_v1(&a) : ver == 3 ? paged_decode(&a, nsms)
                                                                                       : paged_decode_v2(&a);
                    cr_assert(nl >= 1, "launch refused");
                    cr_assert_eq(pa_sync(), 0);
                    pa_download_f32(out_f32 ? ST_F32 : dt, out, dout, (size_t)n * qd);
                    const double tol = out_f32 && dt == ST_F32 ? 1e-4 : out_f32 ? (mma_loop ? 5e-3 : 2e-3) : 2 * ERR_TOL_HALF;
                    for (int w = 0; w < n; w++) {
                        const float *o = out + (size_t)w * qd, *rf = ref + (size_t)w * qd;
                        if (ilen[w] == 0) {
                            int zeros = 1;
                            for (int i = 0; i < qd; i++) zeros &= o[i] == 0.0f;
                            cr_expect(zeros, "padding item: not zeros (%s)", VER_NAME[ver]);
                            continue;
                        }
                        ErrStats e = compare_f32(o, rf, (size_t)qd);
                        cr_expect(e.n_bad == 0 && e.max_rel < tol, "%s %s B=%d H=%d KV=%d hd=%d item %d (%d keys): max_rel %.3e, "
                                  "%zu non-finite (tol %.0e)", VER_NAME[ver], st_dtype_name(dt), B, H, KV, hd, w, ilen[w],
                                  e.max_rel, e.n_bad, tol);
                        double *wst = &worst[mma_loop][out_f32 && dt != ST_F32];
                        if (dt != ST_F32 && e.max_rel > *wst) *wst = e.max_rel;
                    }
                    runs++;
                }
                void *ps[] = {dq, dk, dv, dout, dbt, dit, po, pm};
                for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) pa_dev_free(ps[i]);
                free(q), free(ref), free(out);
                pool_free(&p);
            }
    fprintf(stderr, "[paged-decode] %d kernel runs (v1, v2, rule; v2 variants 1-9, v1 variants 3, 4, 8, 9) x 6 shapes x 3 block "
            "sizes x 3 dtypes match the CPU (tensor-core loop: %s)\n", runs, paged_decode_mma_ok(ST_BF16, 128) ? "on" : "off");
    fprintf(stderr, "[paged-decode] worst max_rel, bf16/fp16 caches: SIMT loops and variant 7 %.2e (half out) %.2e "
            "(fp32 out); tensor-core loops %.2e (half out) %.2e (fp32 out)\n", worst[0][0], worst[0][1], worst[1][0], worst[1][1]);
}

// ---------------------------------------------------------------- gather

Test(step05_gpu, gather_through_block_table_is_exact, .timeout = 120) {
    NEED_GPU();
    const int kds[] = {1024, 36, 35};  // 16-byte, 4-byte and (bf16) 2-byte copies
    const int lens[] = {300, 1, 77};
    const int B_[] = {1, 16, 256};
    const StDtype dts[] = {ST_F32, ST_BF16};
    Rng r;
    rng_seed(&r, 5050);
    for (int ki = 0; ki < 3; ki++)
        for (int bi = 0; bi < 3; bi++)
            for (int di = 0; di < 2; di++) {
                const int kd = kds[ki], B = B_[bi];
                const StDtype dt = dts[di];
                const size_t es = dt == ST_F32 ? 4 : 2;
                Pool p;
                pool_make(&p, &r, B, lens, 3, kd);
                const size_t prow = (size_t)p.nblk * B;
                round_to(dt, p.k, prow * kd), round_to(dt, p.v, prow * kd);
                void *dk = pa_dev_alloc(prow * kd * es), *dv = pa_dev_alloc(prow * kd * es);
                void *gk = pa_dev_alloc(300 * (size_t)kd * es), *gv = pa_dev_alloc(300 * (size_t)kd * es);
                int *dbt = pa_dev_alloc((size_t)3 * p.stride * 4);
                cr_assert(dk && dv && gk && gv && dbt);
                pa_upload_as(dt, dk, p.k, prow * kd), pa_upload_as(dt, dv, p.v, prow * kd);
                pa_upload(dbt, p.bt, (size_t)3 * p.stride * 4);
                float *ck = malloc(300 * (size_t)kd * 4), *cv = malloc(300 * (size_t)kd * 4);
                float *ok = malloc(300 * (size_t)kd * 4), *ov = malloc(300 * (size_t)kd * 4);
                for (int sq = 0; sq < 3; sq++) {
                    const int L = lens[sq];
                    paged_gather_cpu(p.k, p.v, p.bt, p.stride, B, sq, L, kd, ck, cv);
                    cr_assert_eq(paged_gather(dt, dk, dv, dbt, p.stride, B, sq, L, kd, gk, gv), 0);
                    cr_assert_eq(pa_sync(), 0);
                    pa_download_f32(dt, ok, gk, (size_t)L * kd), pa_download_f32(dt, ov, gv, (size_t)L * kd);
                    size_t bad = 0;
                    for (size_t i = 0; i < (size_t)L * kd; i++) bad += ok[i] != ck[i] || ov[i] != cv[i];
                    cr_expect_eq(bad, 0, "%s kd=%d B=%d sequence %d (%d rows): %zu elements differ", st_dtype_name(dt), kd,
                                 B, sq, L, bad);
                }
                pa_dev_free(dk), pa_dev_free(dv), pa_dev_free(gk), pa_dev_free(gv), pa_dev_free(dbt);
                free(ck), free(cv), free(ok), free(ov);
                pool_free(&p);
            }
}

// ---------------------------------------------------------------- the runner's attention over a paged pool

Test(step05_gpu, batched_attention_through_block_tables_matches_cpu, .timeout = 300) {
    NEED_GPU();
    // hd 80 and 36 are no multiple of... the decode kernels take 80 (bf16: 10 vectors -> 16 lanes)
    // but not 36 (bf16 rows of 72 bytes): that shape runs the gather + GEMM path for every sequence.
    const Shape shapes[] = {{4, 4, 64}, {32, 8, 128}, {6, 2, 80}, {16, 2, 128}, {3, 1, 36}};
    const int seq_n[] = {1, 1, 3, 17, 130, 2, 3, 1};
    const int seq_L[] = {1, 300, 132, 145, 207, 0, 3, 129};
    const int S = 8, B_[] = {1, 16, 256};
    const StDtype dts[] = {ST_F32, ST_BF16};
    const int paths[] = {16, 0, 1000};
    Rng r;
    rng_seed(&r, 4055);
    int cu[9];
    cu[0] = 0;
    for (int i = 0; i < S; i++) cu[i + 1] = cu[i] + seq_n[i];
    const int T = cu[S];
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int bi = 0; bi < 3; bi++)
            for (int di = 0; di < 2; di++) {
                const int H = shapes[s].H, KV = shapes[s].KV, hd = shapes[s].hd, qd = H * hd, kd = KV * hd, B = B_[bi];
                Pool p;
                pool_make(&p, &r, B, seq_L, S, kd);
                const int rows = p.nblk * B;
                float *q = rng_new_uniform(&r, (size_t)T * qd, -1.0f, 1.0f);
                float *qr = malloc((size_t)T * qd * 4), *kr = malloc((size_t)rows * kd * 4), *vr = malloc((size_t)rows * kd * 4);
                memcpy(qr, q, (size_t)T * qd * 4), memcpy(kr, p.k, (size_t)rows * kd * 4), memcpy(vr, p.v, (size_t)rows * kd * 4);
                if (dts[di] == ST_BF16) round_to(ST_BF16, qr, (size_t)T * qd), round_to(ST_BF16, kr, (size_t)rows * kd),
                                        round_to(ST_BF16, vr, (size_t)rows * kd);
                float *ref = malloc((size_t)T * qd * 4), *out = malloc((size_t)T * qd * 4);
                float *gk = malloc((size_t)300 * kd * 4), *gv = malloc((size_t)300 * kd * 4);
                for (int i = 0; i < S; i++) {
                    if (seq_L[i] == 0) {
                        memset(ref + (size_t)cu[i] * qd, 0, (size_t)seq_n[i] * qd * 4);
                        continue;
                    }
                    paged_gather_cpu(kr, vr, p.bt, p.stride, B, i, seq_L[i], kd, gk, gv);
                    attention_at_cpu(qr + (size_t)cu[i] * qd, gk, gv, seq_L[i] - seq_n[i], seq_n[i], H, KV, hd,
                                     ref + (size_t)cu[i] * qd);
                }
                for (int pi = 0; pi < 3; pi++) {
                    for (size_t i = 0; i < (size_t)T * qd; i++) out[i] = NAN;
                    cr_assert_eq(batch_attention_gpu_check_paged(q, p.k, p.v, rows, S, cu, seq_L, p.bt, p.stride, B, H, KV,
                                                                 hd, dts[di], paths[pi], out), 0);
                    const double tol = dts[di] == ST_F32 ? 1e-4 : 2 * ERR_TOL_HALF;
                    for (int i = 0; i < S; i++) {
                        ErrStats e = compare_f32(out + (size_t)cu[i] * qd, ref + (size_t)cu[i] * qd, (size_t)seq_n[i] * qd);
                        if (seq_L[i] == 0) {
                            int zeros = 1;
                            for (size_t j = 0; j < (size_t)seq_n[i] * qd; j++) zeros &= out[(size_t)cu[i] * qd + j] == 0.0f;
                            cr_expect(zeros, "padding sequence %d not zeroed (hd=%d path %d B=%d)", i, hd, paths[pi], B);
                            continue;
                        }
                        cr_expect(e.n_bad == 0 && e.max_rel < tol,
                                  "%s H=%d KV=%d hd=%d B=%d small_chunk=%d: sequence %d (%d rows over %d keys): max_rel "
                                  "%.3e, %zu non-finite (tol %.0e)", st_dtype_name(dts[di]), H, KV, hd, B, paths[pi], i,
                                  seq_n[i], seq_L[i], e.max_rel, e.n_bad, tol);
                    }
                }
                free(q), free(qr), free(kr), free(vr), free(ref), free(out), free(gk), free(gv);
                pool_free(&p);
            }
}

// ---------------------------------------------------------------- fused prefill

// Several chunks in one launch, each of its own sequence: {rows, earlier context}. Their output
// rows are laid out in reverse sequence order with one untouched row between chunks.
static const int PF_CHUNK[][2] = {{1, 0}, {5, 19}, {64, 1027}, {97, 0}, {97, 130}, {1, 300}, {64, 33}};
#define PF_NC ((int)(sizeof PF_CHUNK / sizeof PF_CHUNK[0]))

Test(step05_gpu, prefill_fused_matches_cpu_on_odd_shapes, .timeout = 600) {
    NEED_GPU();
    const Shape shapes[] = {{4, 4, 64}, {16, 8, 128}, {6, 2, 128}, {8, 2, 128}, {16, 2, 64}};
    const int B_[] = {1, 7, 16, 256};
    const StDtype dts[] = {ST_F32, ST_BF16, ST_F16};
    int lens[PF_NC], T = 0;
    PrefillChunk ch[PF_NC];
    for (int i = PF_NC - 1; i >= 0; i--) {  // rows: the last sequence first, a gap row after each chunk
        lens[i] = PF_CHUNK[i][0] + PF_CHUNK[i][1];
        ch[i] = (PrefillChunk){i, T, PF_CHUNK[i][0], lens[i]};
        T += PF_CHUNK[i][0] + 1;
    }
    Rng r;
    rng_seed(&r, 5150);
    int runs = 0;
    double worst[3] = {0, 0, 0};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int bi = 0; bi < 4; bi++)
            for (int di = 0; di < 3; di++) {
                const int H = shapes[s].H, KV = shapes[s].KV, hd = shapes[s].hd, qd = H * hd, kd = KV * hd, B = B_[bi];
                const int ldq = qd + 2 * kd, ldo = qd + 8;  // q inside qkv rows, as the runner's; a padded output
                const StDtype dt = dts[di];
                const size_t es = dt == ST_F32 ? 4 : 2;
                Pool p;
                pool_make(&p, &r, B, lens, PF_NC, kd);
                const size_t prow = (size_t)p.nblk * B;
                round_to(dt, p.k, prow * kd), round_to(dt, p.v, prow * kd);  // the reference sees what the device holds
                float *q = rng_new_uniform(&r, (size_t)T * ldq, -1.0f, 1.0f);
                float *ref = malloc((size_t)T * ldo * 4), *out = malloc((size_t)T * ldo * 4);
                const float scale = 1.0f / sqrtf((float)hd);
                paged_prefill_cpu(q, ldq, p.k, p.v, p.bt, p.stride, B, ch, PF_NC, H, KV, hd, scale, ref, ldo);
                const int nt = paged_prefill_num_tiles(ch, PF_NC, H, KV);
                cr_assert(nt > 0);
                int *tiles = malloc((size_t)nt * PP_TILE_INTS * sizeof(int));
                cr_assert_eq(paged_prefill_plan(ch, PF_NC, H, KV, tiles, nt), nt);
                float *dq = pa_dev_alloc((size_t)T * ldq * 4);
                void *dk = pa_dev_alloc(prow * kd * es), *dv = pa_dev_alloc(prow * kd * es), *dout = pa_dev_alloc((size_t)T * ldo * 4);
                int *dbt = pa_dev_alloc((size_t)PF_NC * p.stride * 4), *dt_ = pa_dev_alloc((size_t)nt * PP_TILE_INTS * 4);
                cr_assert(dq && dk && dv && dout && dbt && dt_);
                pa_upload(dq, q, (size_t)T * ldq * 4);
                pa_upload_as(dt, dk, p.k, prow * kd), pa_upload_as(dt, dv, p.v, prow * kd);
                pa_upload(dbt, p.bt, (size_t)PF_NC * p.stride * 4);
                pa_upload(dt_, tiles, (size_t)nt * PP_TILE_INTS * 4);
                const int mma = dt != ST_F32 && paged_prefill_supported(dt, H, KV, hd);
                if (dt != ST_F32 && gi_.cc_major >= 8) cr_expect(mma, "bf16/fp16 hd %d on sm_%d%d: the tensor-core path refused", hd, gi_.cc_major, gi_.cc_minor);
                for (int ver = 0; ver < 2; ver++) {  // paged_prefill (the MMA kernel where it applies), then the SIMT kernel
                    const int out_f32 = dt == ST_F32 || (s + bi + ver) % 2 == 0;
                    const StDtype odt = out_f32 ? ST_F32 : dt;
                    PagedPrefill a = {dt, H, KV, hd, scale, dq, ldq, dk, dv, dbt, p.stride, B, dt_, nt, dout, ldo, out_f32};
                    for (size_t i = 0; i < (size_t)T * ldo; i++) out[i] = NAN;
                    pa_upload_as(odt, dout, out, (size_t)T * ldo);
                    cr_assert_eq(ver ? paged_prefill_simt(&a) : paged_prefill(&a), 1, "launch refused");
                    cr_assert_eq(pa_sync(), 0);
                    pa_download_f32(odt, out, dout, (size_t)T * ldo);
                    // fp32: fp32 math; MMA: q and P rounded to the cache dtype; SIMT: fp32 math on the rounded cache
                    const double tol = dt == ST_F32 ? 1e-4 : (ver == 0 && mma) || !out_f32 ? 2 * ERR_TOL_HALF : 2e-3;
                    for (int c = 0; c < PF_NC; c++) {
                        for (int j = 0; j < ch[c].n; j++) {
                            const size_t row = (size_t)(ch[c].row0 + j) * ldo;
                            ErrStats e = compare_f32(out + row, ref + row, (size_t)qd);
                            const int wi = dt == ST_F32 ? 0 : ver == 0 && mma ? 1 : 2;
                            if (e.max_rel > worst[wi]) worst[wi] = e.max_rel;
                            cr_expect(e.n_bad == 0 && e.max_rel < tol,
                                      "%s %s out=%s B=%d H=%d KV=%d hd=%d chunk %d (%d rows after %d keys) row %d: max_rel "
                                      "%.3e, %zu non-finite (tol %.0e)", ver ? "simt" : "paged_prefill", st_dtype_name(dt),
                                      st_dtype_name(odt), B, H, KV, hd, c, ch[c].n, ch[c].L - ch[c].n, j, e.max_rel, e.n_bad, tol);
                        }
                        int untouched = 1;  // the gap row after the chunk, and the padding columns of every row
                        const float *gap = out + (size_t)(ch[c].row0 + ch[c].n) * ldo;
                        for (int i = 0; i < ldo; i++) untouched &= isnan(gap[i]) != 0;
                        for (int j = 0; j < ch[c].n; j++)
                            for (int i = qd; i < ldo; i++) untouched &= isnan(out[(size_t)(ch[c].row0 + j) * ldo + i]) != 0;
                        cr_expect(untouched, "%s B=%d H=%d KV=%d hd=%d: wrote outside chunk %d's rows", st_dtype_name(dt), B, H,
                                  KV, hd, c);
                    }
                    runs++;
                }
                void *ps[] = {dq, dk, dv, dout, dbt, dt_};
                for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) pa_dev_free(ps[i]);
                free(q), free(ref), free(out), free(tiles);
                pool_free(&p);
            }
    fprintf(stderr, "[paged-prefill] %d runs (fused, SIMT) x 5 shapes x 4 block sizes x 3 dtypes match the CPU; worst "
            "max_rel fp32 %.2e, tensor cores %.2e, SIMT on 16-bit caches %.2e\n", runs, worst[0], worst[1], worst[2]);
}

Test(step05_gpu, prefill_refuses_bad_arguments) {
    NEED_GPU();
    PagedPrefill a = {ST_BF16, 12, 8, 128, 0.1f, NULL, 12 * 128, NULL, NULL, NULL, 1, 16, NULL, 1, NULL, 12 * 128, 0};
    cr_expect_eq(paged_prefill(&a), -1, "H %% KV != 0 accepted");
    cr_expect_eq(paged_prefill_supported(ST_BF16, 12, 8, 128), 0);
    cr_expect_eq(paged_prefill_supported(ST_BF16, 72, 8, 128), 0, "g = 9 accepted");
    cr_expect_eq(paged_prefill_supported(ST_BF16, 16, 8, 96), 0, "hd 96 on the tensor-core path accepted");
    cr_expect_eq(paged_prefill_supported(ST_F32, 16, 8, 96), gi_.cc_major >= 8, "fp32 (SIMT, sm_80+) hd 96");
    a.H = 16, a.ldq = a.ldo = 16 * 128, a.block_size = 0;
    cr_expect_eq(paged_prefill(&a), -1, "block size 0 accepted");
    a.block_size = 16, a.ntiles = 0;
    cr_expect_eq(paged_prefill(&a), 0, "no tiles: nothing to launch");
}

// ---------------------------------------------------------------- runner: paged batches, built here

#define PB_TOK 512
#define PB_SEQ 16
#define PB_LEN 64

// Sequence s owns the blocks tables[s][0 ..] (shuffled, non-contiguous); a batch row at position
// pos of s goes to tables[s][pos / B] * B + pos % B.
typedef struct {
    Batch b;
    int owner[PB_SEQ];
} PBatch;

static void pb_init(PBatch *t, int B) {
    batch_alloc_paged(&t->b, PB_SEQ, PB_TOK, B, (PB_LEN + B - 1) / B);
    t->b.cu_seqlens_q[0] = 0;
}
static void pb_add(PBatch *t, int owner, const int *table, int pos0, int n, const int *ids, int want) {
    Batch *b = &t->b;
    const int B = b->block_size;
    cr_assert(b->n_seqs < PB_SEQ && b->n_tokens + n <= PB_TOK);
    for (int j = 0; j < n; j++) {
        const int r = b->n_tokens + j, pos = pos0 + j;
        b->token_ids[r] = ids[j], b->positions[r] = pos, b->slot_mapping[r] = table[pos / B] * B + pos % B;
    }
    b->n_tokens += n;
    const int L = pos0 + n;
    memcpy(b->block_tables + (size_t)b->n_seqs * b->bt_stride, table, (size_t)((L + B - 1) / B) * sizeof(int));
    b->seq_lens_k[b->n_seqs] = L, b->seq_slot[b->n_seqs] = 0;
    b->cu_seqlens_q[++b->n_seqs] = b->n_tokens;
    if (want) t->owner[b->n_logits] = owner, b->logit_rows[b->n_logits++] = b->n_tokens - 1;
}
static void pb_pad(PBatch *t, int n) {
    Batch *b = &t->b;
    for (int j = 0; j < n; j++) {
        const int r = b->n_tokens + j;
        b->token_ids[r] = 0, b->positions[r] = 0, b->slot_mapping[r] = -1;
    }
    b->n_tokens += n;
    b->seq_lens_k[b->n_seqs] = 0, b->seq_slot[b->n_seqs] = 0;
    b->cu_seqlens_q[++b->n_seqs] = b->n_tokens;
}

// ns tables of PB_LEN positions each from a shuffled pool of nblk blocks (1 .. nblk-1).
static int make_tables(Rng *r, int B, int ns, int tables[][PB_LEN]) {
    const int per = (PB_LEN + B - 1) / B, nblk = ns * per + 4;
    int *perm = malloc((size_t)nblk * sizeof(int));
    for (int i = 0; i < nblk - 1; i++) perm[i] = i + 1;
    for (int i = nblk - 2; i > 0; i--) {
        const int j = (int)(rng_u32(r) % (unsigned)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int s = 0; s < ns; s++)
        for (int k = 0; k < per; k++) tables[s][k] = perm[s * per + k];
    free(perm);
    return nblk;
}


#define MX_SEQ 4
// Five steps of four sequences (prompts 40, 9, 20, 1 tokens) through the paged runner (block
// size B, shuffled tables) and, per sequence, step03's CPU cached forward: logits of every logit
// row compared. fused: the long chunks through the fused prefill kernel where it takes the
// shape (else the gather path). With small_chunk 0 and the gather path the same steps also run
// on the step04 slot runner, whose logits must be identical bit for bit (the same GEMM path over
// the same K/V). The K/V rows written are checked against the CPU cache, unmapped rows of the
// pool against NaN.
static void mixed_paged(const Ckpt *ck, int B, int small_chunk, int fused) {
    CkptModels L;
    ckpt_models_load(ck, &L);
    const ModelConfig *c = &L.cm.cfg;
    const int V = c->vocab, kd = c->n_kv_heads * c->head_dim;
    Rng r;
    rng_seed(&r, 577 + B + small_chunk);
    int tables[MX_SEQ][PB_LEN];
    const int nblk = make_tables(&r, B, MX_SEQ, tables);
    char err[512];
    GpuRunner *g = gpu_runner_new_paged(L.gm, nblk, B, PB_LEN, 128, err, sizeof err);
    cr_assert(g, "%s", err);
    gpu_runner_set_small_chunk(g, small_chunk);
    const int fused_eff = gpu_runner_set_prefill_attn(g, fused);
    GpuInfo gi;
    cr_assert_eq(gpu_info(&gi), 0);
    if (fused && L.f32 && gi.cc_major >= 8) cr_expect(fused_eff, "%s: the fused prefill kernel refused an fp32 model", ck->name);
    GpuRunner *slot = NULL;
    if (small_chunk == 0 && fused_eff != PREFILL_PAGED) {  // the GEMM path or flash: step04's slots have them too
        slot = gpu_runner_new(L.gm, MX_SEQ, PB_LEN, 128, err, sizeof err);
        cr_assert(slot, "%s", err);
        gpu_runner_set_small_chunk(slot, 0);
        cr_assert_eq(gpu_runner_set_prefill_attn(slot, fused_eff), fused_eff);
    }
    const int plen[MX_SEQ] = {40, 9, 20, 1};
    int toks[MX_SEQ][PB_LEN], ntok[MX_SEQ], ncomp[MX_SEQ] = {0};
    CpuKvCache kv[MX_SEQ];
    for (int s = 0; s < MX_SEQ; s++) {
        ntok[s] = plen[s];
        for (int j = 0; j < plen[s]; j++) toks[s][j] = (int)(rng_u32(&r) % (unsigned)V);
        cr_assert_eq(cpu_kv_init(&kv[s], c, PB_LEN), 0);
    }
    const int sched[5][MX_SEQ] = {{23, 9, 3, 1}, {17, 1, 17, 1}, {1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1, 1}};
    float *logits = malloc((size_t)MX_SEQ * V * 4), *lslot = malloc((size_t)MX_SEQ * V * 4), *ref = malloc((size_t)V * 4);
    int argmax[MX_SEQ];
    double worst = 0;
    int identical = 0, compared = 0;
    for (int step = 0; step < 5; step++) {
        PBatch t;
        pb_init(&t, B);
        for (int s = 0; s < MX_SEQ; s++) {
            if (s == 2 && step != 1) pb_pad(&t, 2);
            const int n = sched[step][s];
            pb_add(&t, s, tables[s], ncomp[s], n, toks[s] + ncomp[s], ncomp[s] + n == ntok[s]);
        }
        cr_assert_eq(batch_check_paged(&t.b, nblk, PB_LEN, V), 0, "the test's own batch");
        for (size_t i = 0; i < (size_t)MX_SEQ * V; i++) logits[i] = NAN;
        cr_assert_eq(gpu_runner_forward(g, &t.b, logits, argmax), 0, "%s B=%d step %d", ck->name, B, step);
        if (slot) {  // the same rows in step04's layout: slot s, row s * PB_LEN + pos
            Batch sb = t.b;
            int *sm = malloc((size_t)t.b.n_tokens * sizeof(int)), *ss = malloc((size_t)t.b.n_seqs * sizeof(int));
            for (int i = 0, s = 0; i < t.b.n_seqs; i++) {
                const int r0 = t.b.cu_seqlens_q[i], r1 = t.b.cu_seqlens_q[i + 1];
                const int real = t.b.seq_lens_k[i] > 0;
                ss[i] = real ? s : 0;
                for (int row = r0; row < r1; row++) sm[row] = real ? s * PB_LEN + t.b.positions[row] : -1;
                s += real;
            }
            sb.slot_mapping = sm, sb.seq_slot = ss, sb.block_size = 0, sb.bt_stride = 0, sb.block_tables = NULL;
            cr_assert_eq(gpu_runner_forward(slot, &sb, lslot, NULL), 0);
            const int same = !memcmp(logits, lslot, (size_t)t.b.n_logits * V * 4);
            cr_expect(same, "%s B=%d step %d: paged logits differ from the step04 slot runner's (%s path for all)",
                      ck->name, B, step, fused_eff == PREFILL_FLASH ? "flash" : "GEMM");
            identical += same, compared++;
            free(sm), free(ss);
        }
        int li = 0;
        for (int s = 0; s < MX_SEQ; s++) {
            const int n = sched[step][s];
            cr_assert_eq(forward_cached_cpu(&L.cm, &kv[s], toks[s] + ncomp[s], n, ref), 0);
            ncomp[s] += n;
            if (ncomp[s] < ntok[s]) continue;
            cr_assert(li < t.b.n_logits && t.owner[li] == s);
            const float *lg = logits + (size_t)li * V;
            const double e = compare_f32(lg, ref, V).max_rel;
            worst = e > worst ? e : worst;
            cr_expect(e <= (L.f32 ? TOL_F32 : TOL_BF16), "%s B=%d small_chunk=%d step %d sequence %d: max|diff|/max|logit| "
                      "%.3e", ck->name, B, small_chunk, step, s, e);
            cr_expect_eq(argmax[li], argmax_f32(lg, V), "%s B=%d step %d sequence %d: device argmax %d, host %d", ck->name,
                         B, step, s, argmax[li], argmax_f32(lg, V));
            toks[s][ntok[s]++] = argmax_f32(ref, V);
            li++;
        }
        cr_expect_eq(li, t.b.n_logits);
        batch_free(&t.b);
    }
    // every pool row: written (a position some sequence computed) = the CPU cache; else NaN
    float *k = malloc((size_t)kd * 4), *v = malloc((size_t)kd * 4);
    int written = 0, poisoned = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int row = 0; row < nblk * B; row++) {
            int s = -1, pos = -1;
            for (int i = 0; i < MX_SEQ && s < 0; i++)
                for (int kb = 0; kb < (PB_LEN + B - 1) / B; kb++)
                    if (tables[i][kb] == row / B && kb * B + row % B < ncomp[i]) s = i, pos = kb * B + row % B;
            cr_assert_eq(gpu_runner_read_kv(g, l, row, k, v), 0);
            if (s >= 0) {
                const float *kr = kv[s].k + ((size_t)l * PB_LEN + pos) * kd, *vr = kv[s].v + ((size_t)l * PB_LEN + pos) * kd;
                const double ek = compare_f32(k, kr, kd).max_rel, ev = compare_f32(v, vr, kd).max_rel, tol = L.f32 ? 1e-4 : 3e-2;
                cr_expect(ek <= tol && ev <= tol, "%s B=%d layer %d row %d (sequence %d position %d): K %.3e V %.3e",
                          ck->name, B, l, row, s, pos, ek, ev);
                written++;
            } else {
                int nan = 1;
                for (int i = 0; i < kd; i++) nan &= isnan(k[i]) && isnan(v[i]);
                cr_expect(nan, "%s B=%d layer %d row %d: written, but no position maps there", ck->name, B, l, row);
                poisoned++;
            }
        }
    fprintf(stderr, "[paged-mixed] %s B=%d small_chunk=%d prefill %s: worst logits diff vs CPU %.3e; %d K/V rows match "
            "the CPU cache, %d unmapped rows untouched%s\n", ck->name, B, small_chunk,
            fused_eff == PREFILL_FLASH ? "flash" : fused_eff == PREFILL_PAGED ? "fused" : "gather", worst,
            written, poisoned,
            slot ? (identical == compared ? "; logits bit-identical to the step04 slot runner" : "; NOT identical to step04") : "");
    free(k), free(v);
    for (int s = 0; s < MX_SEQ; s++) cpu_kv_free(&kv[s]);
    free(logits), free(lslot), free(ref);
    gpu_runner_free(g);
    if (slot) gpu_runner_free(slot);
    ckpt_models_free(&L);
}

Test(step05_gpu, paged_runner_matches_cpu_and_step04, .timeout = 600) {
    NEED_GPU();
    Ckpt ck[64];
    const int n = ckpt_list(ck, 64, "config.json");
    if (n == 0) cr_skip_test("no checkpoints under %s", MODELS_DIR);
    const int Bs[] = {1, 16, 256};
    for (int i = 0; i < n; i++)
        for (int bi = 0; bi < 3; bi++) {
            mixed_paged(&ck[i], Bs[bi], 16, 1);
            mixed_paged(&ck[i], Bs[bi], 0, 0);
            mixed_paged(&ck[i], Bs[bi], 0, 1);  // every sequence a long item: decode rows through the fused kernel too
            mixed_paged(&ck[i], Bs[bi], 16, 2);  // flash where it takes the checkpoint's shape, else the fused kernel
        }
}

Test(step05_gpu, paged_runner_refuses_bad_block_tables) {
    NEED_GPU();
    Ckpt ck[64];
    const int n = ckpt_list(ck, 64, "config.json");
    if (n == 0) cr_skip_test("no checkpoints under %s", MODELS_DIR);
    CkptModels L;
    ckpt_models_load(&ck[0], &L);
    char err[512];
    GpuRunner *g = gpu_runner_new_paged(L.gm, 8, 16, PB_LEN, 64, err, sizeof err);
    cr_assert(g, "%s", err);
    int table[PB_LEN] = {3, 5, 7, 2};
    int ids[40] = {0};
    const int bad[] = {0, 8, -1};  // the null block, past the pool, negative
    for (int k = 0; k < 3; k++) {
        PBatch t;
        pb_init(&t, 16);
        table[1] = bad[k];
        pb_add(&t, 0, table, 0, 20, ids, 1);
        for (int j = 16; j < 20; j++) t.b.slot_mapping[j] = 5 * 16 + j - 16;  // in range: the table entry is what is bad
        cr_expect_eq(gpu_runner_forward(g, &t.b, NULL, NULL), -1, "table entry %d accepted", bad[k]);
        batch_free(&t.b);
    }
    PBatch t;
    pb_init(&t, 16);
    table[1] = 5;
    pb_add(&t, 0, table, 0, 20, ids, 1);
    cr_expect_eq(gpu_runner_forward(g, &t.b, NULL, NULL), 0, "a good table refused");
    t.b.block_size = 8;
    cr_expect_eq(gpu_runner_forward(g, &t.b, NULL, NULL), -1, "a batch of another block size accepted");
    batch_free(&t.b);
    gpu_runner_free(g);
    ckpt_models_free(&L);
}

// ---------------------------------------------------------------- goldens, and block sizes vs each other

// The prompt in two chunks (the first samples nothing), then one decode per step, through the
// paged runner with block size B and a shuffled table. mode >= 0: the runner's lone-decode mode
// (gpu_runner_set_lone_decode); feed: the tokens fed back (else the argmax); all_logits (ng, V):
// every step's logits.
static void greedy_paged(GpuModel *gm, int V, const Golden *G, int B, int mode, const int *feed, int *ours, int *ours5,
                         float *all_logits) {
    const int np = G->np, ng = G->ng, max_len = np + ng + 1;
    Rng r;
    rng_seed(&r, 31 + B);
    const int per = (max_len + B - 1) / B, nblk = per + 5;
    int *perm = malloc((size_t)nblk * sizeof(int));
    for (int i = 0; i < nblk - 1; i++) perm[i] = i + 1;
    for (int i = nblk - 2; i > 0; i--) {
        const int j = (int)(rng_u32(&r) % (unsigned)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    char err[512];
    const int step_tokens = np - np / 2 > 64 ? np - np / 2 : 64;  // the longer prompt chunk fits one step
    GpuRunner *g = gpu_runner_new_paged(gm, nblk, B, max_len, step_tokens, err, sizeof err);
    cr_assert(g, "%s", err);
    if (mode >= 0) gpu_runner_set_lone_decode(g, mode);
    int *seq = malloc((size_t)(np + ng) * sizeof(int));
    memcpy(seq, G->prompt, (size_t)np * sizeof(int));
    float *logits = malloc((size_t)V * 4);
    Batch b;
    batch_alloc_paged(&b, 1, np + 1, B, per);
    memcpy(b.block_tables, perm, (size_t)per * sizeof(int));
    int ncomp = 0;
    const int c1 = np / 2;
    for (int s = 0; s < ng; s++) {
        for (int part = 0; part < 2; part++) {
            int p0, n, want;
            if (s == 0) p0 = part ? c1 : 0, n = part ? np - c1 : c1, want = part;
            else if (part) p0 = ncomp, n = 1, want = 1;
            else continue;
            if (n == 0) continue;
            b.n_seqs = 1, b.n_tokens = n, b.cu_seqlens_q[0] = 0, b.cu_seqlens_q[1] = n, b.seq_lens_k[0] = p0 + n;
            b.seq_slot[0] = 0;
            for (int j = 0; j < n; j++)
                b.token_ids[j] = seq[p0 + j], b.positions[j] = p0 + j, b.slot_mapping[j] = perm[(p0 + j) / B] * B + (p0 + j) % B;
            b.n_logits = want, b.logit_rows[0] = n - 1;
            for (int v = 0; v < V; v++) logits[v] = NAN;
            int am = -1;
            cr_assert_eq(gpu_runner_forward(g, &b, want ? logits : NULL, want ? &am : NULL), 0);
            ncomp = p0 + n;
            if (want) {
                forward_topk(logits, V, 5, ours5 + 5 * s);
                ours[s] = am;
                seq[np + s] = feed ? feed[s] : am;
                if (all_logits) memcpy(all_logits + (size_t)s * V, logits, (size_t)V * 4);
            }
        }
    }
    batch_free(&b);
    free(seq), free(logits), free(perm);
    gpu_runner_free(g);
}

static void block_sizes_agree(const Ckpt *ck, const Golden *G, CkptModels *L, void *arg) {
    (void)arg;
    const int ng = G->ng, Bs[] = {1, 16, 256};
    int *ours[3], *ours5[3];
    for (int bi = 0; bi < 3; bi++) {
        ours[bi] = malloc((size_t)ng * sizeof(int)), ours5[bi] = malloc((size_t)ng * 5 * sizeof(int));
        greedy_paged(L->gm, L->cm.cfg.vocab, G, Bs[bi], -1, NULL, ours[bi], ours5[bi], NULL);
        char what[400];
        snprintf(what, sizeof what, "%s: paged GPU (B=%d) vs transformers", ck->name, Bs[bi]);
        const int first = vllm_expect(what, ours[bi], ours5[bi], G->gen, G->top5, ng);
        fprintf(stderr, "[golden-paged] %s B=%d: %d of %d tokens identical to transformers\n", ck->name, Bs[bi], first, ng);
    }
    for (int bi = 1; bi < 3; bi++) {
        char what[400];
        snprintf(what, sizeof what, "%s: paged GPU B=%d vs B=1", ck->name, Bs[bi]);
        const int first = vllm_expect(what, ours[bi], ours5[bi], ours[0], ours5[0], ng);
        fprintf(stderr, "[block-sizes] %s: B=%d and B=1 give %d of %d identical greedy tokens\n", ck->name, Bs[bi],
                first, ng);
    }
    for (int bi = 0; bi < 3; bi++) free(ours[bi]), free(ours5[bi]);
}
Test(step05_gpu, goldens_and_block_sizes_agree_through_the_paged_runner, .timeout = 300) {
    NEED_GPU();
    if (!each_golden_ckpt(block_sizes_agree, NULL))
        cr_skip_test("no checkpoints with goldens/greedy.json under %s", MODELS_DIR);
}

// ---------------------------------------------------------------- the lone decode row: step07's chain
// Every decode step of the goldens' prompts four ways: step02/03's kernels one after the other
// (mode 0), step07's fused chain (1: the RMSNorms and SwiGLU inside the GEMVs, the many-block
// argmax), the chain under programmatic dependent launch (2; sm_90, else as 1), and 2 with the
// RoPE, K/V write and paged attention in one kernel (3, attn_fused2_paged; where it does not take
// the shape, as 2), on the same inputs (mode 0's tokens fed to all four). 1 agrees with 0 to
// rounding (the norm's scale applied after the dot product instead of before); 2 equals 1 bit for
// bit (PDL only moves when a kernel starts); 3 agrees with 2 to rounding (other summation orders);
// every mode's device argmax is the first maximum of its own logits.
#define TOL_CHAIN_F32 1e-4
#define TOL_CHAIN_BF16 1e-2  // a K/V value may round to the next bf16
static void lone_decode_compare(const char *name, GpuModel *gm, int V, const Golden *G, double tol) {
    const int ng = G->ng;
    int *tok[4], *top5[4];
    float *lg[4];
    for (int m = 0; m < 4; m++) {
        tok[m] = malloc((size_t)ng * sizeof(int)), top5[m] = malloc((size_t)ng * 5 * sizeof(int));
        lg[m] = malloc((size_t)ng * V * sizeof(float));
        greedy_paged(gm, V, G, 16, m, m ? tok[0] : NULL, tok[m], top5[m], lg[m]);
    }
    double worst = 0, worst3 = 0;  // max|diff| / max|logit| per step (compare.h: a NaN or Inf makes it infinite)
    for (int s = 0; s < ng; s++) {
        worst = fmax(worst, compare_f32(lg[1] + (size_t)s * V, lg[0] + (size_t)s * V, (size_t)V).max_rel);
        worst3 = fmax(worst3, compare_f32(lg[3] + (size_t)s * V, lg[2] + (size_t)s * V, (size_t)V).max_rel);
        for (int m = 0; m < 4; m++) {  // the device argmax = the first maximum of the same logits
            const float *l = lg[m] + (size_t)s * V;
            int best = 0;
            for (int v = 1; v < V; v++)
                if (l[v] > l[best]) best = v;
            cr_expect_eq(tok[m][s], best, "%s mode %d step %d: device argmax %d, first maximum %d", name, m, s, tok[m][s],
                         best);
        }
    }
    cr_expect(worst <= tol, "%s: fused chain vs unfused max|diff|/max|logit| = %.3g > %.0e", name, worst, tol);
    cr_expect(memcmp(lg[1], lg[2], (size_t)ng * V * sizeof(float)) == 0, "%s: the chain with PDL differs from without",
              name);
    cr_expect(worst3 <= tol, "%s: fused attention (mode 3) vs mode 2 max|diff|/max|logit| = %.3g > %.0e", name, worst3, tol);
    fprintf(stderr, "[lone-decode] %s: fused chain vs unfused %.3g (tol %.0e) over %d steps; PDL bit-identical; "
            "one-kernel attention vs two %.3g\n", name, worst, tol, ng, worst3);
    for (int m = 0; m < 4; m++) free(tok[m]), free(top5[m]), free(lg[m]);
}
static const char *FV_JSON;
static void lone_decode_ckpt(const Ckpt *ck, const Golden *G, CkptModels *L, void *arg) {
    (void)arg;
    lone_decode_compare(ck->name, L->gm, L->cm.cfg.vocab, G, L->f32 ? TOL_CHAIN_F32 : TOL_CHAIN_BF16);
}
Test(step05_gpu, lone_decode_fused_chain_matches_unfused, .timeout = 300) {
    NEED_GPU();
    if (!each_golden_ckpt(lone_decode_ckpt, NULL)) cr_skip_test("no checkpoints with goldens/greedy.json under %s", MODELS_DIR);
    // a random bf16 model of head_dim 128: the paged decode's tensor-core loop (sm_80+), 150 prompt ids
    // and 40 decode steps (contexts 151 .. 190)
    if (gi_.cc_major < 8) return;
    ModelConfig cfg;
    char err[512];
    cr_assert_eq(hf_config_parse(FV_JSON, "test model", &cfg, err, sizeof err), 0, "%s", err);
    GpuModel *gm = gpu_model_random(&cfg, ST_BF16, 11, err, sizeof err);
    cr_assert(gm, "%s", err);
    int prompt[150];
    Rng r;
    rng_seed(&r, 515);
    for (int j = 0; j < 150; j++) prompt[j] = (int)(rng_u32(&r) % (unsigned)cfg.vocab);
    const Golden G = {150, 40, prompt, NULL, NULL};
    lone_decode_compare("random qwen3 hd128 bf16", gm, cfg.vocab, &G, TOL_CHAIN_BF16);
    gpu_model_free(gm);
}

// ---------------------------------------------------------------- fused vs gathered long chunks, tensor cores

// A random-weight bf16 model of head_dim 128 (the fused kernel's tensor-core path; the test
// checkpoints' head dims take its SIMT path or none): three prompts (70, 65, 20 tokens) in
// chunks of 48 + 22, 40 + 25 and 20 (every one a long chunk, two of them starting mid-block),
// then NG greedy decodes each, through the paged runner with the fused and the gather path.
#define FV_SEQ 3
#define FV_NG 12
#define FV_LEN 128
static const char *FV_JSON =
    "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":512,\"intermediate_size\":1024,"
    "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":128,\"vocab_size\":1024,"
    "\"max_position_embeddings\":4096,\"rms_norm_eps\":1e-6,\"rope_theta\":1000000.0,\"tie_word_embeddings\":true}";

static void fused_vs_gather_run(GpuModel *gm, int V, int B, int fused, int toks[FV_SEQ][FV_LEN], int *ntok,
                                int top5[FV_SEQ][FV_NG * 5]) {
    const int plen[FV_SEQ] = {70, 65, 20}, first[FV_SEQ] = {48, 40, 20};
    Rng r;
    rng_seed(&r, 909 + B);
    cr_assert(B >= 1);
    const int per = (int)(((unsigned)FV_LEN + (unsigned)B - 1) / (unsigned)B), nblk = FV_SEQ * per + 4;
    int *perm = malloc((unsigned)nblk * sizeof(int));
    for (int i = 0; i < nblk - 1; i++) perm[i] = i + 1;
    for (int i = nblk - 2; i > 0; i--) {
        const int j = (int)(rng_u32(&r) % (unsigned)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int *tab = malloc((unsigned)(FV_SEQ * per) * sizeof(int));
    for (int s = 0; s < FV_SEQ; s++)
        for (int k = 0; k < per; k++) tab[s * per + k] = perm[s * per + k];
    char err[512];
    GpuRunner *g = gpu_runner_new_paged(gm, nblk, B, FV_LEN, 256, err, sizeof err);
    cr_assert(g, "%s", err);
    const int eff = gpu_runner_set_prefill_attn(g, fused);
    cr_assert_eq(eff, fused, "B=%d: the prefill path in effect is %d, asked for %d", B, eff, fused);
    int ncomp[FV_SEQ] = {0}, ngen[FV_SEQ] = {0};
    for (int s = 0; s < FV_SEQ; s++) {
        ntok[s] = plen[s];
        for (int j = 0; j < plen[s]; j++) toks[s][j] = (int)(rng_u32(&r) % (unsigned)V);
    }
    float *logits = malloc((size_t)FV_SEQ * V * 4);
    for (int step = 0; step < FV_NG + 1; step++) {
        Batch b;
        batch_alloc_paged(&b, FV_SEQ, 256, B, per);
        b.cu_seqlens_q[0] = 0;
        int owner[FV_SEQ];
        for (int s = 0; s < FV_SEQ; s++) {
            const int n = step == 0 ? first[s] : ncomp[s] < plen[s] ? plen[s] - ncomp[s] : 1;
            if (ngen[s] >= FV_NG) continue;
            for (int j = 0; j < n; j++) {
                const int row = b.n_tokens + j, pos = ncomp[s] + j;
                b.token_ids[row] = toks[s][pos], b.positions[row] = pos;
                b.slot_mapping[row] = tab[s * per + pos / B] * B + pos % B;
            }
            b.n_tokens += n;
            const int L = ncomp[s] + n;
            memcpy(b.block_tables + (size_t)b.n_seqs * b.bt_stride, tab + s * per, (size_t)((L + B - 1) / B) * sizeof(int));
            b.seq_lens_k[b.n_seqs] = L, b.seq_slot[b.n_seqs] = 0;
            b.cu_seqlens_q[++b.n_seqs] = b.n_tokens;
            if (L == ntok[s]) owner[b.n_logits] = s, b.logit_rows[b.n_logits++] = b.n_tokens - 1;
            ncomp[s] = L;
        }
        if (b.n_seqs == 0) {
            batch_free(&b);
            break;
        }
        cr_assert_eq(gpu_runner_forward(g, &b, logits, NULL), 0, "B=%d fused=%d step %d", B, fused, step);
        for (int i = 0; i < b.n_logits; i++) {
            const int s = owner[i];
            const float *lg = logits + (size_t)i * V;
            forward_topk(lg, V, 5, top5[s] + 5 * ngen[s]);
            toks[s][ntok[s]++] = top5[s][5 * ngen[s]];
            ngen[s]++;
        }
        batch_free(&b);
    }
    free(logits), free(perm), free(tab);
    gpu_runner_free(g);
}

Test(step05_gpu, prefill_fused_and_gather_give_the_same_greedy_tokens, .timeout = 300) {
    NEED_GPU();
    if (gi_.cc_major < 8) cr_skip_test("the fused kernel's tensor-core path needs sm_80+ (this device: sm_%d%d)", gi_.cc_major, gi_.cc_minor);
    ModelConfig cfg;
    char err[512];
    cr_assert_eq(hf_config_parse(FV_JSON, "test model", &cfg, err, sizeof err), 0, "%s", err);
    GpuModel *gm = gpu_model_random(&cfg, ST_BF16, 7, err, sizeof err);
    cr_assert(gm, "%s", err);
    const int Bs[] = {1, 16, 256};
    for (int bi = 0; bi < 3; bi++) {
        static int toks[2][FV_SEQ][FV_LEN], top5[2][FV_SEQ][FV_NG * 5];
        int ntok[2][FV_SEQ];
        for (int f = 0; f < 2; f++) fused_vs_gather_run(gm, cfg.vocab, Bs[bi], 1 - f, toks[f], ntok[f], top5[f]);
        for (int s = 0; s < FV_SEQ; s++) {
            int a[FV_NG], b[FV_NG];
            for (int i = 0; i < FV_NG; i++) a[i] = top5[0][s][5 * i], b[i] = top5[1][s][5 * i];
            char what[200];
            snprintf(what, sizeof what, "B=%d sequence %d: fused vs gather", Bs[bi], s);
            const int same = vllm_expect(what, a, top5[0][s], b, top5[1][s], FV_NG);
            fprintf(stderr, "[prefill-fused] B=%d sequence %d: %d of %d greedy tokens identical, fused vs gather\n", Bs[bi],
                    s, same, FV_NG);
        }
    }
    gpu_model_free(gm);
}

// step07's flash attention as the runners' prompt-chunk path (PREFILL_FLASH): three sequences
// (prompts 70, 65, 20) on random bf16 models whose head dims the tensor-core versions take, fed
// in steps that mix chunks with a context, whole prompts and decodes, the decode rows placed
// before, between and after the chunks (flash's q_rows: a sequence's rows anywhere in the batch),
// on step04's slot runner and step05's paged runner (B = 16 and 1), each with the GEMM path and
// with flash. The logit rows of chunks (more than one row, so the long path): bit-identical
// between the slots and the pools with flash (the same keys in the same order through one
// kernel; only the addresses differ), as with the GEMM path; the decode rows run each layout's
// own decode kernel, so there within rounding. Flash vs the GEMM path: within bf16 rounding, and
// the same greedy token where the top two logits are not within that rounding.
#define FL_SEQ 3
#define FL_LEN 128
#define FL_STEPS 7
static void flash_step(GpuRunner *g, int B, int step, int toks[FL_SEQ][FL_LEN], int *ncomp, float *logits, int *owner,
                       int *multi, int *n_logits) {
    static const int plen[FL_SEQ] = {70, 65, 20};
    static const int first[FL_SEQ] = {48, 40, 20};
    static const int order[FL_STEPS][FL_SEQ] = {{0, 1, 2}, {2, 0, 1}, {0, 2, 1}, {1, 0, 2}, {0, 1, 2}, {2, 1, 0}, {0, 1, 2}};
    const int per = (FL_LEN + (B > 0 ? B : FL_LEN) - 1) / (B > 0 ? B : FL_LEN);
    Batch b;
    if (B > 0) batch_alloc_paged(&b, FL_SEQ, 256, B, per);
    else batch_alloc(&b, FL_SEQ, 256);
    b.cu_seqlens_q[0] = 0;
    for (int k = 0; k < FL_SEQ; k++) {
        const int s = order[step][k];
        const int n = step == 0 ? first[s] : ncomp[s] < plen[s] ? plen[s] - ncomp[s] : 1;
        for (int j = 0; j < n; j++) {
            const int row = b.n_tokens + j, pos = ncomp[s] + j;
            // the pool: sequence s's block kb is 1 + kb * FL_SEQ + s (interleaved across sequences)
            b.token_ids[row] = toks[s][pos], b.positions[row] = pos;
            b.slot_mapping[row] = B > 0 ? (1 + (pos / B) * FL_SEQ + s) * B + pos % B : s * FL_LEN + pos;
        }
        b.n_tokens += n;
        const int L = ncomp[s] + n;
        if (B > 0)
            for (int kb = 0; kb < (L + B - 1) / B; kb++) b.block_tables[(size_t)b.n_seqs * b.bt_stride + kb] = 1 + kb * FL_SEQ + s;
        b.seq_lens_k[b.n_seqs] = L, b.seq_slot[b.n_seqs] = B > 0 ? 0 : s;
        b.cu_seqlens_q[++b.n_seqs] = b.n_tokens;
        if (L >= plen[s]) owner[b.n_logits] = s, multi[b.n_logits] = n > 1, b.logit_rows[b.n_logits++] = b.n_tokens - 1;
        ncomp[s] = L;
    }
    cr_assert_eq(gpu_runner_forward(g, &b, logits, NULL), 0, "B=%d step %d", B, step);
    *n_logits = b.n_logits;
    batch_free(&b);
}

static void flash_vs_gemm(const char *json) {
    ModelConfig cfg;
    char err[512];
    cr_assert_eq(hf_config_parse(json, "test model", &cfg, err, sizeof err), 0, "%s", err);
    GpuModel *gm = gpu_model_random(&cfg, ST_BF16, 11, err, sizeof err);
    cr_assert(gm, "%s", err);
    const int V = cfg.vocab;
    // runners: 0 slots GEMM, 1 slots flash, 2 paged B=16 flash, 3 paged B=1 flash, 4 paged B=16 GEMM
    const int Bs[5] = {0, 0, 16, 1, 16}, mode[5] = {PREFILL_GEMM, PREFILL_FLASH, PREFILL_FLASH, PREFILL_FLASH, PREFILL_GEMM};
    GpuRunner *g[5];
    for (int k = 0; k < 5; k++) {
        g[k] = Bs[k] > 0 ? gpu_runner_new_paged(gm, 1 + FL_SEQ * ((FL_LEN + Bs[k] - 1) / Bs[k]), Bs[k], FL_LEN, 256, err, sizeof err)
                         : gpu_runner_new(gm, FL_SEQ, FL_LEN, 256, err, sizeof err);
        cr_assert(g[k], "%s", err);
        cr_assert_eq(gpu_runner_set_prefill_attn(g[k], mode[k]), mode[k], "runner %d: the path in effect", k);
    }
    int toks[FL_SEQ][FL_LEN];
    Rng r;
    rng_seed(&r, 4242);
    for (int s = 0; s < FL_SEQ; s++)
        for (int j = 0; j < FL_LEN; j++) toks[s][j] = (int)(rng_u32(&r) % (unsigned)V);
    int ncomp[5][FL_SEQ] = {{0}};
    float *lg[5];
    for (int k = 0; k < 5; k++) lg[k] = malloc((size_t)FL_SEQ * V * 4);
    double worst = 0;
    int compared = 0, greedy_same = 0, greedy_cmp = 0, chunk_rows = 0;
    for (int step = 0; step < FL_STEPS; step++) {
        int owner[5][FL_SEQ], multi[5][FL_SEQ], nl[5];
        for (int k = 0; k < 5; k++) flash_step(g[k], Bs[k], step, toks, ncomp[k], lg[k], owner[k], multi[k], &nl[k]);
        for (int k = 1; k < 5; k++) cr_assert_eq(nl[k], nl[0]);
        for (int i = 0; i < nl[0]; i++) {
            const size_t o = (size_t)i * V;
            if (multi[0][i]) {  // a chunk's row: the long path, the same kernel on both layouts
                cr_expect(!memcmp(lg[1] + o, lg[2] + o, (size_t)V * 4), "step %d row %d: flash on slots and on a B=16 pool differ", step, i);
                cr_expect(!memcmp(lg[1] + o, lg[3] + o, (size_t)V * 4), "step %d row %d: flash on slots and on a B=1 pool differ", step, i);
                cr_expect(!memcmp(lg[0] + o, lg[4] + o, (size_t)V * 4), "step %d row %d: the GEMM path on slots and paged differ", step, i);
                chunk_rows++;
            } else {
                for (int k = 2; k < 5; k++) {
                    const double e = compare_f32(lg[k] + o, lg[k == 4 ? 0 : 1] + o, V).max_rel;
                    cr_expect(e <= 2e-2, "step %d decode row %d: runner %d vs the slots %.3e", step, i, k, e);
                }
            }
        }
        for (int i = 0; i < nl[0]; i++) {
            const float *a = lg[0] + (size_t)i * V, *f = lg[1] + (size_t)i * V;
            const double e = compare_f32(f, a, V).max_rel;
            worst = e > worst ? e : worst;
            cr_expect(e <= 2e-2, "step %d logit row %d: flash vs GEMM path max_rel %.3e", step, i, e);
            compared++;
            // greedy: the same token unless GEMM's top two are within the rounding of the two paths
            const int ta = argmax_f32(a, V), tf = argmax_f32(f, V);
            float second = -INFINITY;
            for (int v = 0; v < V; v++) if (v != ta && a[v] > second) second = a[v];
            if (a[ta] - second > 4e-2f * fabsf(a[ta])) {
                cr_expect_eq(tf, ta, "step %d row %d: flash's greedy token %d, the GEMM path's %d", step, i, tf, ta);
                greedy_cmp++, greedy_same += tf == ta;
            }
        }
        // the next step's tokens: the GEMM path's greedy choice, fed to every runner alike
        for (int i = 0; i < nl[0]; i++) {
            const int s = owner[0][i];
            if (ncomp[0][s] < FL_LEN) toks[s][ncomp[0][s]] = argmax_f32(lg[0] + (size_t)i * V, V);
        }
    }
    fprintf(stderr, "[prefill-flash] H=%d KV=%d hd=%d: %d logit rows, flash vs GEMM worst max_rel %.3e, greedy %d/%d; "
            "the %d chunk rows compared bit for bit between slots and pools\n", cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
            compared, worst, greedy_same, greedy_cmp, chunk_rows);
    cr_expect(chunk_rows >= 3, "the schedule compared only %d chunk rows", chunk_rows);
    for (int k = 0; k < 5; k++) gpu_runner_free(g[k]), free(lg[k]);
    gpu_model_free(gm);
}

Test(step05_gpu, prefill_flash_matches_gemm_path_on_slots_and_pools, .timeout = 300) {
    NEED_GPU();
    if (gi_.cc_major < 8) cr_skip_test("flash's tensor-core versions need sm_80+ (this device: sm_%d%d)", gi_.cc_major, gi_.cc_minor);
    flash_vs_gemm(FV_JSON);  // Qwen3-style: q/k norm, GQA 2, hd 128
    flash_vs_gemm("{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":512,\"intermediate_size\":1000,"
                  "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"num_key_value_heads\":2,\"vocab_size\":1024,"
                  "\"max_position_embeddings\":4096,\"rms_norm_eps\":1e-5,\"rope_theta\":500000.0}");  // GQA 4, hd 64
}

// Batch-invariant mode (batch_bench --batch-invariant, gpu_runner_set_batch_invariant): the same
// requests scheduled in very different steps (prefix cache on / off, a small token budget that
// cuts prompts into chunks, few seats) give byte-identical greedy outputs on the GPU. Without
// the mode cuBLAS picks its kernel by the step's row count and a token may flip.
static char *bi_run(const char *dir, const char *args, int k) {
    char out[400], cmd[2048];
    snprintf(out, sizeof out, "%s/out%d.jsonl", dir, k);
    snprintf(cmd, sizeof cmd,
             "%s/batch_bench --model tests/data/models/llama_gqa_hd_bf16 --trace nano --num-requests 24 --shared-prefix 40 "
             "--input-len 4:24 "
             "--output-len 24:40 --device cuda --kv paged --batch-invariant --outputs %s %s > %s/log%d.txt 2>&1",
             BUILD_BIN_DIR, out, args, dir, k);
    cr_assert_eq(system(cmd), 0, "%s failed (see %s/log%d.txt)", cmd, dir, k);
    char *s = test_slurp(out, NULL);
    cr_assert(s, "%s: no outputs written", out);
    return s;
}

Test(step05_gpu, batch_invariant_outputs_do_not_depend_on_the_batching, .timeout = 300) {
    NEED_GPU();
    char dir[] = "/tmp/step05_bi_XXXXXX";
    cr_assert(mkdtemp(dir));
    const char *runs[] = {"--prefix-cache on", "--prefix-cache off", "--prefix-cache off --max-num-batched-tokens 48",
                          "--prefix-cache on --max-num-seqs 3", "--prefix-cache on --block-size 1"};
    char *want = bi_run(dir, runs[0], 0);
    cr_expect(strstr(want, "{\"index\":0,\"output_ids\":[") == want, "outputs line 0: %.60s", want);
    for (int k = 1; k < 5; k++) {
        char *got = bi_run(dir, runs[k], k);
        cr_expect_str_eq(got, want, "batch-invariant: %s gives other outputs than %s", runs[k], runs[0]);
        free(got);
    }
    free(want);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}
