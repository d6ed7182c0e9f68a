// rng.h — a small seeded random number generator (PCG32), identical on every platform,
// so that "seed 42" means the same inputs on a laptop, in CI and on the GPU machine.
// defines: Rng, rng_seed, rng_u32, rng_uniform, rng_normal, rng_fill_uniform, rng_fill_normal,
//          rng_new_uniform, rng_new_normal
#pragma once
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t state;
    uint64_t inc;
} Rng;

void rng_seed(Rng *r, uint64_t seed);
uint32_t rng_u32(Rng *r);
float rng_uniform(Rng *r);  // in [0, 1)
float rng_normal(Rng *r);   // standard normal (Box-Muller)
void rng_fill_uniform(Rng *r, float *x, size_t n, float lo, float hi);
void rng_fill_normal(Rng *r, float *x, size_t n, float mean, float std);
// A new (malloc'ed, free with free) array of n random values; exits if out of memory.
float *rng_new_uniform(Rng *r, size_t n, float lo, float hi);
float *rng_new_normal(Rng *r, size_t n, float mean, float std);

#ifdef __cplusplus
}
#endif
