/* Deterministic random numbers: splitmix64 seeding a xoshiro256** generator.
 * Same seed, same stream on every machine (mkmodel relies on this for
 * byte-identical files). */
#ifndef TM_CORE_RNG_H
#define TM_CORE_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct tm_rng {
    uint64_t s[4];
} tm_rng;

static inline uint64_t tm_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void tm_rng_seed(tm_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = tm_splitmix64(&seed);
}

static inline uint64_t tm_rng_rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static inline uint64_t tm_rng_u64(tm_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = tm_rng_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = tm_rng_rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 24 bits of precision. */
static inline float tm_rng_f32(tm_rng *r) {
    return (float)(tm_rng_u64(r) >> 40) * (1.0f / 16777216.0f);
}

/* Uniform in [0, 1) with 53 bits of precision. */
static inline double tm_rng_f64(tm_rng *r) {
    return (double)(tm_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Standard normal (Box-Muller; one value per call keeps the stream simple). */
static inline float tm_rng_normal(tm_rng *r) {
    double u1 = tm_rng_f64(r), u2 = tm_rng_f64(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

#endif
