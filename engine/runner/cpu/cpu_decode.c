/* One batched forward of a Llama-family model (RMSNorm, RoPE, grouped-query attention, SwiGLU; no
   biases) on the CPU, reading weights and the paged K/V pools where MLX keeps them. Rows are tokens at
   their positions: one per decode row, or a prefill chunk's tokens as rows of one sequence at
   consecutive positions. Built at first use by engine/runner/cpu/cpu_decode.py with the model's sizes as
   macros and -march=native (this machine's CPU picks the vector code). Writes only the rows' K/V slots
   and the logits of the rows asked for. With threads > 1 (configure), one helper thread shares the
   loops (parallel_for), pulling items as it can: the caller never waits for a helper that has not
   started, so a helper the OS has not scheduled (2 cores shared with the server's other processes)
   costs nothing but its help.

   Weights are float32 (the matmuls go to the process's cblas_sgemm/sgemv: OpenBLAS), or MLX's affine
   codes (4 or 8 bits, packed lowest first in uint32 words, a float32 scale and bias per group of 32,
   64 or 128), which the forward reads as they are: a few rows go through qgemm_direct, which reads each
   code once for all rows; more rows dequantize tiles of weights for cblas_sgemm (qgemm_tiles). The row
   counts that go through qgemm_direct are measured at load (configure's direct_min to direct_rows: one
   row may go to OpenBLAS's sgemv where its kernel reads memory faster).

   Pools (KVH, NB, BS, HD) per layer: token pos of row b lives at block tables[b][pos / BS],
   slot pos % BS. Row b's new token is at positions[b]; it attends to positions 0..positions[b].
   Built with KV_BITS 8 or 4, each pool is three (engine/runner/kv_quant.py): codes (KVH, NB, BS,
   HD * KV_BITS / 32) uint32, and scales and biases (KVH, NB, BS, HD / KV_GROUP) float; a new K/V
   vector is quantized as mx.quantize does it, and attention dequantizes each block it reads.

   One translation unit in nine files: this one (sizes, settings, the forward), cpu_pool.h (the helper
   thread), cpu_amx.h (products of exact 4-bit weights on AMX), cpu_tiles.h (vector kernels),
   cpu_pack.h (float32 weights kept in fewer bytes, exactly), cpu_matmul.h (the matmuls), cpu_kv.h (the
   pools), cpu_attention.h (attention over them) and cpu_greedy.h (greedy rows' tokens through a
   screened head). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SIMD_AVX2 1
#if defined(__AVX512F__)
#define SIMD_AVX512 1 /* the own matmuls' vectors (fvec) go 16 floats wide */
#endif
#endif

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
#else
#define ROW HD
#define PARTS 1
#endif
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "codes are read byte by byte, lowest code first: little-endian only"
#endif
#define MAX3(a, b, c) ((a) > (b) ? ((a) > (c) ? (a) : (c)) : ((b) > (c) ? (b) : (c)))
#define MAX_IN MAX3(H, NQ * HD, FF) /* the widest input of a matmul */
#define TILE 512                    /* output channels dequantized at once for cblas_sgemm */
#define MAX_DIRECT 32               /* most rows qgemm_direct takes */
#define WORKERS 2                   /* the caller and one helper thread (parallel_for) */

enum { CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112 };
typedef void (*sgemm_t)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                        float, float *, int);
typedef void (*sgemv_t)(int, int, int, int, float, const float *, int, const float *, int, float, float *,
                        int);

/* Per layer, in this order. */
enum { LN1, WQ, WK, WV, WO, LN2, WG, WU, WD, PER_LAYER };

/* A weight as MLX keeps it: floats (bits 0), or codes with a scale and bias per group. `exact`: float32
   weights kept in a smaller form that weight_row expands back bit for bit (cpu_pack.h): bfloat16 words
   (bits 16, group 0), 4-bit affine codes, or signed 8-bit codes with a scale (no bias); the own matmuls
   then run the float32 path's tile code on expanded tiles, and sgemm reads the float32 weights
   themselves. */
typedef struct {
    const void *w;
    const float *s, *b;
    int bits, group, exact;
    const float *f32; /* an exact packing's float32 weights, for sgemm: the float32 path's very call */
    void *onednn;     /* the float32 weights packed for oneDNN's matmul (onednn.c), or NULL */
    void *amx;        /* an exact 4-bit packing's AMX tiles (cpu_amx.h), or NULL */
} mat_t;

/* onednn.c's entry points (configure_onednn), NULL where the forward's many-row products go to sgemm. */
typedef int (*onednn_ready_t)(void *weight, int rows);
typedef int (*onednn_blocks_t)(void *weight);
typedef int (*onednn_rows_t)(void *weight, int block, const float *x, float *y, int rows);
static onednn_ready_t g_onednn_ready;
static onednn_blocks_t g_onednn_blocks;
static onednn_rows_t g_onednn_rows;
static void *const *g_onednn; /* per weight of the forward's list: its packed copy, or NULL */
static void *const *g_amx;    /* per weight of the forward's list: its AMX tiles (cpu_amx.h), or NULL */

/* Weight `i` of the forward's list: four pointers (data; scales and biases, or NULL; the float32 weights
   an exact packing holds, or NULL) and two formats (bits, group) each; bits below 0 mark an exact
   packing. */
static mat_t weight_at(const void *const *weights, const int32_t *formats, size_t i) {
    const int bits = formats[2 * i];
    mat_t m = {weights[4 * i],      weights[4 * i + 1], weights[4 * i + 2], bits < 0 ? -bits : bits,
               formats[2 * i + 1], bits < 0,           weights[4 * i + 3], g_onednn ? g_onednn[i] : NULL,
               g_amx ? g_amx[i] : NULL};
    return m;
}

static sgemm_t g_sgemm;
static sgemv_t g_sgemv;
static int g_threads = 1, g_direct_min = 1, g_direct_rows = MAX_DIRECT;

/* Called before each forward: the BLAS entry points (sgemv may be NULL), the threads of the work-sharing
   pool, and the row counts (direct_min to direct_rows) whose matmuls read weights directly instead of
   calling OpenBLAS (measured at load). */
void configure(sgemm_t sgemm, sgemv_t sgemv, int threads, int direct_min, int direct_rows) {
    g_sgemm = sgemm, g_sgemv = sgemv;
    g_threads = threads < 1 ? 1 : threads > WORKERS ? WORKERS : threads;
    g_direct_min = direct_min < 1 ? 1 : direct_min;
    g_direct_rows = direct_rows < 0 ? 0 : direct_rows > MAX_DIRECT ? MAX_DIRECT : direct_rows;
}

/* Called after configure where the float32 weights have oneDNN copies (onednn.py): the entry points and
   one pointer per weight of the forward's list (NULL: sgemm); NULL entry points turn it off. */
void configure_onednn(onednn_ready_t ready, onednn_blocks_t blocks, onednn_rows_t rows, void *const *weights) {
    g_onednn_ready = ready, g_onednn_blocks = blocks, g_onednn_rows = rows;
    g_onednn = ready && blocks && rows ? weights : NULL;
}

static int g_amx_many;               /* rows past the own matmuls' go to the 32-row AMX kernel (cpu_amx.h) */
static int g_amx_few_min = 1 << 30; /* decode rows from which the few-row AMX kernel runs */

/* Called after configure: one pointer per weight of the forward's list, its AMX tiles (amx_pack) or NULL
   (NULL turns AMX off); whether rows past the own matmuls' go to AMX (`many`), and the row count from
   which decode rows (up to 16) go to AMX's few-row kernel instead of the own matmuls (above 16: never). */
void configure_amx(void *const *weights, int many, int few_min) {
    g_amx = weights, g_amx_many = many, g_amx_few_min = few_min;
}

static inline int direct(int rows) { return rows >= g_direct_min && rows <= g_direct_rows; }

#include "cpu_pool.h"
#include "cpu_amx.h"
#include "cpu_tiles.h"
#include "cpu_pack.h"
#include "cpu_matmul.h"
#include "cpu_kv.h"
#include "cpu_attention.h"
#include "cpu_greedy.h"

static void rms_norm(const float *x, const float *w, float *y, int rows) {
    for (int b = 0; b < rows; b++) {
        const float *xr = x + (size_t)b * H;
        float ss = 0.f;
        for (int i = 0; i < H; i++) ss += xr[i] * xr[i];
        float inv = 1.f / sqrtf(ss / H + EPS);
        for (int i = 0; i < H; i++) y[(size_t)b * H + i] = w[i] * (xr[i] * inv);
    }
}

/* Row b's RoPE angles, once a forward (every layer turns its q and k by the same): cs[b * HD + i] the
   cosine and cs[b * HD + HALF + i] the sine of position * frequency i. */
static void rope_angles(const int32_t *positions, int rows, float *cs) {
    for (int i = 0; i < HALF; i++) {
        const float freq = expf(-(float)i * (logf(ROPE_BASE) / HALF));
        for (int b = 0; b < rows; b++) {
            const float theta = (float)positions[b] * freq;
            cs[(size_t)b * HD + i] = cosf(theta), cs[(size_t)b * HD + HALF + i] = sinf(theta);
        }
    }
}

static void rope(float *x, int heads, const float *cs) {
    /* non-traditional RoPE: element i pairs with i + HD/2 */
    for (int i = 0; i < HALF; i++) {
        const float c = cs[i], s = cs[HALF + i];
        for (int h = 0; h < heads; h++) {
            float *v = x + (size_t)h * HD;
            float a = v[i], b = v[i + HALF];
            v[i] = a * c - b * s;
            v[i + HALF] = a * s + b * c;
        }
    }
}

/* One layer's rows between the q/k/v products and o_proj, as items of parallel_for. */
typedef struct {
    void *const *pools;
    int pool_blocks, layer, max_blocks;
    const int32_t *positions, *tables;
    float *q, *k, *v, *att, *blocks;
    const float *angles; /* rope_angles' */
} layer_job_t;

/* Row b: RoPE on its q and k, its K/V written to its slot (rows write distinct slots). */
static void write_item(void *ctx, int b, int worker) {
    (void)worker;
    const layer_job_t *job = ctx;
    const int32_t *table = job->tables + (size_t)b * job->max_blocks;
    int pos = job->positions[b];
    rope(job->q + (size_t)b * NQ * HD, NQ, job->angles + (size_t)b * HD);
    rope(job->k + (size_t)b * KVH * HD, KVH, job->angles + (size_t)b * HD);
    size_t slot = (size_t)table[pos / BS] * BS + pos % BS;
    for (int hh = 0; hh < KVH; hh++) {
        size_t kv = ((size_t)b * KVH + hh) * HD;
        write_slot(head_side(job->pools, job->layer, 0, hh, job->pool_blocks), slot, job->k + kv);
        write_slot(head_side(job->pools, job->layer, 1, hh, job->pool_blocks), slot, job->v + kv);
    }
}

/* Row b, K/V head hh: its REP query heads attend; `worker` picks the scratch for dequantized blocks. */
static void attend_item(void *ctx, int item, int worker) {
    const layer_job_t *job = ctx;
    int b = item / KVH, hh = item % KVH;
    attend(job->q + ((size_t)b * NQ + hh * REP) * HD, head_side(job->pools, job->layer, 0, hh, job->pool_blocks),
           head_side(job->pools, job->layer, 1, hh, job->pool_blocks), job->tables + (size_t)b * job->max_blocks,
           job->positions[b] + 1, job->att + ((size_t)b * NQ + hh * REP) * HD, 1.f / sqrtf((float)HD),
           job->blocks + (size_t)worker * 2 * BS * HD);
}

typedef struct {
    float *g;
    const float *u;
    size_t n;
} swiglu_job_t;

#define SWIGLU_ITEM 4096

/* SiLU(g) * u over n floats, into g. */
static void swiglu_span(float *g, const float *u, size_t n) {
    for (size_t i = 0; i < n; i++) g[i] = g[i] / (1.f + expf(-g[i])) * u[i];
}

static void swiglu_item(void *ctx, int item, int worker) {
    (void)worker;
    const swiglu_job_t *job = ctx;
    const size_t first = (size_t)item * SWIGLU_ITEM;
    swiglu_span(job->g + first, job->u + first, (first + SWIGLU_ITEM < job->n ? first + SWIGLU_ITEM : job->n) - first);
}

/* Products of one input that decode rows read directly, as one parallel_for, so that the workers meet
   once instead of at the end of each: q, k and v; or gate and up, where an item computes both for the
   same CHANNELS outputs and then SiLU(gate) * up on them (no loop of its own for SwiGLU). Each output
   channel is the same tile call as linear's, so the values are its bits. */
typedef struct {
    direct_job_t part[3];
    int items[3], gated;
} fused_job_t;

static void fused_item(void *ctx, int item, int worker) {
    fused_job_t *job = ctx;
    if (job->gated) {
        direct_item(&job->part[0], item, worker);
        direct_item(&job->part[1], item, worker);
        const int first = item * CHANNELS, n = (first + CHANNELS < FF ? first + CHANNELS : FF) - first;
        for (int r = 0; r < job->part[0].rows; r++)
            swiglu_span(job->part[0].y + (size_t)r * FF + first, job->part[1].y + (size_t)r * FF + first, n);
        return;
    }
    int p = 0;
    for (; item >= job->items[p]; p++) item -= job->items[p];
    direct_item(&job->part[p], item, worker);
}

/* y[i] = x @ w[i].T for n (2 or 3) weights of `in` inputs and out[i] outputs; `gated` (n = 2, out FF):
   then y[0] = SiLU(y[0]) * y[1]. One parallel_for where every weight is read directly without group
   sums (float32, or an exact packing: linear's qgemm_direct(x, NULL, NULL, ...)); else linear each. */
static void linears(const mat_t *w, const float *x, float *const *y, const int *out, int n, int rows, int in,
                    int gated, mm_scratch_t sc) {
    const int past = !direct(rows);
    int fuse = !past, amx = amx_use(w[0].amx, rows, past, g_amx_many, g_amx_few_min);
    for (int i = 0; i < n; i++) { /* AMX only where every weight goes to the same kernel */
        amx = amx_use(w[i].amx, rows, past, g_amx_many, g_amx_few_min) == amx ? amx : 0;
        fuse = fuse && (w[i].bits == 0 || w[i].exact);
    }
    amx_input_t a;
    amx = amx && amx_input(x, rows, in, amx == AMX_FEW, &a); /* the input split once for the n products */
    for (int i = 0; amx && i < n; i++) amx_product(w[i].amx, &a, y[i]);
    if (amx || !fuse) {
        for (int i = 0; !amx && i < n; i++) linear(w[i], x, y[i], rows, out[i], in, sc);
        if (gated) {
            swiglu_job_t swiglu = {y[0], y[1], (size_t)rows * FF};
            parallel_for((int)((swiglu.n + SWIGLU_ITEM - 1) / SWIGLU_ITEM), swiglu_item, &swiglu);
        }
        return;
    }
    fused_job_t job = {.gated = gated};
    int items = 0;
    for (int i = 0; i < n; i++) {
        job.part[i] = (direct_job_t){x, NULL, NULL, w[i], y[i], rows, out[i], in};
        job.items[i] = (out[i] + CHANNELS - 1) / CHANNELS;
        items += job.items[i];
    }
    parallel_for(gated ? job.items[0] : items, fused_item, &job);
}

/* weights: embed (VOCAB, H), final norm (H), lm head (VOCAB, H), then PER_LAYER per layer, each as
   weight_at reads it (four pointers a weight). pools: per layer K then V, each PARTS pointers (data;
   and scales, biases where quantized), each array (KVH, pool_blocks, BS, width). logits: (n_logits, VOCAB), for the rows
   logit_rows names. With `greedy` (n_logits int32), the rows' greedy tokens instead (cpu_greedy.h,
   through `screen`, the head in bfloat16, and `screen_err`, its rows' error bounds): a row whose token
   is -1 has its full logits in `logits`. Returns 0, or -1 when scratch memory could not be had. */
int decode_forward(const void *const *weights, const int32_t *formats, void *const *pools, int pool_blocks,
                   int rows, const int32_t *tokens, const int32_t *positions, const int32_t *tables,
                   int max_blocks, int n_logits, const int32_t *logit_rows, float *logits,
                   const uint16_t *screen, const float *screen_err, int32_t *greedy) {
    const mat_t embed = weight_at(weights, formats, 0), head = weight_at(weights, formats, 2);
    const float *final_norm = weights[4];
    size_t per_row = 2 * H + 2 * (size_t)NQ * HD + 2 * (size_t)KVH * HD + 2 * (size_t)FF + HD;
    size_t sums = (size_t)(rows < MAX_DIRECT ? rows : MAX_DIRECT) * MAX_IN / 32; /* xsum */
    size_t extra = (size_t)WORKERS * 2 * BS * HD + (size_t)TILE * MAX_IN + sums;
    float *buf = malloc(sizeof(float) * (per_row * rows + extra));
    if (!buf) return -1;
    float *x = buf, *h = x + (size_t)rows * H, *q = h + (size_t)rows * H, *att = q + (size_t)rows * NQ * HD;
    float *k = att + (size_t)rows * NQ * HD, *v = k + (size_t)rows * KVH * HD;
    float *g = v + (size_t)rows * KVH * HD, *u = g + (size_t)rows * FF, *angles = u + (size_t)rows * FF;
    float *blocks = angles + (size_t)rows * HD;
    mm_scratch_t sc = {blocks + (size_t)WORKERS * 2 * BS * HD, NULL};
    sc.xsum = sc.tile + (size_t)TILE * MAX_IN;
    for (int b = 0; b < rows; b++) weight_row(embed, tokens[b], H, x + (size_t)b * H);
    rope_angles(positions, rows, angles);
    /* The last layer's attention, o_proj and MLP only for the rows whose logits are asked for (in
       ascending order, as the engine asks): every row's K/V is written, and nothing reads the other
       rows' outputs. A prefill chunk then finishes its last layer on one row. */
    int sorted = n_logits < rows;
    for (int i = 0; sorted && i < n_logits; i++)
        sorted = logit_rows[i] >= 0 && logit_rows[i] < rows && (i == 0 || logit_rows[i] > logit_rows[i - 1]);
    int32_t *last = sorted ? malloc(sizeof(int32_t) * (size_t)n_logits * (1 + max_blocks) + 1) : NULL;
    if (sorted && !last) {
        free(buf);
        return -1;
    }
    int live = rows; /* rows the layer computes past its K/V */
    for (int layer = 0; layer < NL; layer++) {
        size_t at = 3 + (size_t)layer * PER_LAYER;
        const float *ln1 = weights[4 * (at + LN1)], *ln2 = weights[4 * (at + LN2)];
        rms_norm(x, ln1, h, rows);
        const mat_t qkv[3] = {weight_at(weights, formats, at + WQ), weight_at(weights, formats, at + WK),
                              weight_at(weights, formats, at + WV)};
        linears(qkv, h, (float *const[]){q, k, v}, (const int[]){NQ * HD, KVH * HD, KVH * HD}, 3, rows, H, 0, sc);
        /* Every row's K/V is written before any row attends: rows of one sequence at consecutive
           positions (a prefill chunk, drafts to verify) read each other's. */
        layer_job_t job = {pools, pool_blocks, layer, max_blocks, positions, tables, q, k, v, att, blocks, angles};
        parallel_for(rows, write_item, &job);
        if (layer == NL - 1 && last) { /* row logit_rows[i] to row i: a later row, or itself */
            int32_t *last_positions = last, *last_tables = last + n_logits;
            for (int i = 0; i < n_logits; i++) {
                const int b = logit_rows[i];
                if (b != i) {
                    memcpy(x + (size_t)i * H, x + (size_t)b * H, H * 4);
                    memcpy(q + (size_t)i * NQ * HD, q + (size_t)b * NQ * HD, NQ * HD * 4);
                }
                memcpy(last_tables + (size_t)i * max_blocks, tables + (size_t)b * max_blocks, max_blocks * 4);
                last_positions[i] = positions[b];
            }
            job.positions = last_positions, job.tables = last_tables, live = n_logits;
            if (!live) break; /* a chunk that is not its prompt's last: K/V only */
        }
        parallel_for(live * KVH, attend_item, &job);
        linear(weight_at(weights, formats, at + WO), att, h, live, H, NQ * HD, sc);
        for (size_t i = 0; i < (size_t)live * H; i++) x[i] += h[i];
        rms_norm(x, ln2, h, live);
        const mat_t gate_up[2] = {weight_at(weights, formats, at + WG), weight_at(weights, formats, at + WU)};
        linears(gate_up, h, (float *const[]){g, u}, (const int[]){FF, FF}, 2, live, H, 1, sc);
        linear(weight_at(weights, formats, at + WD), g, h, live, H, FF, sc);
        for (size_t i = 0; i < (size_t)live * H; i++) x[i] += h[i];
    }
    free(last);
    /* g and u, (2 * rows * FF) floats, are free now */
    for (int i = 0; i < n_logits; i++)
        memcpy(g + (size_t)i * H, x + (size_t)(live < rows ? i : logit_rows[i]) * H, H * 4);
    rms_norm(g, final_norm, h, n_logits);
    if (SCREENS && greedy && screen && head.bits == 0 && n_logits <= SCREEN_ROWS && direct(n_logits)) {
        float *scratch = malloc(sizeof(float) * GREEDY_SCRATCH(n_logits));
        if (!scratch) {
            free(buf);
            return -1;
        }
        greedy_head(head, screen, screen_err, h, n_logits, scratch, greedy, logits);
        free(scratch);
    } else {
        linear(head, h, logits, n_logits, VOCAB, H, sc);
        for (int i = 0; greedy && i < n_logits; i++) greedy[i] = -1;
    }
    free(buf);
    return 0;
}
