/* The C forward's matmuls: the own ones (each weight read once for every row, items of the pool), and
   OpenBLAS's sgemm/sgemv (over float32 weights, or tiles of dequantized ones), picked per row count.
   Included once, by cpu_decode.c: one translation unit, whose macros (the model's sizes, SIMD_*) it uses. */
#pragma once

#define FT_CHANNELS 3 /* output channels of one float tile */

/* y = x @ w.T for few rows and `channels` consecutive output channels of float32 weights (w: the first
   channel's row): FT_CHANNELS channels at a time against every FT_ROWS rows, so each weight is read once
   from memory (with `streamed`, the next tile prefetched during the first FT_ROWS rows; a buffer already
   in L1 needs none). sgemm would first copy (pack) the whole weight. */
static void float_block(const float *w, int channels, const float *x, float *y, int rows, int out, int in,
                        int streamed) {
    for (int c0 = 0; c0 < channels; c0 += FT_CHANNELS) {
        const int c = channels - c0 < FT_CHANNELS ? channels - c0 : FT_CHANNELS;
        const float *wc = w + (size_t)c0 * in;
#ifdef SIMD_AVX2
        for (int r0 = 0; r0 < rows; r0 += FT_ROWS)
            FTILES[(rows - r0 < FT_ROWS ? rows - r0 : FT_ROWS) - 1][c - 1](wc, in, x + (size_t)r0 * in,
                                                              y + (size_t)r0 * out + c0, out,
                                                              streamed && r0 == 0 ? FT_CHANNELS * in : 0);
#else
        (void)streamed;
        for (int k = 0; k < c; k++)
            for (int r = 0; r < rows; r++) {
                const float *xr = x + (size_t)r * in, *wk = wc + (size_t)k * in;
                float sum = 0.f;
                for (int j = 0; j < in; j++) sum += xr[j] * wk[j];
                y[(size_t)r * out + c0 + k] = sum;
            }
#endif
    }
}

/* y = x @ dequantize(m).T for few rows: each output channel's codes are read once per four rows.
   sum(x * (code * s + b)) over a group is sum(x * code * s) + b * sum(x): xsum holds each row's group
   sums of x (rows, in / group). */
typedef struct {
    const float *x, *xsum, *xp; /* xp: x deinterleaved (deinterleave_x) for 4-bit codes, or NULL */
    mat_t m;
    float *y;
    int rows, out, in;
} direct_job_t;

#define CHANNELS 24 /* output channels per item of a direct matmul (a multiple of FT_CHANNELS) */
/* Most rows an exact 8-bit packing is read at: past it, widening codes for every eight rows costs more
   than the bytes it saves, and the float32 weights themselves go into the same tile code (measured on a
   Zen 5 EPYC, the bundled model's head: 1-16 rows 1.2-3.4x faster packed, 24 rows 0.9x). */
#define E8_ROWS 16
#define Q_AHEAD 2 /* a quantized channel prefetches the one this many channels on */

static void direct_item(void *ctx, int item, int worker) {
    (void)worker;
    const direct_job_t *job = ctx;
    const float *x = job->x, *xsum = job->xsum;
    const mat_t m = job->m;
    float *y = job->y;
    const int rows = job->rows, out = job->out, in = job->in;
    const int groups = m.group ? in / m.group : 0;
    const size_t row_bytes = (size_t)in * m.bits / 8;
    const int last = (item + 1) * CHANNELS < out ? (item + 1) * CHANNELS : out;
    const int first = item * CHANNELS;
    if (m.bits == 0 || (m.exact && m.bits == 8 && rows > E8_ROWS && m.f32)) {
        const float *w = m.bits ? m.f32 : (const float *)m.w;
        float_block(w + (size_t)first * in, last - first, x, y + first, rows, out, in, 1);
        return;
    }
#ifdef SIMD_AVX512
    if (m.exact && (m.bits == 4 || m.bits == 8)) {
        (m.bits == 4 ? exact4_block : exact8_block)(m, first, last, x, y, rows, out, in);
        return;
    }
#endif
    if (rows > 4 || m.exact) { /* a tile's codes dequantized once into L1 for every row, not once per 4
                                  rows; exact packings always, so that the float32 path's tile code runs */
        float w[FT_CHANNELS * MAX_IN];
        for (int o = first; o < last; o += FT_CHANNELS) {
            const int n = last - o < FT_CHANNELS ? last - o : FT_CHANNELS;
            for (int c = 0; c < n; c++) weight_row(m, o + c, in, w + (size_t)c * in);
            float_block(w, n, x, y + o, rows, out, in, 0);
        }
        return;
    }
    for (int o = first; o < last; o++) {
        const uint8_t *row = (const uint8_t *)m.w + o * row_bytes;
        const float *sc = m.s + (size_t)o * groups, *bi = m.b + (size_t)o * groups;
#ifdef SIMD_AVX2
        if (o + Q_AHEAD < last) { /* a channel's codes, scales and biases are three streams */
            const uint8_t *next = row + Q_AHEAD * row_bytes;
            for (size_t at = 0; at < row_bytes; at += 64) _mm_prefetch((const char *)(next + at), _MM_HINT_T0);
            for (int g = 0; g < groups; g += 16) {
                _mm_prefetch((const char *)(sc + Q_AHEAD * groups + g), _MM_HINT_T0);
                _mm_prefetch((const char *)(bi + Q_AHEAD * groups + g), _MM_HINT_T0);
            }
        }
        for (int r0 = 0; r0 < rows; r0 += 4) {
            const float *xr = x + (size_t)r0 * in, *xs = xsum + (size_t)r0 * groups;
            float *yr = y + (size_t)r0 * out + o;
#ifdef SIMD_AVX512
            if (job->xp) {
                const float *xp = job->xp + (size_t)r0 * in;
                switch (rows - r0 < 4 ? rows - r0 : 4) {
                case 1: q4rows_1(row, sc, bi, m.group, in, xp, xs, yr, out); break;
                case 2: q4rows_2(row, sc, bi, m.group, in, xp, xs, yr, out); break;
                case 3: q4rows_3(row, sc, bi, m.group, in, xp, xs, yr, out); break;
                default: q4rows_4(row, sc, bi, m.group, in, xp, xs, yr, out);
                }
                continue;
            }
#endif
            switch (rows - r0 < 4 ? rows - r0 : 4) {
            case 1: qrows_1(row, sc, bi, m, in, xr, xs, yr, out); break;
            case 2: qrows_2(row, sc, bi, m, in, xr, xs, yr, out); break;
            case 3: qrows_3(row, sc, bi, m, in, xr, xs, yr, out); break;
            default: qrows_4(row, sc, bi, m, in, xr, xs, yr, out);
            }
        }
#else
        float acc[MAX_DIRECT] = {0}, shift[MAX_DIRECT] = {0}, w[32];
        for (int g = 0; g < groups; g++) {
            for (int at = g * m.group; at < (g + 1) * m.group; at += 32) {
                unpack32(row, m.bits, at, w);
                for (int j = 0; j < 32; j++) w[j] *= sc[g];
                for (int r = 0; r < rows; r++) {
                    const float *xr = x + (size_t)r * in + at;
                    float p = 0.f;
                    for (int j = 0; j < 32; j++) p += xr[j] * w[j];
                    acc[r] += p;
                }
            }
            for (int r = 0; r < rows; r++) shift[r] += bi[g] * xsum[(size_t)r * groups + g];
        }
        for (int r = 0; r < rows; r++) y[(size_t)r * out + o] = acc[r] + shift[r];
#endif
    }
}

static void qgemm_direct(const float *x, const float *xsum, const float *xp, mat_t m, float *y, int rows, int out,
                         int in) {
    direct_job_t job = {x, xsum, xp, m, y, rows, out, in};
    parallel_for((out + CHANNELS - 1) / CHANNELS, direct_item, &job);
}

/* y = x @ dequantize(m).T for many rows: TILE channels at a time dequantized into `tile` (on this thread:
   OpenBLAS's threads run the sgemm right after, and a helper spinning beside them slowed it 2x), then
   sgemm. */
static void qgemm_tiles(const float *x, mat_t m, float *y, int rows, int out, int in, float *tile) {
    for (int o0 = 0; o0 < out; o0 += TILE) {
        int n = out - o0 < TILE ? out - o0 : TILE;
        for (int o = 0; o < n; o++) weight_row(m, o0 + o, in, tile + (size_t)o * in);
        g_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, in, 1.f, x, in, tile, in, 0.f, y + o0, out);
    }
}

#define ONEDNN_ROWS 256 /* the most rows of one oneDNN call: onednn.c's MAX_ROWS */

typedef struct {
    void *w;
    const float *x;
    float *y;
    int rows, per, row_blocks, in, out;
    atomic_int failed;
} onednn_job_t;

/* Item i: channel block i / row_blocks of the weight against row block i % row_blocks, so each
   worker's share of the items (a range) covers its own channel blocks. */
static void onednn_item(void *ctx, int i, int worker) {
    (void)worker;
    onednn_job_t *job = ctx;
    const int r0 = i % job->row_blocks * job->per, n = job->rows - r0 < job->per ? job->rows - r0 : job->per;
    if (g_onednn_rows(job->w, i / job->row_blocks, job->x + (size_t)r0 * job->in, job->y + (size_t)r0 * job->out, n))
        atomic_store(&job->failed, 1);
}

/* y = x @ w.T for many rows through oneDNN (onednn.c): (row block, channel block) items of the pool,
   at least two a worker, each one call on one thread over the weight packed at load. Returns 0 where
   oneDNN has no primitive for the blocks' row counts, or a call failed: the caller runs sgemm then. */
static int onednn_linear(void *w, const float *x, float *y, int rows, int out, int in) {
    const int blocks = g_onednn_blocks(w);
    int row_blocks = (rows + ONEDNN_ROWS - 1) / ONEDNN_ROWS;
    while (row_blocks * blocks < 2 * g_threads && rows / (row_blocks + 1) >= 16) row_blocks++;
    const int per = (rows + row_blocks - 1) / row_blocks;
    row_blocks = (rows + per - 1) / per;
    if (!g_onednn_ready(w, per) || !g_onednn_ready(w, rows - (row_blocks - 1) * per)) return 0;
    onednn_job_t job = {w, x, y, rows, per, row_blocks, in, out, 0};
    parallel_for(row_blocks * blocks, onednn_item, &job);
    return !atomic_load(&job.failed);
}

/* Scratch of one matmul: the tile of dequantized weights and the rows' group sums. */
typedef struct {
    float *tile, *xsum;
} mm_scratch_t;

/* y = x @ w.T, w (out, in) as nn.Linear keeps it (or its quantized form) */
static void linear(mat_t w, const float *x, float *y, int rows, int out, int in, mm_scratch_t sc) {
    amx_input_t a;
    const int amx = amx_use(w.amx, rows, !direct(rows), g_amx_many, g_amx_few_min);
    if (amx && amx_input(x, rows, in, amx == AMX_FEW, &a)) {
        amx_product(w.amx, &a, y);
        return;
    }
    if (w.onednn && rows > 1 && !direct(rows) && onednn_linear(w.onednn, x, y, rows, out, in)) return;
    if (!direct(rows)) atomic_store(&pool.blas, 1); /* the helper sleeps through OpenBLAS's call */
    if (w.bits == 0 || (w.f32 && !direct(rows))) {
        const float *wf = w.bits ? w.f32 : (const float *)w.w;
        if (direct(rows))
            qgemm_direct(x, NULL, NULL, w, y, rows, out, in);
        else if (rows == 1 && g_sgemv)
            g_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.f, wf, in, x, 1, 0.f, y, 1);
        else
            g_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, in, 1.f, x, in, wf, in, 0.f, y, out);
        return;
    }
    if (!direct(rows)) {
        qgemm_tiles(x, w, y, rows, out, in, sc.tile);
        return;
    }
    if (w.exact) { /* float32 arithmetic on expanded tiles: no group sums */
        qgemm_direct(x, NULL, NULL, w, y, rows, out, in);
        return;
    }
    const int groups = in / w.group;
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < groups; g++) {
            const float *xr = x + (size_t)r * in + (size_t)g * w.group;
            float sum = 0.f;
            for (int j = 0; j < w.group; j++) sum += xr[j];
            sc.xsum[(size_t)r * groups + g] = sum;
        }
    const float *xp = NULL;
#ifdef SIMD_AVX512
    if (w.bits == 4 && rows <= 4) { /* the tile is free: direct rows never dequantize into it */
        deinterleave_x(x, sc.tile, rows, in);
        xp = sc.tile;
    }
#endif
    qgemm_direct(x, sc.xsum, xp, w, y, rows, out, in);
}

/* Rows x of every `in` weights times one weight (four pointers, as weight_at reads them), for the
   load-time measurement of direct_rows: mode 0 reads codes directly, mode 1 dequantizes tiles for
   sgemm. Returns -1 without memory. */
int matmul(const void *const *weight, const int32_t *format, const float *x, float *y, int rows, int out,
           int in, int mode) {
    if (mode == 0 && rows > MAX_DIRECT) return -1;
    mat_t w = weight_at(weight, format, 0);
    w.onednn = w.amx = NULL; /* g_onednn and g_amx index the forward's list, not this one */
    float *tile = malloc(sizeof(float) * ((size_t)TILE * in + (size_t)MAX_DIRECT * in / 32));
    if (!tile) return -1;
    mm_scratch_t sc = {tile, tile + (size_t)TILE * in};
    int keep_min = g_direct_min, keep = g_direct_rows;
    g_direct_min = 1, g_direct_rows = mode == 0 ? MAX_DIRECT : 0;
    linear(w, x, y, rows, out, in, sc);
    g_direct_min = keep_min, g_direct_rows = keep;
    free(tile);
    return 0;
}
