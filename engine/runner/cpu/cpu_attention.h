/* One K/V head's REP query heads attending over a sequence's blocks of the paged pools (cpu_kv.h),
   block by block with an online softmax. Included once, by cpu_decode.c: one translation unit, whose
   macros (the model's sizes, SIMD_*) it uses. */
#pragma once

#if defined(SIMD_AVX512) && HD % 16 == 0
/* 16 positions at a time in 512-bit vectors. The scalar loop below ends every score with a horizontal
   sum and calls libm's exp per position; here each score's 16 partial sums stay in a vector until 16
   scores are summed at once (cpu_tiles.h's fv_hsum16), exp is a polynomial on 16 lanes, and the weighted
   V rows go into vectors that stay in registers. Both loops are within ~1e-7 of a float64 attention;
   a long prompt's chunks run 1.2-1.3x faster, decode rows up to 1.1x (bench/attention.py). */
#define HV (HD / 16)

/* exp(x) for x <= 0 (scores less their running maximum), within about 1 ulp: x = n ln2 + r, |r| <= ln2/2,
   Cephes' expf polynomial in r, scaled by 2^n; below -87.3 (exp < 2^-126) the lanes come out 0 or tiny. */
static inline __m512 exp_nonpositive(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    return _mm512_scalef_ps(p, n);
}

/* Query head qv's scores against `count` (1-16) consecutive K rows from k, in lanes 0..count-1 (0 past them):
   inlined with count 16 the loop unrolls and the 16 partial sums stay in registers. */
static inline __m512 scores16(const __m512 qv[HV], const float *k, int count) {
    __m512 p[16];
    for (int t = 0; t < 16; t++) {
        p[t] = _mm512_setzero_ps();
        if (t < count)
            for (int c = 0; c < HV; c++) p[t] = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + (size_t)t * HD + 16 * c), p[t]);
    }
    return fv_hsum16(p);
}

static void attend_vector(const float *q, side_t kp, side_t vp, const int32_t *table, int len, float *out,
                          float scale, float *scratch) {
    __m512 qv[REP][HV], acc[REP][HV];
    float m[REP], l[REP];
    for (int r = 0; r < REP; r++) {
        for (int c = 0; c < HV; c++)
            qv[r][c] = _mm512_mul_ps(_mm512_loadu_ps(q + r * HD + 16 * c), _mm512_set1_ps(scale)),
            acc[r][c] = _mm512_setzero_ps();
        m[r] = -FLT_MAX, l[r] = 0.f;
    }
    int num_blocks = (len + BS - 1) / BS;
    for (int j = 0; j < num_blocks; j++) {
        const size_t next = j + 1 < num_blocks ? (size_t)table[j + 1] * BS : SIZE_MAX; /* its first slot */
        int n = len - j * BS < BS ? len - j * BS : BS;
        const float *kb = block_rows(kp, table[j], n, scratch);
        const float *vb = block_rows(vp, table[j], n, scratch + BS * HD);
        for (int t0 = 0; t0 < n; t0 += 16) {
            const int count = n - t0 < 16 ? n - t0 : 16;
            const __mmask16 live = (__mmask16)((1u << count) - 1);
            float w[REP][16];
            for (int r = 0; r < REP; r++) {
                const __m512 s = count == 16 ? scores16(qv[r], kb + (size_t)t0 * HD, 16)
                                             : scores16(qv[r], kb + (size_t)t0 * HD, count);
                const float block_top = _mm512_mask_reduce_max_ps(live, s), top = block_top > m[r] ? block_top : m[r];
                const __m512 e = _mm512_maskz_mov_ps(live, exp_nonpositive(_mm512_sub_ps(s, _mm512_set1_ps(top))));
                const __m512 shrink = exp_nonpositive(_mm512_set1_ps(m[r] - top));
                l[r] = l[r] * _mm512_cvtss_f32(shrink) + _mm512_reduce_add_ps(e), m[r] = top;
                for (int c = 0; c < HV; c++) acc[r][c] = _mm512_mul_ps(acc[r][c], shrink);
                _mm512_storeu_ps(w[r], e);
            }
            for (int t = 0; t < count; t++) {
                if (next != SIZE_MAX) prefetch_row(kp, next + t0 + t), prefetch_row(vp, next + t0 + t);
                for (int c = 0; c < HV; c++) {
                    const __m512 v = _mm512_loadu_ps(vb + (size_t)(t0 + t) * HD + 16 * c);
                    for (int r = 0; r < REP; r++) acc[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(w[r][t]), v, acc[r][c]);
                }
            }
        }
    }
    for (int r = 0; r < REP; r++)
        for (int c = 0; c < HV; c++)
            _mm512_storeu_ps(out + r * HD + 16 * c, _mm512_div_ps(acc[r][c], _mm512_set1_ps(l[r])));
}
#define VECTOR_ATTENTION 1
#else
#define VECTOR_ATTENTION 0
#endif

/* Every build's loop, which compilers vectorize along the head's dimension (a horizontal sum per score). */
static void attend_scalar(const float *q, side_t kp, side_t vp, const int32_t *table, int len, float *out,
                          float scale, float *scratch) {
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

static int g_vector_attention = VECTOR_ATTENTION;

/* Which loop attention takes from now on (1: the vector one, where built), for bench/attention.py's
   comparison in one process; returns the one in effect. */
int attention_mode(int vector) {
    g_vector_attention = vector && VECTOR_ATTENTION;
    return g_vector_attention;
}

/* REP query heads of one K/V head over its len tokens; scratch: 2 * BS * HD floats for a quantized
   block's dequantized rows. */
static void attend(const float *q, side_t kp, side_t vp, const int32_t *table, int len, float *out, float scale,
                   float *scratch) {
#if VECTOR_ATTENTION
    if (g_vector_attention) {
        attend_vector(q, kp, vp, table, len, out, scale, scratch);
        return;
    }
#endif
    attend_scalar(q, kp, vp, table, len, out, scale, scratch);
}
