/* The C forward's vector kernels: a few rows against one output channel (quantized codes, 4-bit codes
   through a table) or against a tile of float32 channels, for the CPU -march=native picked.
   Included once, by cpu_decode.c: one translation unit, whose macros (the model's sizes, SIMD_*) it uses. */
#pragma once

/* 32 consecutive weights of a quantized row, from code `at`, as floats (codes, not yet scaled). */
static inline void unpack32(const uint8_t *row, int bits, int at, float *w) {
    const uint8_t *c = row + (size_t)at * bits / 8;
    if (bits == 8)
        for (int j = 0; j < 32; j++) w[j] = (float)c[j];
    else
        for (int j = 0; j < 16; j++) w[2 * j] = (float)(c[j] & 15), w[2 * j + 1] = (float)(c[j] >> 4);
}

/* Row `o` of a weight as floats: a quantized one dequantized as mx.dequantize does (code * scale + bias),
   an exactly packed one (cpu_pack.h) back to its float32 bits. */
static void weight_row(mat_t m, int o, int in, float *out);
static void exact4_row(mat_t m, int o, int in, float *out);
static void exact8_row(mat_t m, int o, int in, float *out);

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

/* Lane t: fv_hsum(p[t]) for 16 vectors, bit for bit, in 15 additions instead of 64 instructions: the same
   pairs in the same stages as _mm512_reduce_add_ps (lanes i and i + 8, then i + 4, i + 2, i + 1), each
   stage adding halves of two vectors at once. Taken in the order p[0], p[4], p[8], p[12], p[1], ...,
   lane t of the last stage holds p[t]'s sum. A tile's end (16 accumulators of an 8 x 2 tile took ~10%
   of its time one at a time) and 16 attention scores (cpu_attention.h). */
static inline __m512 fv_hsum16(const __m512 p[16]) {
    __m512 a[8], b[4], c[2];
    for (int k = 0; k < 8; k++) {
        const __m512 x = p[4 * (2 * k % 4) + 2 * k / 4], y = p[4 * ((2 * k + 1) % 4) + (2 * k + 1) / 4];
        a[k] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    for (int k = 0; k < 4; k++)
        b[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int k = 0; k < 2; k++)
        c[k] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* out[t] = fv_hsum(p[t]) for n vectors: 16 at a time where there are 8 or more (zeros fill the last 16). */
static inline void fv_hsums(const fvec *p, int n, float *out) {
    if (n < 8) {
        for (int t = 0; t < n; t++) out[t] = fv_hsum(p[t]);
        return;
    }
    for (int t0 = 0; t0 < n; t0 += 16) {
        __m512 part[16];
        float sums[16];
        for (int t = 0; t < 16; t++) part[t] = t0 + t < n ? p[t0 + t] : _mm512_setzero_ps();
        _mm512_storeu_ps(sums, fv_hsum16(part));
        for (int t = 0; t < 16 && t0 + t < n; t++) out[t0 + t] = sums[t];
    }
}
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

static inline void fv_hsums(const fvec *p, int n, float *out) {
    for (int t = 0; t < n; t++) out[t] = fv_hsum(p[t]);
}
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
    if (m.bits == 16) { /* bfloat16 words: a float32's high half */
        const uint16_t *row = (const uint16_t *)m.w + (size_t)o * in;
        uint32_t *bits = (uint32_t *)out;
        for (int j = 0; j < in; j++) bits[j] = (uint32_t)row[j] << 16;
        return;
    }
    if (m.exact) { /* exact 8-bit codes, or 4-bit ones: byte j of a group holds codes j (low nibble) and
                      16 + j (cpu_pack.h) */
        (m.bits == 8 ? exact8_row : exact4_row)(m, o, in, out);
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
   is loaded once for the R rows and each row's vector once for the C channels, into R * C accumulators.
   AVX2 (sixteen registers) takes 4 x 3: twelve accumulators, enough independent FMA chains to keep both
   FMA units busy. AVX-512 (32 registers, vectors 16 floats wide: fvec) takes up to 8 x 3: 24
   accumulators, three weights and a row, and each weight loaded from L1 feeds eight FMAs, not four. At
   16 rows a matmul then reads each weight tile twice, not four times. On a 2-core Zen 5 EPYC: the
   matmul alone 1.3-1.7x faster at 16 rows, a whole 16-row forward 5-12% (docs/benchmarks.md,
   "Eighth pass"). The empty asm statements hold the loaded vectors in registers: GCC would otherwise
   fold a load into every FMA. `ahead` > 0 prefetches the weights that many floats on (the next
   tile's), which the forward streams from memory faster than the hardware prefetcher alone brings
   them. A row's sums run in the same order whatever the tile: the rows a tile takes change no
   result. */
#define DEFINE_FTILE(R, C)                                                                                 \
    static void ftile_##R##_##C(const float *w, int in, const float *x, float *y, int out, int ahead) {    \
        fvec acc[R][C];                                                                                    \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _Pragma("GCC unroll 3") for (int c = 0; c < C; c++) \
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
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                          \
                fvec xv = fv_load(x + (size_t)r * in + at);                                                \
                FV_HOLD(xv);                                                                               \
                _Pragma("GCC unroll 3") for (int c = 0; c < C; c++) acc[r][c] = fv_fma(xv, wv[c], acc[r][c]); \
            }                                                                                              \
        }                                                                                                  \
        float sums[R * C];                                                                                 \
        fv_hsums(&acc[0][0], R * C, sums);                                                                 \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _Pragma("GCC unroll 3") for (int c = 0; c < C; c++) { \
            float sum = sums[r * C + c];                                                                   \
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
#ifdef SIMD_AVX512
#define FT_ROWS 8 /* rows of a float tile */
DEFINE_FTILES(5)
DEFINE_FTILES(6)
DEFINE_FTILES(7)
DEFINE_FTILES(8)
#define FTILES_WIDE                                                                                        \
    {ftile_5_1, ftile_5_2, ftile_5_3}, {ftile_6_1, ftile_6_2, ftile_6_3}, {ftile_7_1, ftile_7_2, ftile_7_3}, \
        {ftile_8_1, ftile_8_2, ftile_8_3},
#else
#define FT_ROWS 4
#define FTILES_WIDE
#endif
static const ftile_fn FTILES[FT_ROWS][3] = {
    {ftile_1_1, ftile_1_2, ftile_1_3},
    {ftile_2_1, ftile_2_2, ftile_2_3},
    {ftile_3_1, ftile_3_2, ftile_3_3},
    {ftile_4_1, ftile_4_2, ftile_4_3},
    FTILES_WIDE
};
#endif
