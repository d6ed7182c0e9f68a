// sample_keyed.c — one draw per (request, position), independent of the batch (batch.h).
//
// step03's sampler draws from one PCG32 per sequence, advanced once per token: a sampled token
// then depends on how many draws came before it. Here the generator is re-seeded for every token
// from a hash of (seed, request index, position), so the draw for position p of request i is
// the same in every batch, every step order and every chunking.
#include "step04_batching/batch.h"

#include "rng.h"

static uint64_t mix64(uint64_t x) {  // the splitmix64 finalizer: every input bit reaches every output bit
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

int sample_keyed(Sampler *s, const SamplerParams *sp, int request_index, int position, const float *logits) {
    s->p = *sp;
    const uint64_t key = mix64(mix64(mix64(sp->seed) ^ (uint64_t)(uint32_t)request_index) ^ (uint64_t)(uint32_t)position);
    rng_seed(&s->rng, key);
    return sampler_sample(s, logits);
}
