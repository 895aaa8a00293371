/* Float32 weights that a smaller form holds exactly, kept in it: bfloat16 words where every weight's low
   16 bits are zero (a bfloat16 checkpoint run at float32), 4-bit affine codes with a float32 scale
   and bias per 32 weights where each group is 16 evenly spaced values (a 4-bit model dequantized to
   float32: the bundled SmolLM2's layers are llama.cpp's Q4_1), or signed 8-bit codes with a float32
   scale per 32 weights (llama.cpp's Q8_0: the bundled SmolLM2's embedding, which is also its head).
   weight_row gives every weight back bit for bit,
   and the own matmuls run the float32 path's tile code on the expanded tiles (direct_item); sgemm, for
   more rows than those take, reads the float32 weights themselves. So the logits are the float32
   weights' own, and a step of few rows reads a half to an eighth of the bytes.
   Included once, by cpu_decode.c: one translation unit, whose macros (SIMD_*) it uses. */
#pragma once

/* x rounded to the nearest float16 value, as a float (GGUF keeps its scales in float16). */
static float round_half(float x) {
    if (x == 0.f) return x; /* a NaN or an infinity packs to nothing that unpack_mismatches accepts */
    int e;
    frexpf(x, &e);                                /* |x| in [2^(e-1), 2^e) */
    const int ulp = e - 11 < -24 ? -24 : e - 11; /* 11 significant bits; subnormals below 2^-14 */
    return ldexpf(rintf(ldexpf(x, -ulp)), ulp);
}

/* One code times its scale plus the bias, as weight_row computes it (a fused multiply-add where the
   build has one). */
static inline float expand_code(float code, float scale, float bias) {
#ifdef SIMD_AVX2
    return fmaf(code, scale, bias);
#else
    return code * scale + bias;
#endif
}

/* 32 weights -> 16 code bytes (byte j: code j in the low nibble, code 16 + j in the high one, so that
   the low nibbles of a group's bytes are its first 16 weights' codes, in order), a scale and a bias that
   give them back,
   trying code 0 at the smallest weight and at the largest (MLX puts it at the end of larger magnitude),
   each with the step as computed and rounded to float16. Returns 0 when none does. */
static int pack_group4(const float *v, uint8_t *codes, float *scale, float *bias) {
    float lo = v[0], hi = v[0];
    for (int j = 1; j < 32; j++) lo = v[j] < lo ? v[j] : lo, hi = v[j] > hi ? v[j] : hi;
    const float step = (hi - lo) / 15.f;
    const float tries[4][2] = {{step, lo}, {round_half(step), lo}, {-step, hi}, {-round_half(step), hi}};
    for (int t = 0; t < (hi > lo ? 4 : 1); t++) {
        const float s = tries[t][0], b = tries[t][1];
        int ok = 1;
        uint8_t q[32];
        for (int j = 0; j < 32 && ok; j++) {
            float c = s != 0.f ? rintf((v[j] - b) / s) : 0.f;
            c = c < 0.f ? 0.f : c > 15.f ? 15.f : c;
            q[j] = (uint8_t)c;
            ok = expand_code(c, s, b) == v[j];
        }
        if (!ok) continue;
        for (int j = 0; j < 16; j++) codes[j] = (uint8_t)(q[j] | q[16 + j] << 4);
        *scale = s, *bias = b;
        return 1;
    }
    return 0;
}

/* Row `o` of an exact 4-bit packing as floats: each code times its group's scale plus its bias. */
static void exact4_row(mat_t m, int o, int in, float *out) {
    const uint8_t *row = (const uint8_t *)m.w + (size_t)o * in / 2;
    const int groups = in / 32;
    for (int g = 0; g < groups; g++) {
        const float s = m.s[(size_t)o * groups + g], b = m.b[(size_t)o * groups + g];
        const uint8_t *c = row + g * 16;
        float *w = out + g * 32;
#ifdef SIMD_AVX2
        const __m128i v = _mm_loadu_si128((const __m128i *)c), low = _mm_set1_epi8(15);
        const __m128i lo = _mm_and_si128(v, low), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low);
        const fvec vs = fv_set1(s), vb = fv_set1(b);
#ifdef SIMD_AVX512
        const __m128i parts[2] = {lo, hi};
#else
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
#endif
        for (int k = 0; k < 32 / FV_WIDTH; k++) fv_store(w + FV_WIDTH * k, fv_fma(fv_widen(parts[k]), vs, vb));
#else
        for (int j = 0; j < 16; j++) w[j] = expand_code((float)(c[j] & 15), s, b);
        for (int j = 0; j < 16; j++) w[16 + j] = expand_code((float)(c[j] >> 4), s, b);
#endif
    }
}

/* 32 weights -> 32 signed 8-bit codes and a scale that give them back (code times scale), trying the
   largest magnitude over 127 as computed and rounded to float16 (Q8_0 stores it so). Returns 0 when
   neither does. A code times a float16 scale is exact in float32: no rounding in the expansion. */
static int pack_group8(const float *v, int8_t *codes, float *scale) {
    float top = 0.f;
    for (int j = 0; j < 32; j++) top = fabsf(v[j]) > top ? fabsf(v[j]) : top;
    const float tries[2] = {top / 127.f, round_half(top / 127.f)};
    for (int t = 0; t < 2; t++) {
        const float s = tries[t];
        int ok = 1;
        int8_t q[32];
        for (int j = 0; j < 32 && ok; j++) {
            float c = s != 0.f ? rintf(v[j] / s) : 0.f;
            c = c < -127.f ? -127.f : c > 127.f ? 127.f : c;
            q[j] = (int8_t)c;
            ok = c * s == v[j];
        }
        if (!ok) continue;
        memcpy(codes, q, 32);
        *scale = s;
        return 1;
    }
    return 0;
}

/* Row `o` of an exact 8-bit packing as floats: each code times its group's scale. */
static void exact8_row(mat_t m, int o, int in, float *out) {
    const int8_t *row = (const int8_t *)m.w + (size_t)o * in;
    const float *sc = m.s + (size_t)o * (in / 32);
    for (int g = 0; g < in / 32; g++) {
        const float s = sc[g];
        for (int j = 0; j < 32; j++) out[g * 32 + j] = (float)row[g * 32 + j] * s;
    }
}

#ifdef SIMD_AVX512
/* R rows times C channels of an exact 4-bit packing, the sums of ftile_R_C (cpu_tiles.h) bit for bit:
   16 lanes, lane j adding the products of inputs j, j + 16, ... in order, then fv_hsum. The weights
   are not expanded into memory: a group's 16 values, code * scale + bias, are a table in one register,
   and a permute looks each code up (it reads an index's low 4 bits only), the very value weight_row
   gives. */
#define DEFINE_ETILE(R, C)                                                                                 \
    static void etile_##R##_##C(const uint8_t *q, const float *sc, const float *bi, int in, const float *x, \
                                float *y, int out) {                                                       \
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);          \
        const int groups = in / 32;                                                                        \
        fvec acc[R][C];                                                                                    \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _Pragma("GCC unroll 2") for (int c = 0; c < C; c++) \
            acc[r][c] = fv_zero();                                                                         \
        for (int g = 0; g < groups; g++) {                                                                 \
            fvec table[C];                                                                                 \
            __m512i idx[C];                                                                                \
            _Pragma("GCC unroll 2") for (int c = 0; c < C; c++) {                                         \
                const size_t at = (size_t)c * groups + g;                                                  \
                table[c] = _mm512_fmadd_ps(iota, _mm512_set1_ps(sc[at]), _mm512_set1_ps(bi[at]));          \
                idx[c] = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + at * 16)));            \
            }                                                                                              \
            _Pragma("GCC unroll 2") for (int half = 0; half < 2; half++) {                                \
                fvec wv[C];                                                                                \
                _Pragma("GCC unroll 2") for (int c = 0; c < C; c++) {                                     \
                    wv[c] = _mm512_permutexvar_ps(half ? _mm512_srli_epi32(idx[c], 4) : idx[c], table[c]); \
                    FV_HOLD(wv[c]);                                                                        \
                }                                                                                          \
                const int at = g * 32 + half * 16;                                                         \
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                      \
                    fvec xv = fv_load(x + (size_t)r * in + at);                                            \
                    FV_HOLD(xv);                                                                           \
                    _Pragma("GCC unroll 2") for (int c = 0; c < C; c++) acc[r][c] = fv_fma(xv, wv[c], acc[r][c]); \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
        float sums[R * C];                                                                                 \
        fv_hsums(&acc[0][0], R * C, sums);                                                                 \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _Pragma("GCC unroll 2") for (int c = 0; c < C; c++) \
            y[(size_t)r * out + c] = sums[r * C + c];                                                      \
    }
#define DEFINE_ETILES(R) DEFINE_ETILE(R, 1) DEFINE_ETILE(R, 2)
DEFINE_ETILES(1)
DEFINE_ETILES(2)
DEFINE_ETILES(3)
DEFINE_ETILES(4)
DEFINE_ETILES(5)
DEFINE_ETILES(6)
DEFINE_ETILES(7)
DEFINE_ETILES(8)
typedef void (*etile_fn)(const uint8_t *, const float *, const float *, int, const float *, float *, int);
static const etile_fn ETILES[8][2] = {
    {etile_1_1, etile_1_2}, {etile_2_1, etile_2_2}, {etile_3_1, etile_3_2}, {etile_4_1, etile_4_2},
    {etile_5_1, etile_5_2}, {etile_6_1, etile_6_2}, {etile_7_1, etile_7_2}, {etile_8_1, etile_8_2},
};

/* Channels [first, last) of an exact 4-bit packing for every row, through etile. */
static void exact4_block(mat_t m, int first, int last, const float *x, float *y, int rows, int out, int in) {
    const int groups = in / 32;
    for (int o = first; o < last; o += 2) {
        const int c = last - o < 2 ? last - o : 2;
        const uint8_t *q = (const uint8_t *)m.w + (size_t)o * in / 2;
        const float *sc = m.s + (size_t)o * groups, *bi = m.b + (size_t)o * groups;
        for (int r0 = 0; r0 < rows; r0 += 8)
            ETILES[(rows - r0 < 8 ? rows - r0 : 8) - 1][c - 1](q, sc, bi, in, x + (size_t)r0 * in,
                                                                y + (size_t)r0 * out + o, out);
    }
}

/* R rows times C channels of an exact 8-bit packing, the sums of ftile_R_C bit for bit, as etile's: each
   16 codes widened to floats and times their group's scale, which is the weight itself. */
#define DEFINE_E8TILE(R, C)                                                                                \
    static void e8tile_##R##_##C(const int8_t *q, const float *sc, int in, const float *x, float *y,      \
                                 int out) {                                                               \
        const int groups = in / 32;                                                                        \
        fvec acc[R][C];                                                                                    \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _Pragma("GCC unroll 2") for (int c = 0; c < C; c++) \
            acc[r][c] = fv_zero();                                                                         \
        for (int at = 0; at < in; at += 16) {                                                              \
            fvec wv[C];                                                                                    \
            _Pragma("GCC unroll 2") for (int c = 0; c < C; c++) {                                         \
                const __m128i codes = _mm_loadu_si128((const __m128i *)(q + (size_t)c * in + at));          \
                wv[c] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes)),                     \
                                      _mm512_set1_ps(sc[(size_t)c * groups + at / 32]));                   \
                FV_HOLD(wv[c]);                                                                            \
            }                                                                                              \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                          \
                fvec xv = fv_load(x + (size_t)r * in + at);                                                \
                FV_HOLD(xv);                                                                               \
                _Pragma("GCC unroll 2") for (int c = 0; c < C; c++) acc[r][c] = fv_fma(xv, wv[c], acc[r][c]); \
            }                                                                                              \
        }                                                                                                  \
        float sums[R * C];                                                                                 \
        fv_hsums(&acc[0][0], R * C, sums);                                                                 \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _Pragma("GCC unroll 2") for (int c = 0; c < C; c++) \
            y[(size_t)r * out + c] = sums[r * C + c];                                                      \
    }
#define DEFINE_E8TILES(R) DEFINE_E8TILE(R, 1) DEFINE_E8TILE(R, 2)
DEFINE_E8TILES(1)
DEFINE_E8TILES(2)
DEFINE_E8TILES(3)
DEFINE_E8TILES(4)
DEFINE_E8TILES(5)
DEFINE_E8TILES(6)
DEFINE_E8TILES(7)
DEFINE_E8TILES(8)
typedef void (*e8tile_fn)(const int8_t *, const float *, int, const float *, float *, int);
static const e8tile_fn E8TILES[8][2] = {
    {e8tile_1_1, e8tile_1_2}, {e8tile_2_1, e8tile_2_2}, {e8tile_3_1, e8tile_3_2}, {e8tile_4_1, e8tile_4_2},
    {e8tile_5_1, e8tile_5_2}, {e8tile_6_1, e8tile_6_2}, {e8tile_7_1, e8tile_7_2}, {e8tile_8_1, e8tile_8_2},
};

/* Prefetches n channels of an 8-bit packing: `in` code bytes and in / 32 scales each. */
static inline void prefetch_codes8(const int8_t *codes, const float *scales, int in, int n) {
    for (int at = 0; at < n * in; at += 64) _mm_prefetch((const char *)(codes + at), _MM_HINT_T0);
    for (int g = 0; g < n * in / 32; g += 16) _mm_prefetch((const char *)(scales + g), _MM_HINT_T0);
}

#define E8_AHEAD 4 /* channels on that exact8_block prefetches */

/* Channels [first, last) of an exact 8-bit packing for every row, through e8tile, prefetching: the
   hardware prefetcher alone follows the short rows (two streams) too late. Measured on a Zen 5 EPYC,
   the bundled model's head at one row: 2.4 ms without, 0.7 with (30 MB at 43 GB/s); 8 or 16 channels
   ahead were no better. The 4-bit blocks gained nothing from the same. */
static void exact8_block(mat_t m, int first, int last, const float *x, float *y, int rows, int out, int in) {
    const int groups = in / 32;
    for (int o = first; o < last; o += 2) {
        const int c = last - o < 2 ? last - o : 2;
        const int8_t *q = (const int8_t *)m.w + (size_t)o * in;
        const float *sc = m.s + (size_t)o * groups;
        if (o + E8_AHEAD < out)
            prefetch_codes8(q + (size_t)E8_AHEAD * in, sc + E8_AHEAD * groups, in, out - o - E8_AHEAD < 2 ? 1 : 2);
        for (int r0 = 0; r0 < rows; r0 += 8)
            E8TILES[(rows - r0 < 8 ? rows - r0 : 8) - 1][c - 1](q, sc, in, x + (size_t)r0 * in,
                                                                 y + (size_t)r0 * out + o, out);
    }
}
#endif

/* w (out, in) float32, in a multiple of 32 -> codes (out, in / 8) uint32 words, scales and biases
   (out, in / 32). Returns 0 when every group packs, else 1 + the first group that does not (a weight of
   a float32 checkpoint fails at its first group, so trying costs nothing). */
size_t pack_affine4(const float *w, int out, int in, uint32_t *codes, float *scales, float *biases) {
    const size_t groups = (size_t)out * (in / 32);
    for (size_t g = 0; g < groups; g++)
        if (!pack_group4(w + g * 32, (uint8_t *)codes + g * 16, scales + g, biases + g)) return g + 1;
    return 0;
}

/* w (out, in) float32, in a multiple of 32 -> codes (out, in) int8 and scales (out, in / 32); returns as
   pack_affine4 does. */
size_t pack_sym8(const float *w, int out, int in, int8_t *codes, float *scales) {
    const size_t groups = (size_t)out * (in / 32);
    for (size_t g = 0; g < groups; g++)
        if (!pack_group8(w + g * 32, codes + g * 32, scales + g)) return g + 1;
    return 0;
}

/* The number of rows of the float32 weight `ref` (out, in) that weight_row does not give back bit for
   bit from the packed form (pointers and formats as decode_forward reads a weight): the load-time proof
   that a packing is exact. */
size_t unpack_mismatches(const void *const *weight, const int32_t *format, const float *ref, int out, int in) {
    const mat_t m = weight_at(weight, format, 0);
    float *row = malloc(sizeof(float) * (size_t)in);
    if (!row) return (size_t)out;
    size_t missed = 0;
    for (int o = 0; o < out; o++) {
        weight_row(m, o, in, row);
        missed += memcmp(row, ref + (size_t)o * in, sizeof(float) * (size_t)in) != 0;
    }
    free(row);
    return missed;
}
