// sample_keyed.c — one draw per (request, position), independent of the batch (batch.h).
//
// step03's sampler draws from one PCG32 per sequence, advanced once per token: a sampled token
// then depends on how many draws came before it. Here every draw is keyed by a hash of (seed,
// request index, position) (gumbel.h's sample_key), so the draw for position p of request i is
// the same in every batch, every step order and every chunking:
//   - temperature only (no top-k / top-p / min-p): the Gumbel-max draw of gumbel.h, the one the
//     CUDA runner computes on the device (runner_forward_sampled), so both give the same token;
//   - with filters: step03's sampler, its generator re-seeded from the key for this one draw.
#include <math.h>

#include "step04_batching/batch.h"
#include "step04_batching/gumbel.h"

#include "rng.h"

int sample_gumbel(const float *logits, int vocab, float temperature, uint64_t key) {
    int best = 0;
    float bv = -INFINITY;
    for (int i = 0; i < vocab; i++) {
        const float s = logits[i] / temperature - logf(-logf(gumbel_uniform(key, i)));
        if (s > bv) bv = s, best = i;  // the first maximum; NaN never wins
    }
    return best;
}

int sample_is_plain(const SamplerParams *sp) {
    return !sp->greedy && sp->temperature > 0 && sp->top_k <= 0 && sp->top_p >= 1 && sp->min_p <= 0;
}

int sample_keyed(Sampler *s, const SamplerParams *sp, int request_index, int position, const float *logits) {
    const uint64_t key = sample_key(sp->seed, request_index, position);
    if (sample_is_plain(sp)) return sample_gumbel(logits, s->vocab, sp->temperature, key);
    s->p = *sp;
    rng_seed(&s->rng, key);
    return sampler_sample(s, logits);
}
