/* Greedy tokens from a float32 head without reading all of it: a bfloat16 copy of the head screens the
   vocabulary, and only the tokens that could still be the argmax get their float32 logits, computed by
   the same tile code as the full head's (float_block), so their values are the full head's bits.
   Included once, by cpu_decode.c: one translation unit, whose macros (H, VOCAB, SIMD_*) it uses.

   Why: one decode row of SmolLM2-135M reads 538 MB of float32 weights, 113 MB of them the head. The
   copy is half of that, so a single stream reads 10% fewer bytes per token.

   Why the token is the full head's: for row h and vocabulary row j, with E_j the float32 logit the full
   head computes and A_j the screen's (the bfloat16 weights b_j, summed in float32),
       |E_j - A_j| <= |h . (w_j - b_j)| + gamma_H (|h| . |w_j| + |h| . |b_j|)
                   <= ||h|| * (||w_j - b_j|| + gamma_H (||w_j|| + ||b_j||)) = ||h|| * err_j
   (Cauchy-Schwarz, and the bound of any float32 summation order of H products). The load computes
   err_j in float64 and rounds it up (engine/runner/cpu/cpu_decode.py). Let L = max_j (A_j - ||h|| err_j).
   The argmax k of E has E_k >= L, so A_k + ||h|| err_k >= L: every token that could be the argmax (ties
   included) is a candidate. The candidates' exact logits, in vocabulary order, pick the first largest,
   as numpy's argmax over the full logits does. */
#pragma once

#define SCREEN_ITEM 256 /* vocabulary rows per item of the screen */
#define MAX_CANDIDATES 64 /* more candidates than this: the row takes the full head */
/* Most rows one call screens: each row converts every bfloat16 weight again, while the full head's tiles
   load a weight once for up to 8 rows. On SmolLM2-135M (bench/greedy_screen.py, 2-core Zen 5) the
   screen gave 1.14x at one stream, 1.08x at two, 1.03x at three and 0.96-0.98x at four. */
#define SCREEN_ROWS 3

/* Builds with vector tiles screen: their sums run in the order the intrinsics spell out, whatever the
   rows and channels of a call. The portable loops are left to -ffast-math's vectorizer, which may sum
   one call's rows in another order than another call's: a candidate's logit could then differ from the
   full head's in its last bit (seen on an x86-64 baseline build), so that build reads the full head. */
#ifdef SIMD_AVX2
#define SCREENS 1
#else
#define SCREENS 0
#endif
int screens(void) { return SCREENS; }

static inline float bf16_value(uint16_t bits) {
    const uint32_t word = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &word, 4);
    return f;
}

/* w (bfloat16, H) . x (float32, H), summed in float32 */
static float bf16_dot(const uint16_t *w, const float *x) {
    int i = 0;
    float sum = 0.f;
#if defined(SIMD_AVX512)
    __m512 acc = _mm512_setzero_ps();
    for (; i + 16 <= H; i += 16) {
        const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(w + i)));
        acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)), _mm512_loadu_ps(x + i), acc);
    }
    sum = _mm512_reduce_add_ps(acc);
#elif defined(SIMD_AVX2)
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= H; i += 8) {
        const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + i)));
        acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)), _mm256_loadu_ps(x + i), acc);
    }
    const __m128 half = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 pair = _mm_add_ps(half, _mm_movehl_ps(half, half));
    sum = _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)));
#endif
    for (; i < H; i++) sum += bf16_value(w[i]) * x[i];
    return sum;
}

typedef struct {
    const uint16_t *screen; /* (VOCAB, H) bfloat16 */
    const float *h;         /* (n, H) the normed rows */
    float *approx;          /* (n, VOCAB) */
    int n;
} screen_job_t;

static void screen_item(void *ctx, int item, int worker) {
    (void)worker;
    const screen_job_t *job = ctx;
    const int first = item * SCREEN_ITEM, last = first + SCREEN_ITEM < VOCAB ? first + SCREEN_ITEM : VOCAB;
    for (int j = first; j < last; j++)
        for (int r = 0; r < job->n; r++)
            job->approx[(size_t)r * VOCAB + j] = bf16_dot(job->screen + (size_t)j * H, job->h + (size_t)r * H);
}

/* A float is finite: by its bits, which -ffast-math's isfinite would not look at. */
static inline int finite_bits(double value) {
    uint64_t bits;
    memcpy(&bits, &value, 8);
    return ((bits >> 52) & 0x7ff) != 0x7ff;
}

/* For each of the n rows of h, tokens[r] = the first argmax of its float32 logits through `head`, or -1
   where the row's norm is not finite or too many tokens stay candidates: then logits[r] holds the
   row's full logits (the caller takes their argmax). A candidate's logit is written to logits[r][j]
   as well, the full head's value, so a test can compare them. `scratch` holds GREEDY_SCRATCH(n) floats. */
#define GREEDY_SCRATCH(n) ((size_t)(n) * VOCAB + (size_t)MAX_CANDIDATES * H)
static void greedy_head(mat_t head, const uint16_t *screen, const float *err, const float *h, int n,
                        float *scratch, int32_t *tokens, float *logits) {
    float *approx = scratch, *rows = scratch + (size_t)n * VOCAB;
    screen_job_t job = {screen, h, approx, n};
    parallel_for((VOCAB + SCREEN_ITEM - 1) / SCREEN_ITEM, screen_item, &job);
    for (int r = 0; r < n; r++) {
        const float *hr = h + (size_t)r * H, *ar = approx + (size_t)r * VOCAB;
        float *lr = logits + (size_t)r * VOCAB;
        double norm = 0.0;
        for (int i = 0; i < H; i++) norm += (double)hr[i] * hr[i];
        norm = sqrt(norm) * (1.0 + 1e-9);
        /* by bits, not isfinite (-ffast-math drops that check); a vanishing row: underflow is outside the bound */
        const int usable = finite_bits(norm) && norm > 1e-6;
        double lower = -DBL_MAX;
        for (int j = 0; usable && j < VOCAB; j++) {
            const double low = (double)ar[j] - norm * err[j];
            if (low > lower) lower = low;
        }
        const int bounded = usable && finite_bits(lower);
        int cand[MAX_CANDIDATES], n_cand = 0;
        for (int j = 0; bounded && j < VOCAB && n_cand <= MAX_CANDIDATES; j++)
            if ((double)ar[j] + norm * err[j] >= lower) {
                if (n_cand < MAX_CANDIDATES) cand[n_cand] = j;
                n_cand++;
            }
        if (!bounded || n_cand == 0 || n_cand > MAX_CANDIDATES) {
            qgemm_direct(hr, NULL, NULL, head, lr, 1, VOCAB, H); /* the full head, as `linear` reads it */
            tokens[r] = -1;
            continue;
        }
        const float *w = head.w;
        for (int c = 0; c < n_cand; c++) memcpy(rows + (size_t)c * H, w + (size_t)cand[c] * H, H * 4);
        float exact[MAX_CANDIDATES];
        float_block(rows, n_cand, hr, exact, 1, n_cand, H, 0);
        int best = 0;
        for (int c = 0; c < n_cand; c++) {
            lr[cand[c]] = exact[c];
            if (exact[c] > exact[best]) best = c;
        }
        tokens[r] = cand[best];
    }
}
