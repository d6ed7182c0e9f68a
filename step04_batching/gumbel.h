// gumbel.h — keyed sampling by the Gumbel-max trick, shared by the C reference and the CUDA kernel.
//
// Drawing a token from softmax(logits / T) needs, done directly, the whole distribution: a
// softmax over the vocabulary, then one uniform u walked along the cumulative sum (step03's
// sampler sorts the vocabulary first). The Gumbel-max trick needs neither the sum nor a sort:
//     token = argmax_i ( logits[i] / T + g_i ),   g_i = -log(-log(u_i)),  u_i ~ U(0, 1)
// gives token i with probability exactly softmax(logits / T)[i] (the maximum of Gumbel-perturbed
// log-probabilities is distributed as the softmax; the normalizer log sum exp is the same for
// every i and drops out of the argmax). So a GPU samples with one pass, the same reduction as its
// greedy argmax, and no logits leave the device.
//
// u_i comes from a hash of (key, i): key = sample_key(seed, request index, position), so the
// token drawn at position p of request r is the same in every batch, step and chunking, and the
// CPU and the GPU draw the same noise (they compute the same fp32 expression; logf may differ in
// the last bit between the two libraries, which flips a token only at an exact near-tie).
#pragma once
#include <stdint.h>

#ifdef __CUDACC__
#define GUMBEL_FN __host__ __device__ static inline
#else
#define GUMBEL_FN static inline
#endif

GUMBEL_FN uint64_t gumbel_mix64(uint64_t x) {  // the splitmix64 finalizer: every input bit reaches every output bit
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

// The key of one draw: request `request_index` of a run seeded `seed`, at token position `position`.
GUMBEL_FN uint64_t sample_key(uint64_t seed, int request_index, int position) {
    return gumbel_mix64(gumbel_mix64(gumbel_mix64(seed) ^ (uint64_t)(uint32_t)request_index) ^ (uint64_t)(uint32_t)position);
}

// u in (0, 1): the top 24 bits of the hash of (key, id), centred in their bucket (never 0 or 1),
// exact in fp32.
GUMBEL_FN float gumbel_uniform(uint64_t key, int id) {
    const uint64_t h = gumbel_mix64(key ^ ((uint64_t)(uint32_t)id * 0x9e3779b97f4a7c15ULL));
    return ((float)(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
}
