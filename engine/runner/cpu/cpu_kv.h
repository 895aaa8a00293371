/* The C forward's paged K/V pools: writing a row's K/V (quantized as mx.quantize does, with KV_BITS)
   and reading blocks back (cpu_attention.h attends over them).
   Included once, by cpu_decode.c: one translation unit, whose macros (the model's sizes, SIMD_*) it uses. */
#pragma once

/* One K/V head's pool of one layer: rows of ROW 4-byte words (floats, or codes), one per token slot. */
typedef struct {
    void *data;
    float *scales, *biases; /* quantized only: GROUPS per row */
} side_t;

#if KV_BITS
/* One HD vector -> its codes, scales and biases, as MLX's CPU mx.quantize computes them (affine, per
   group): the end of larger magnitude is the bias and code 0, so it round-trips exactly; codes are
   rint((x - bias) / scale) clamped to [0, 2^bits - 1], packed lowest first. Exempt from -ffast-math,
   which changes how the divisions round (codes a step off, measured): the load check compares it
   bit for bit with mx.quantize. */
#if defined(__clang__)
#pragma float_control(precise, on, push)
#define PRECISE
#else
#define PRECISE __attribute__((optimize("no-fast-math")))
#endif
PRECISE static void quantize_vector(const float *x, uint32_t *codes, float *scales, float *biases) {
    const float n_bins = (float)((1 << KV_BITS) - 1);
    for (int g = 0; g < GROUPS; g++) {
        const float *w = x + g * KV_GROUP;
        float lo = w[0], hi = w[0];
        for (int j = 1; j < KV_GROUP; j++) lo = w[j] < lo ? w[j] : lo, hi = w[j] > hi ? w[j] : hi;
        int low_edge = fabsf(lo) > fabsf(hi);
        float scale = fmaxf((hi - lo) / n_bins, 1e-7f);
        scale = low_edge ? scale : -scale;
        float edge = low_edge ? lo : hi, q0 = rintf(edge / scale), bias = 0.f;
        if (q0 != 0.f) scale = edge / q0, bias = edge;
        for (int j = 0; j < KV_GROUP * KV_BITS / 32; j++) {
            uint32_t word = 0;
            for (int k = 0; k < 32 / KV_BITS; k++) {
                float c = rintf((w[j * (32 / KV_BITS) + k] - bias) / scale);
                c = c < 0.f ? 0.f : c > n_bins ? n_bins : c;
                word |= (uint32_t)c << (k * KV_BITS);
            }
            codes[g * KV_GROUP * KV_BITS / 32 + j] = word;
        }
        scales[g] = scale, biases[g] = bias;
    }
}
#if defined(__clang__)
#pragma float_control(pop)
#endif

/* n vectors of HD floats -> their codes (n, ROW), scales and biases (n, GROUPS): what the forward writes
   into a slot, exported so that tests compare it with mx.quantize. */
void kv_quantize(const float *x, int n, uint32_t *codes, float *scales, float *biases) {
    for (int i = 0; i < n; i++)
        quantize_vector(x + (size_t)i * HD, codes + (size_t)i * ROW, scales + (size_t)i * GROUPS,
                        biases + (size_t)i * GROUPS);
}
#endif

static void write_slot(side_t side, size_t slot, const float *x) {
#if KV_BITS
    quantize_vector(x, (uint32_t *)side.data + slot * ROW, side.scales + slot * GROUPS,
                    side.biases + slot * GROUPS);
#else
    memcpy((float *)side.data + slot * HD, x, HD * 4);
#endif
}

/* Block `block`'s first n rows as floats: in place, or dequantized (code * scale + bias) into buf. */
static const float *block_rows(side_t side, int32_t block, int n, float *buf) {
    size_t row0 = (size_t)block * BS;
#if KV_BITS
    const uint8_t *codes = (const uint8_t *)((const uint32_t *)side.data + row0 * ROW);
    const float *sc = side.scales + row0 * GROUPS, *bi = side.biases + row0 * GROUPS;
    for (int t = 0; t < n; t++)
        for (int g = 0; g < GROUPS; g++) {
            const uint8_t *c = codes + (size_t)t * ROW * 4 + g * KV_GROUP * KV_BITS / 8;
            float s = sc[t * GROUPS + g], b = bi[t * GROUPS + g], *o = buf + t * HD + g * KV_GROUP;
#if KV_BITS == 8
            for (int j = 0; j < KV_GROUP; j++) o[j] = (float)c[j] * s + b;
#else
            for (int j = 0; j < KV_GROUP / 2; j++)
                o[2 * j] = (float)(c[j] & 15) * s + b, o[2 * j + 1] = (float)(c[j] >> 4) * s + b;
#endif
        }
    return buf;
#else
    (void)n, (void)buf;
    return (const float *)side.data + row0 * HD;
#endif
}

/* Slot `slot`'s row of a pool into cache: attention spreads the next block's over the current one's
   positions (a block's 128 lines at once stall on the cache's fill buffers). */
static inline void prefetch_row(side_t side, size_t slot) {
    const char *row = (const char *)((const float *)side.data + slot * ROW);
    for (int c = 0; c < ROW * 4; c += 64) __builtin_prefetch(row + c);
#if KV_BITS
    __builtin_prefetch(side.scales + slot * GROUPS), __builtin_prefetch(side.biases + slot * GROUPS);
#endif
}

static void prefetch_block(side_t side, int32_t block) {
    const char *rows = (const char *)((const float *)side.data + (size_t)block * BS * ROW);
    for (int c = 0; c < BS * ROW * 4; c += 64) __builtin_prefetch(rows + c);
#if KV_BITS
    const char *sc = (const char *)(side.scales + (size_t)block * BS * GROUPS);
    const char *bi = (const char *)(side.biases + (size_t)block * BS * GROUPS);
    for (int c = 0; c < BS * GROUPS * 4; c += 64) __builtin_prefetch(sc + c), __builtin_prefetch(bi + c);
#endif
}

/* The pools' pointers of layer `layer`, side 0 (K) or 1 (V), head hh. */
static side_t head_side(void *const *pools, int layer, int which, int hh, int pool_blocks) {
    void *const *p = pools + ((size_t)layer * 2 + which) * PARTS;
    side_t side = {(float *)p[0] + (size_t)hh * pool_blocks * BS * ROW, NULL, NULL};
#if KV_BITS
    side.scales = (float *)p[1] + (size_t)hh * pool_blocks * BS * GROUPS;
    side.biases = (float *)p[2] + (size_t)hh * pool_blocks * BS * GROUPS;
#endif
    return side;
}
