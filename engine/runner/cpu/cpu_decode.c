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
   vector is quantized as mx.quantize does it, and attention dequantizes each block it reads. */
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

/* A weight as MLX keeps it: floats (bits 0), or codes with a scale and bias per group. */
typedef struct {
    const void *w;
    const float *s, *b;
    int bits, group;
} mat_t;

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

static inline int direct(int rows) { return rows >= g_direct_min && rows <= g_direct_rows; }

/* The work-sharing pool: parallel_for(n, fn, ctx) runs fn(ctx, i, worker) for i < n on the caller
   (worker 0) and the helper (worker 1), each claiming the next item by counting `left` down. The
   caller waits only for items already claimed. A job's fields are written while `left` is spent (<= 0),
   and `left` = n publishes them: a claim that finds an item (left > 0) always belongs to the job whose
   fields it then reads, however late the claimer is. */
typedef void (*task_fn)(void *ctx, int i, int worker);
#if defined(__x86_64__) || defined(__i386__)
#define cpu_pause() __builtin_ia32_pause()
#else
#define cpu_pause() ((void)0)
#endif
/* The helper polls PAUSES times, then yields the core YIELDS times (a thread that needs it, OpenBLAS's
   or the server's, runs), then sleeps: the next loop of a layer starts within microseconds. Before an
   OpenBLAS call the caller sets `blas`, and the helper sleeps at once: OpenBLAS's threads take both
   cores, and a helper polling beside them slowed a forward's sgemm calls up to 2x. */
#define PAUSES 500
#define YIELDS 2000
static struct {
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int generation, sleeping, left, done, blas;
    task_fn fn;
    void *ctx;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void run_items(int worker) {
    for (;;) {
        int i = atomic_fetch_sub(&pool.left, 1) - 1;
        if (i < 0) return;
        pool.fn(pool.ctx, i, worker);
        atomic_fetch_add(&pool.done, 1);
    }
}

static void *helper_main(void *unused) {
    (void)unused;
    int seen = atomic_load(&pool.generation);
    for (;;) {
        for (int spin = 0; spin < PAUSES + YIELDS && atomic_load(&pool.generation) == seen; spin++) {
            if (atomic_load(&pool.blas)) break;
            spin < PAUSES ? cpu_pause() : (void)sched_yield();
        }
        if (atomic_load(&pool.generation) == seen) {
            pthread_mutex_lock(&pool.mu);
            atomic_store(&pool.sleeping, 1);
            while (atomic_load(&pool.generation) == seen) pthread_cond_wait(&pool.cv, &pool.mu);
            atomic_store(&pool.sleeping, 0);
            pthread_mutex_unlock(&pool.mu);
        }
        seen = atomic_load(&pool.generation);
        run_items(1);
    }
    return NULL;
}

static void parallel_for(int n, task_fn fn, void *ctx) {
    if (g_threads < 2 || n < 2) {
        for (int i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
    if (!pool.started) pool.started = pthread_create(&pool.thread, NULL, helper_main, NULL) == 0;
    pool.fn = fn, pool.ctx = ctx; /* `left` is spent: the last job's items are all done */
    atomic_store(&pool.blas, 0);
    atomic_store(&pool.done, 0);
    atomic_store(&pool.left, n);
    atomic_fetch_add(&pool.generation, 1);
    if (atomic_load(&pool.sleeping)) {
        pthread_mutex_lock(&pool.mu);
        pthread_cond_signal(&pool.cv);
        pthread_mutex_unlock(&pool.mu);
    }
    run_items(0);
    for (int spin = 0; atomic_load(&pool.done) < n; spin++)
        if (spin > 1000) sched_yield(); /* the helper holds an item but not the core */
}

/* 32 consecutive weights of a quantized row, from code `at`, as floats (codes, not yet scaled). */
static inline void unpack32(const uint8_t *row, int bits, int at, float *w) {
    const uint8_t *c = row + (size_t)at * bits / 8;
    if (bits == 8)
        for (int j = 0; j < 32; j++) w[j] = (float)c[j];
    else
        for (int j = 0; j < 16; j++) w[2 * j] = (float)(c[j] & 15), w[2 * j + 1] = (float)(c[j] >> 4);
}

/* Row `o` of a weight as floats: a quantized one dequantized as mx.dequantize does (code * scale + bias). */
static void weight_row(mat_t m, int o, int in, float *out);

#ifdef SIMD_AVX2
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* The float vector of the own matmuls: 16 wide with AVX-512 (Zen 5 and Intel's server cores run 512-bit
   FMAs at full rate; Zen 4 as two 256-bit halves), else 8. */
#ifdef SIMD_AVX512
typedef __m512 fvec;
#define FV_WIDTH 16
#define fv_zero _mm512_setzero_ps
#define fv_load _mm512_loadu_ps
#define fv_store _mm512_storeu_ps
#define fv_set1 _mm512_set1_ps
#define fv_mul _mm512_mul_ps
#define fv_add _mm512_add_ps
#define fv_fma _mm512_fmadd_ps
#define fv_hsum _mm512_reduce_add_ps
#define FV_HOLD(v) __asm__("" : "+v"(v))
static inline fvec fv_widen(__m128i bytes) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)); }
#else
typedef __m256 fvec;
#define FV_WIDTH 8
#define fv_zero _mm256_setzero_ps
#define fv_load _mm256_loadu_ps
#define fv_store _mm256_storeu_ps
#define fv_set1 _mm256_set1_ps
#define fv_mul _mm256_mul_ps
#define fv_add _mm256_add_ps
#define fv_fma _mm256_fmadd_ps
#define fv_hsum hsum8
#define FV_HOLD(v) __asm__("" : "+x"(v))
static inline fvec fv_widen(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)); }
#endif
#define FV_PER32 (32 / FV_WIDTH) /* vectors per 32 codes */

/* unpack32 into FV_PER32 vectors: codes 0-15 (or 0-7) of them in the first, and so on. */
static inline void unpack32_v(const uint8_t *row, int bits, int at, fvec f[FV_PER32]) {
    const uint8_t *c = row + (size_t)at * bits / 8;
    if (bits == 8) { /* FV_WIDTH bytes a vector: no load past the 32 codes */
#ifdef SIMD_AVX512
        for (int k = 0; k < FV_PER32; k++) f[k] = fv_widen(_mm_loadu_si128((const __m128i *)(c + 16 * k)));
#else
        for (int k = 0; k < FV_PER32; k++) f[k] = fv_widen(_mm_loadl_epi64((const __m128i *)(c + 8 * k)));
#endif
        return;
    }
    const __m128i v = _mm_loadu_si128((const __m128i *)c), low = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(v, low), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low);
    const __m128i first = _mm_unpacklo_epi8(lo, hi), second = _mm_unpackhi_epi8(lo, hi);
#ifdef SIMD_AVX512
    f[0] = fv_widen(first), f[1] = fv_widen(second);
#else
    f[0] = fv_widen(first), f[1] = fv_widen(_mm_srli_si128(first, 8));
    f[2] = fv_widen(second), f[3] = fv_widen(_mm_srli_si128(second, 8));
#endif
}
#endif

static void weight_row(mat_t m, int o, int in, float *out) {
    if (m.bits == 0) {
        memcpy(out, (const float *)m.w + (size_t)o * in, sizeof(float) * in);
        return;
    }
    const uint8_t *row = (const uint8_t *)m.w + (size_t)o * in * m.bits / 8;
    const int groups = in / m.group;
    for (int g = 0; g < groups; g++) {
        float s = m.s[(size_t)o * groups + g], b = m.b[(size_t)o * groups + g];
        for (int at = g * m.group; at < (g + 1) * m.group; at += 32) {
#ifdef SIMD_AVX2
            fvec f[FV_PER32];
            const fvec vs = fv_set1(s), vb = fv_set1(b);
            unpack32_v(row, m.bits, at, f);
            for (int k = 0; k < FV_PER32; k++) fv_store(out + at + FV_WIDTH * k, fv_fma(f[k], vs, vb));
#else
            unpack32(row, m.bits, at, out + at);
            for (int j = 0; j < 32; j++) out[at + j] = out[at + j] * s + b;
#endif
        }
    }
}

#ifdef SIMD_AVX2
/* One output channel for R rows: sum over groups of x . (code * scale) + bias * sum(x), with two
   accumulators per row (independent FMA chains) kept in registers. */
#define DEFINE_QROWS(R)                                                                                     \
    static void qrows_##R(const uint8_t *row, const float *sc, const float *bi, mat_t m, int in,           \
                          const float *x, const float *xsum, float *y, int out) {                          \
        const int groups = in / m.group;                                                                  \
        fvec acc[R][2], f[FV_PER32];                                                                       \
        float shift[R];                                                                                    \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = fv_zero(), shift[r] = 0.f; \
        for (int g = 0; g < groups; g++) {                                                                \
            const fvec s = fv_set1(sc[g]);                                                                 \
            for (int at = g * m.group; at < (g + 1) * m.group; at += 32) {                                \
                unpack32_v(row, m.bits, at, f);                                                            \
                _Pragma("GCC unroll 4") for (int k = 0; k < FV_PER32; k++) f[k] = fv_mul(f[k], s);         \
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                      \
                    const float *xr = x + (size_t)r * in + at;                                             \
                    _Pragma("GCC unroll 4") for (int k = 0; k < FV_PER32; k++)                             \
                        acc[r][k & 1] = fv_fma(fv_load(xr + FV_WIDTH * k), f[k], acc[r][k & 1]);           \
                }                                                                                          \
            }                                                                                              \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) shift[r] += bi[g] * xsum[(size_t)r * groups + g]; \
        }                                                                                                  \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) y[(size_t)r * out] =                           \
            fv_hsum(fv_add(acc[r][0], acc[r][1])) + shift[r];                                              \
    }
DEFINE_QROWS(1)
DEFINE_QROWS(2)
DEFINE_QROWS(3)
DEFINE_QROWS(4)

#ifdef SIMD_AVX512
/* The same for 4-bit codes in 16-float vectors, from `xp`: x with each 32 inputs reordered as their 16
   even then 16 odd ones (deinterleave_x), so that a vector of low nibbles and one of high nibbles each
   meet their inputs in order. Each group's 16 values code * scale are a table, and a permute looks the
   codes up (it reads an index's low 4 bits only: no masking), in place of converting and scaling every
   code. table[q] = q * scale is the product the other paths form, so only the order of the sums
   changes. */
#define DEFINE_Q4ROWS(R)                                                                                    \
    static void q4rows_##R(const uint8_t *row, const float *sc, const float *bi, int group, int in,       \
                           const float *xp, const float *xsum, float *y, int out) {                        \
        const int groups = in / group;                                                                    \
        const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);        \
        __m512 acc[R][2];                                                                                  \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();   \
        const uint8_t *c = row;                                                                            \
        const float *xg = xp;                                                                              \
        for (int g = 0; g < groups; g++) {                                                                \
            const __m512 table = _mm512_mul_ps(codes, _mm512_set1_ps(sc[g]));                               \
            for (int k = 0; k < group; k += 32, c += 16, xg += 32) {                                      \
                const __m128i v = _mm_loadu_si128((const __m128i *)c);                                     \
                const __m512 lo = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(v), table);                  \
                const __m512 hi = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_srli_epi16(v, 4)), table); \
                _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                      \
                    acc[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(xg + (size_t)r * in), lo, acc[r][0]);      \
                    acc[r][1] = _mm512_fmadd_ps(_mm512_loadu_ps(xg + (size_t)r * in + 16), hi, acc[r][1]); \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                              \
            float shift = 0.f;                                                                             \
            for (int g = 0; g < groups; g++) shift += bi[g] * xsum[(size_t)r * groups + g];                \
            y[(size_t)r * out] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1])) + shift;        \
        }                                                                                                  \
    }
DEFINE_Q4ROWS(1)
DEFINE_Q4ROWS(2)
DEFINE_Q4ROWS(3)
DEFINE_Q4ROWS(4)

/* x (rows, in) -> xp: each 32 consecutive inputs as their 16 even ones, then their 16 odd ones. */
static void deinterleave_x(const float *x, float *xp, int rows, int in) {
    for (int r = 0; r < rows; r++)
        for (int at = 0; at < in; at += 32)
            for (int k = 0; k < 16; k++) {
                xp[(size_t)r * in + at + k] = x[(size_t)r * in + at + 2 * k];
                xp[(size_t)r * in + at + 16 + k] = x[(size_t)r * in + at + 2 * k + 1];
            }
}
#endif

/* R rows times C float32 output channels (consecutive weight rows, `in` floats each): each weight vector
   is loaded once for the R rows and each row's vector once for the C channels, into R * C accumulators
   (4 x 3: twelve of AVX2's sixteen registers, enough independent FMA chains to keep both FMA units
   busy). The empty asm statements hold the loaded vectors in registers: GCC would otherwise fold a
   load into every FMA. `ahead` > 0 prefetches the weights that many floats on (the next tile's), which
   the forward streams from memory faster than the hardware prefetcher alone brings them. With AVX-512
   the vectors are 16 floats wide (fvec): the same tile, half the instructions. */
#define DEFINE_FTILE(R, C)                                                                                 \
    static void ftile_##R##_##C(const float *w, int in, const float *x, float *y, int out, int ahead) {    \
        fvec acc[R][C];                                                                                    \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _Pragma("GCC unroll 3") for (int c = 0; c < C; c++) \
            acc[r][c] = fv_zero();                                                                         \
        int at = 0;                                                                                        \
        for (; at + FV_WIDTH <= in; at += FV_WIDTH) {                                                      \
            fvec wv[C];                                                                                    \
            if (ahead && (at & 15) == 0)                                                                   \
                _Pragma("GCC unroll 3") for (int c = 0; c < C; c++)                                        \
                    _mm_prefetch((const char *)(w + (size_t)c * in + at + ahead), _MM_HINT_T0);            \
            _Pragma("GCC unroll 3") for (int c = 0; c < C; c++) {                                         \
                wv[c] = fv_load(w + (size_t)c * in + at);                                                  \
                FV_HOLD(wv[c]);                                                                            \
            }                                                                                              \
            _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {                                          \
                fvec xv = fv_load(x + (size_t)r * in + at);                                                \
                FV_HOLD(xv);                                                                               \
                _Pragma("GCC unroll 3") for (int c = 0; c < C; c++) acc[r][c] = fv_fma(xv, wv[c], acc[r][c]); \
            }                                                                                              \
        }                                                                                                  \
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) _Pragma("GCC unroll 3") for (int c = 0; c < C; c++) { \
            float sum = fv_hsum(acc[r][c]);                                                                \
            for (int j = at; j < in; j++) sum += x[(size_t)r * in + j] * w[(size_t)c * in + j];            \
            y[(size_t)r * out + c] = sum;                                                                  \
        }                                                                                                  \
    }
#define DEFINE_FTILES(R) DEFINE_FTILE(R, 1) DEFINE_FTILE(R, 2) DEFINE_FTILE(R, 3)
DEFINE_FTILES(1)
DEFINE_FTILES(2)
DEFINE_FTILES(3)
DEFINE_FTILES(4)
typedef void (*ftile_fn)(const float *, int, const float *, float *, int, int);
static const ftile_fn FTILES[4][3] = {
    {ftile_1_1, ftile_1_2, ftile_1_3},
    {ftile_2_1, ftile_2_2, ftile_2_3},
    {ftile_3_1, ftile_3_2, ftile_3_3},
    {ftile_4_1, ftile_4_2, ftile_4_3},
};
#endif

#define FT_CHANNELS 3 /* output channels of one float tile */

/* y = x @ w.T for few rows and `channels` consecutive output channels of float32 weights (w: the first
   channel's row): FT_CHANNELS channels at a time against every four rows, so each weight is read once
   from memory (with `streamed`, the next tile prefetched during the first four rows; a buffer already
   in L1 needs none). sgemm would first copy (pack) the whole weight. */
static void float_block(const float *w, int channels, const float *x, float *y, int rows, int out, int in,
                        int streamed) {
    for (int c0 = 0; c0 < channels; c0 += FT_CHANNELS) {
        const int c = channels - c0 < FT_CHANNELS ? channels - c0 : FT_CHANNELS;
        const float *wc = w + (size_t)c0 * in;
#ifdef SIMD_AVX2
        for (int r0 = 0; r0 < rows; r0 += 4)
            FTILES[(rows - r0 < 4 ? rows - r0 : 4) - 1][c - 1](wc, in, x + (size_t)r0 * in,
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
#define Q_AHEAD 2 /* a quantized channel prefetches the one this many channels on */

static void direct_item(void *ctx, int item, int worker) {
    (void)worker;
    const direct_job_t *job = ctx;
    const float *x = job->x, *xsum = job->xsum;
    const mat_t m = job->m;
    float *y = job->y;
    const int rows = job->rows, out = job->out, in = job->in;
    const int groups = m.bits ? in / m.group : 0;
    const size_t row_bytes = (size_t)in * m.bits / 8;
    const int last = (item + 1) * CHANNELS < out ? (item + 1) * CHANNELS : out;
    const int first = item * CHANNELS;
    if (m.bits == 0) {
        float_block((const float *)m.w + (size_t)first * in, last - first, x, y + first, rows, out, in, 1);
        return;
    }
    if (rows > 4) { /* a tile's codes dequantized once into L1 for every row, not once per 4 rows */
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

/* Scratch of one matmul: the tile of dequantized weights and the rows' group sums. */
typedef struct {
    float *tile, *xsum;
} mm_scratch_t;

/* y = x @ w.T, w (out, in) as nn.Linear keeps it (or its quantized form) */
static void linear(mat_t w, const float *x, float *y, int rows, int out, int in, mm_scratch_t sc) {
    if (!direct(rows)) atomic_store(&pool.blas, 1); /* the helper sleeps through OpenBLAS's call */
    if (w.bits == 0) {
        if (direct(rows))
            qgemm_direct(x, NULL, NULL, w, y, rows, out, in);
        else if (rows == 1 && g_sgemv)
            g_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.f, (const float *)w.w, in, x, 1, 0.f, y, 1);
        else
            g_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, in, 1.f, x, in, (const float *)w.w,
                    in, 0.f, y, out);
        return;
    }
    if (!direct(rows)) {
        qgemm_tiles(x, w, y, rows, out, in, sc.tile);
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

/* Rows x of every `in` weights times one weight, for the load-time measurement of direct_rows:
   mode 0 reads codes directly, mode 1 dequantizes tiles for sgemm. Returns -1 without memory. */
int matmul(const void *const *weight, const int32_t *format, const float *x, float *y, int rows, int out,
           int in, int mode) {
    if (mode == 0 && rows > MAX_DIRECT) return -1;
    mat_t w = {weight[0], weight[1], weight[2], format[0], format[1]};
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

/* Weight `i` of the forward's list: three pointers (data; scales and biases, or NULL) and two formats
   (bits, group) each. */
static mat_t weight_at(const void *const *weights, const int32_t *formats, size_t i) {
    mat_t m = {weights[3 * i], weights[3 * i + 1], weights[3 * i + 2], formats[2 * i], formats[2 * i + 1]};
    return m;
}

/* One layer's rows between the q/k/v products and o_proj, as items of parallel_for. */
typedef struct {
    void *const *pools;
    int pool_blocks, layer, max_blocks;
    const int32_t *positions, *tables;
    float *q, *k, *v, *att, *blocks;
} layer_job_t;

/* Row b: RoPE on its q and k, its K/V written to its slot (rows write distinct slots). */
static void write_item(void *ctx, int b, int worker) {
    (void)worker;
    const layer_job_t *job = ctx;
    const int32_t *table = job->tables + (size_t)b * job->max_blocks;
    int pos = job->positions[b];
    rope(job->q + (size_t)b * NQ * HD, NQ, pos);
    rope(job->k + (size_t)b * KVH * HD, KVH, pos);
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

static void swiglu_item(void *ctx, int item, int worker) {
    (void)worker;
    const swiglu_job_t *job = ctx;
    size_t end = (size_t)(item + 1) * SWIGLU_ITEM < job->n ? (size_t)(item + 1) * SWIGLU_ITEM : job->n;
    for (size_t i = (size_t)item * SWIGLU_ITEM; i < end; i++)
        job->g[i] = job->g[i] / (1.f + expf(-job->g[i])) * job->u[i];
}

/* weights: embed (VOCAB, H), final norm (H), lm head (VOCAB, H), then PER_LAYER per layer, each as
   weight_at reads it. pools: per layer K then V, each PARTS pointers (data; and scales, biases where
   quantized), each array (KVH, pool_blocks, BS, width). logits: (n_logits, VOCAB), for the rows
   logit_rows names. Returns 0, or -1 when scratch memory could not be had. */
int decode_forward(const void *const *weights, const int32_t *formats, void *const *pools, int pool_blocks,
                   int rows, const int32_t *tokens, const int32_t *positions, const int32_t *tables,
                   int max_blocks, int n_logits, const int32_t *logit_rows, float *logits) {
    const mat_t embed = weight_at(weights, formats, 0), head = weight_at(weights, formats, 2);
    const float *final_norm = weights[3];
    size_t per_row = 2 * H + 2 * (size_t)NQ * HD + 2 * (size_t)KVH * HD + 2 * (size_t)FF;
    size_t direct = (size_t)(rows < MAX_DIRECT ? rows : MAX_DIRECT) * MAX_IN / 32;
    size_t extra = (size_t)WORKERS * 2 * BS * HD + (size_t)TILE * MAX_IN + direct;
    float *buf = malloc(sizeof(float) * (per_row * rows + extra));
    if (!buf) return -1;
    float *x = buf, *h = x + (size_t)rows * H, *q = h + (size_t)rows * H, *att = q + (size_t)rows * NQ * HD;
    float *k = att + (size_t)rows * NQ * HD, *v = k + (size_t)rows * KVH * HD;
    float *g = v + (size_t)rows * KVH * HD, *u = g + (size_t)rows * FF, *blocks = u + (size_t)rows * FF;
    mm_scratch_t sc = {blocks + (size_t)WORKERS * 2 * BS * HD, NULL};
    sc.xsum = sc.tile + (size_t)TILE * MAX_IN;
    for (int b = 0; b < rows; b++) weight_row(embed, tokens[b], H, x + (size_t)b * H);
    for (int layer = 0; layer < NL; layer++) {
        size_t at = 3 + (size_t)layer * PER_LAYER;
        const float *ln1 = weights[3 * (at + LN1)], *ln2 = weights[3 * (at + LN2)];
        rms_norm(x, ln1, h, rows);
        linear(weight_at(weights, formats, at + WQ), h, q, rows, NQ * HD, H, sc);
        linear(weight_at(weights, formats, at + WK), h, k, rows, KVH * HD, H, sc);
        linear(weight_at(weights, formats, at + WV), h, v, rows, KVH * HD, H, sc);
        /* Every row's K/V is written before any row attends: rows of one sequence at consecutive
           positions (a prefill chunk, drafts to verify) read each other's. */
        layer_job_t job = {pools, pool_blocks, layer, max_blocks, positions, tables, q, k, v, att, blocks};
        parallel_for(rows, write_item, &job);
        parallel_for(rows * KVH, attend_item, &job);
        linear(weight_at(weights, formats, at + WO), att, h, rows, H, NQ * HD, sc);
        for (size_t i = 0; i < (size_t)rows * H; i++) x[i] += h[i];
        rms_norm(x, ln2, h, rows);
        linear(weight_at(weights, formats, at + WG), h, g, rows, FF, H, sc);
        linear(weight_at(weights, formats, at + WU), h, u, rows, FF, H, sc);
        swiglu_job_t swiglu = {g, u, (size_t)rows * FF};
        parallel_for((int)((swiglu.n + SWIGLU_ITEM - 1) / SWIGLU_ITEM), swiglu_item, &swiglu);
        linear(weight_at(weights, formats, at + WD), g, h, rows, H, FF, sc);
        for (size_t i = 0; i < (size_t)rows * H; i++) x[i] += h[i];
    }
    /* g and u, (2 * rows * FF) floats, are free now */
    for (int i = 0; i < n_logits; i++) memcpy(g + (size_t)i * H, x + (size_t)logit_rows[i] * H, H * 4);
    rms_norm(g, final_norm, h, n_logits);
    linear(head, h, logits, n_logits, VOCAB, H, sc);
    free(buf);
    return 0;
}
