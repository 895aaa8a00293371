/* One batched decode forward of a Llama-family model (RMSNorm, RoPE, grouped-query attention,
   SwiGLU; no biases) on the CPU, reading weights and the paged K/V pools where MLX keeps them.
   Built at first use by engine/runner/cpu/cpu_decode.py with the model's sizes as macros; the matmuls go to the
   process's cblas_sgemm (OpenBLAS). Writes only the new tokens' K/V slots and the logits.

   Pools (KVH, NB, BS, HD) per layer: token pos of row b lives at block tables[b][pos / BS],
   slot pos % BS. Row b's new token is at positions[b]; it attends to positions 0..positions[b]. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Set by the build: H hidden, NQ query heads, KVH K/V heads, HD head dim, FF MLP width, BS block
   size, NL layers, VOCAB vocabulary, EPS and ROPE_BASE as float literals. */
#define REP (NQ / KVH)
#define HALF (HD / 2)

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

static void attend(const float *q, const float *kp, const float *vp, const int32_t *table, int len,
                   float *out, float scale) {
    /* REP query heads of one K/V head over its len tokens, block by block with an online softmax */
    float qs[REP][HD], acc[REP][HD], m[REP], l[REP], s[REP][BS];
    for (int r = 0; r < REP; r++) {
        for (int d = 0; d < HD; d++) qs[r][d] = q[r * HD + d] * scale, acc[r][d] = 0.f;
        m[r] = -FLT_MAX, l[r] = 0.f;
    }
    int num_blocks = (len + BS - 1) / BS;
    for (int j = 0; j < num_blocks; j++) {
        const float *kb = kp + (size_t)table[j] * BS * HD, *vb = vp + (size_t)table[j] * BS * HD;
        if (j + 1 < num_blocks) {
            const char *nk = (const char *)(kp + (size_t)table[j + 1] * BS * HD);
            const char *nv = (const char *)(vp + (size_t)table[j + 1] * BS * HD);
            for (int c = 0; c < BS * HD * 4; c += 64) __builtin_prefetch(nk + c), __builtin_prefetch(nv + c);
        }
        int n = len - j * BS < BS ? len - j * BS : BS;
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

/* weights: embed (VOCAB, H), final norm (H), lm head (VOCAB, H), then PER_LAYER per layer.
   pools: K and V of each layer, 2 * NL pointers, each (KVH, pool_blocks, BS, HD).
   Returns 0, or -1 when scratch memory could not be had. */
int decode_forward(sgemm_t sgemm, const float *const *weights, float *const *pools, int pool_blocks,
                   int rows, const int32_t *tokens, const int32_t *positions, const int32_t *tables,
                   int max_blocks, float *logits) {
    const float *embed = weights[0], *final_norm = weights[1], *head = weights[2];
    size_t per_row = 2 * H + 2 * (size_t)NQ * HD + 2 * (size_t)KVH * HD + 2 * (size_t)FF;
    float *buf = malloc(sizeof(float) * per_row * rows);
    if (!buf) return -1;
    float *x = buf, *h = x + (size_t)rows * H, *q = h + (size_t)rows * H, *att = q + (size_t)rows * NQ * HD;
    float *k = att + (size_t)rows * NQ * HD, *v = k + (size_t)rows * KVH * HD;
    float *g = v + (size_t)rows * KVH * HD, *u = g + (size_t)rows * FF;
    const float scale = 1.f / sqrtf((float)HD);
    for (int b = 0; b < rows; b++) memcpy(x + (size_t)b * H, embed + (size_t)tokens[b] * H, H * 4);
    for (int layer = 0; layer < NL; layer++) {
        const float *const *w = weights + 3 + (size_t)layer * PER_LAYER;
        float *kpool = pools[2 * layer], *vpool = pools[2 * layer + 1];
        size_t head_stride = (size_t)pool_blocks * BS * HD;
        rms_norm(x, w[LN1], h, rows);
        linear(sgemm, h, w[WQ], q, rows, NQ * HD, H);
        linear(sgemm, h, w[WK], k, rows, KVH * HD, H);
        linear(sgemm, h, w[WV], v, rows, KVH * HD, H);
        for (int b = 0; b < rows; b++) {
            const int32_t *table = tables + (size_t)b * max_blocks;
            int pos = positions[b];
            rope(q + (size_t)b * NQ * HD, NQ, pos);
            rope(k + (size_t)b * KVH * HD, KVH, pos);
            size_t slot = (size_t)table[pos / BS] * BS + pos % BS;
            for (int hh = 0; hh < KVH; hh++) {
                memcpy(kpool + hh * head_stride + slot * HD, k + ((size_t)b * KVH + hh) * HD, HD * 4);
                memcpy(vpool + hh * head_stride + slot * HD, v + ((size_t)b * KVH + hh) * HD, HD * 4);
            }
        }
        for (int b = 0; b < rows; b++)
            for (int hh = 0; hh < KVH; hh++)
                attend(q + ((size_t)b * NQ + hh * REP) * HD, kpool + hh * head_stride,
                       vpool + hh * head_stride, tables + (size_t)b * max_blocks, positions[b] + 1,
                       att + ((size_t)b * NQ + hh * REP) * HD, scale);
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
