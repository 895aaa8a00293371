/* One batched decode forward of a Llama-family model (RMSNorm, RoPE, grouped-query attention,
   SwiGLU; no biases) on the CPU, reading weights and the paged K/V pools where MLX keeps them.
   Built at first use by engine/runner/cpu/cpu_decode.py with the model's sizes as macros; the matmuls go to the
   process's cblas_sgemm (OpenBLAS). Writes only the new tokens' K/V slots and the logits.

   Pools (KVH, NB, BS, HD) per layer: token pos of row b lives at block tables[b][pos / BS],
   slot pos % BS. Row b's new token is at positions[b]; it attends to positions 0..positions[b].
   Built with KV_BITS 8 or 4, each pool is three (engine/runner/kv_quant.py): codes (KVH, NB, BS,
   HD * KV_BITS / 32) uint32, and scales and biases (KVH, NB, BS, HD / KV_GROUP) float; a new K/V
   vector is quantized as mx.quantize does it, and attention dequantizes each block it reads. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Set by the build: H hidden, NQ query heads, KVH K/V heads, HD head dim, FF MLP width, BS block
   size, NL layers, VOCAB vocabulary, EPS and ROPE_BASE as float literals; KV_BITS and KV_GROUP for
   quantized pools. */
#define REP (NQ / KVH)
#define HALF (HD / 2)
#ifndef KV_BITS
#define KV_BITS 0 /* the pools hold float K/V */
#endif
#if KV_BITS
#define GROUPS (HD / KV_GROUP)
#define ROW (HD * KV_BITS / 32) /* uint32 words of one token's codes */
#define PARTS 3                 /* codes, scales, biases */
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "dequantize reads a word's codes byte by byte, lowest code first: little-endian only"
#endif
#else
#define ROW HD
#define PARTS 1
#endif

enum { CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112 };
typedef void (*sgemm_t)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                        float, float *, int);

/* Per layer, in this order. */
enum { LN1, WQ, WK, WV, WO, LN2, WG, WU, WD, PER_LAYER };

static void linear(sgemm_t sgemm, const float *x, const float *w, float *y, int rows, int out, int in) {
    /* y = x @ w.T, w (out, in) row-major as nn.Linear keeps it */
    sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, in, 1.f, x, in, w, in, 0.f, y, out);
}

static void rms_norm(const float *x, const float *w, float *y, int rows) {
    for (int b = 0; b < rows; b++) {
        const float *xr = x + (size_t)b * H;
        float ss = 0.f;
        for (int i = 0; i < H; i++) ss += xr[i] * xr[i];
        float inv = 1.f / sqrtf(ss / H + EPS);
        for (int i = 0; i < H; i++) y[(size_t)b * H + i] = w[i] * (xr[i] * inv);
    }
}

static void rope(float *x, int heads, int pos) {
    /* non-traditional RoPE: element i pairs with i + HD/2 */
    for (int i = 0; i < HALF; i++) {
        float freq = expf(-(float)i * (logf(ROPE_BASE) / HALF));
        float theta = (float)pos * freq, c = cosf(theta), s = sinf(theta);
        for (int h = 0; h < heads; h++) {
            float *v = x + (size_t)h * HD;
            float a = v[i], b = v[i + HALF];
            v[i] = a * c - b * s;
            v[i + HALF] = a * s + b * c;
        }
    }
}

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

static void prefetch_block(side_t side, int32_t block) {
    const char *rows = (const char *)((const float *)side.data + (size_t)block * BS * ROW);
    for (int c = 0; c < BS * ROW * 4; c += 64) __builtin_prefetch(rows + c);
#if KV_BITS
    const char *sc = (const char *)(side.scales + (size_t)block * BS * GROUPS);
    const char *bi = (const char *)(side.biases + (size_t)block * BS * GROUPS);
    for (int c = 0; c < BS * GROUPS * 4; c += 64) __builtin_prefetch(sc + c), __builtin_prefetch(bi + c);
#endif
}

static void attend(const float *q, side_t kp, side_t vp, const int32_t *table, int len, float *out,
                   float scale, float *scratch) {
    /* REP query heads of one K/V head over its len tokens, block by block with an online softmax;
       scratch: 2 * BS * HD floats for a quantized block's dequantized rows */
    float qs[REP][HD], acc[REP][HD], m[REP], l[REP], s[REP][BS];
    for (int r = 0; r < REP; r++) {
        for (int d = 0; d < HD; d++) qs[r][d] = q[r * HD + d] * scale, acc[r][d] = 0.f;
        m[r] = -FLT_MAX, l[r] = 0.f;
    }
    int num_blocks = (len + BS - 1) / BS;
    for (int j = 0; j < num_blocks; j++) {
        if (j + 1 < num_blocks) prefetch_block(kp, table[j + 1]), prefetch_block(vp, table[j + 1]);
        int n = len - j * BS < BS ? len - j * BS : BS;
        const float *kb = block_rows(kp, table[j], n, scratch);
        const float *vb = block_rows(vp, table[j], n, scratch + BS * HD);
        for (int t = 0; t < n; t++)
            for (int r = 0; r < REP; r++) {
                float dot = 0.f;
                for (int d = 0; d < HD; d++) dot += qs[r][d] * kb[t * HD + d];
                s[r][t] = dot;
            }
        for (int r = 0; r < REP; r++) {
            float top = m[r], sum = 0.f;
            for (int t = 0; t < n; t++) top = s[r][t] > top ? s[r][t] : top;
            float c = expf(m[r] - top);
            for (int t = 0; t < n; t++) s[r][t] = expf(s[r][t] - top), sum += s[r][t];
            l[r] = l[r] * c + sum, m[r] = top;
            for (int d = 0; d < HD; d++) acc[r][d] *= c;
        }
        for (int t = 0; t < n; t++)
            for (int r = 0; r < REP; r++)
                for (int d = 0; d < HD; d++) acc[r][d] += s[r][t] * vb[t * HD + d];
    }
    for (int r = 0; r < REP; r++)
        for (int d = 0; d < HD; d++) out[r * HD + d] = acc[r][d] / l[r];
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

/* weights: embed (VOCAB, H), final norm (H), lm head (VOCAB, H), then PER_LAYER per layer.
   pools: per layer K then V, each PARTS pointers (data; and scales, biases where quantized), each array
   (KVH, pool_blocks, BS, width). Returns 0, or -1 when scratch memory could not be had. */
int decode_forward(sgemm_t sgemm, const float *const *weights, void *const *pools, int pool_blocks,
                   int rows, const int32_t *tokens, const int32_t *positions, const int32_t *tables,
                   int max_blocks, float *logits) {
    const float *embed = weights[0], *final_norm = weights[1], *head = weights[2];
    size_t per_row = 2 * H + 2 * (size_t)NQ * HD + 2 * (size_t)KVH * HD + 2 * (size_t)FF;
    float *buf = malloc(sizeof(float) * (per_row * rows + 2 * (size_t)BS * HD));
    if (!buf) return -1;
    float *x = buf, *h = x + (size_t)rows * H, *q = h + (size_t)rows * H, *att = q + (size_t)rows * NQ * HD;
    float *k = att + (size_t)rows * NQ * HD, *v = k + (size_t)rows * KVH * HD;
    float *g = v + (size_t)rows * KVH * HD, *u = g + (size_t)rows * FF, *blocks = u + (size_t)rows * FF;
    const float scale = 1.f / sqrtf((float)HD);
    for (int b = 0; b < rows; b++) memcpy(x + (size_t)b * H, embed + (size_t)tokens[b] * H, H * 4);
    for (int layer = 0; layer < NL; layer++) {
        const float *const *w = weights + 3 + (size_t)layer * PER_LAYER;
        rms_norm(x, w[LN1], h, rows);
        linear(sgemm, h, w[WQ], q, rows, NQ * HD, H);
        linear(sgemm, h, w[WK], k, rows, KVH * HD, H);
        linear(sgemm, h, w[WV], v, rows, KVH * HD, H);
        /* Every row's K/V is written before any row attends: rows of one sequence at consecutive
           positions (drafts to verify) read each other's. */
        for (int b = 0; b < rows; b++) {
            const int32_t *table = tables + (size_t)b * max_blocks;
            int pos = positions[b];
            rope(q + (size_t)b * NQ * HD, NQ, pos);
            rope(k + (size_t)b * KVH * HD, KVH, pos);
            size_t slot = (size_t)table[pos / BS] * BS + pos % BS;
            for (int hh = 0; hh < KVH; hh++) {
                size_t at = ((size_t)b * KVH + hh) * HD;
                write_slot(head_side(pools, layer, 0, hh, pool_blocks), slot, k + at);
                write_slot(head_side(pools, layer, 1, hh, pool_blocks), slot, v + at);
            }
        }
        for (int b = 0; b < rows; b++)
            for (int hh = 0; hh < KVH; hh++)
                attend(q + ((size_t)b * NQ + hh * REP) * HD, head_side(pools, layer, 0, hh, pool_blocks),
                       head_side(pools, layer, 1, hh, pool_blocks), tables + (size_t)b * max_blocks,
                       positions[b] + 1, att + ((size_t)b * NQ + hh * REP) * HD, scale, blocks);
        linear(sgemm, att, w[WO], h, rows, H, NQ * HD);
        for (size_t i = 0; i < (size_t)rows * H; i++) x[i] += h[i];
        rms_norm(x, w[LN2], h, rows);
        linear(sgemm, h, w[WG], g, rows, FF, H);
        linear(sgemm, h, w[WU], u, rows, FF, H);
        for (size_t i = 0; i < (size_t)rows * FF; i++) g[i] = g[i] / (1.f + expf(-g[i])) * u[i];
        linear(sgemm, g, w[WD], h, rows, H, FF);
        for (size_t i = 0; i < (size_t)rows * H; i++) x[i] += h[i];
    }
    rms_norm(x, final_norm, h, rows);
    linear(sgemm, h, head, logits, rows, VOCAB, H);
    free(buf);
    return 0;
}
