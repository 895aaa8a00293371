/* Products of exact 4-bit weights (cpu_pack.h's: a code 0-15, a float32 scale and bias per 32 weights)
   on Intel AMX, in float32 accuracy. Included once, by cpu_decode.c: one translation unit, whose macros
   (SIMD_*) it uses. Compiled where the build's CPU has AMX-BF16 and AVX512-BF16 (-march=native on
   Sapphire Rapids and later); elsewhere amx_supported() is 0 and nothing here runs.

   Why: the products are most of a 16-client load's time on the CPU, and float32 FMAs (oneDNN's or the
   own tiles) run near the core's FMA peak already. AMX multiplies bfloat16 tiles about 10x faster, but
   a bfloat16 product is only 8 bits: rounding the activations to bfloat16 would change the logits far
   beyond float32 rounding. Here nothing is rounded away:
   - a code (0-15) is a bfloat16 value exactly;
   - each activation x is split into three bfloat16 pieces x1 + x2 + x3 (x1 = bf16(x), x2 = bf16(x - x1),
     x3 = bf16(x - x1 - x2)), which hold its 24 significant bits (the first two subtractions are exact);
   - a piece times a code is exact in float32 (at most 8 x 4 significant bits), and TDPBF16PS adds the
     products in float32, as any float32 sum of them would;
   - per group of 32 inputs, y += scale * sum(code * x) + bias * sum(x) in float32: the weights' own
     values (code * scale + bias) times x, summed in another order.
   So the result differs from the float32 product only by the sums' rounding (bench/amx.py measures the
   logits' difference; the load checks them as onednn.py does and times each kernel against the path
   it would replace). Three tile products instead of one, and each group's sums scaled in AVX-512, still
   run a prefill chunk's forward 1.7x faster than oneDNN's float32 one, and a 16-row decode step's 1.5x
   faster than the own float32 tiles (bench/amx.py, docs/benchmarks.md).

   Two kernels. Past the own matmuls' rows (prefill chunks), items of 32 rows x 32 channels read the
   codes as bfloat16 tiles made once at load (amx_pack: per block of 16 output channels and group of 32
   inputs, 1 KB in the pairs TDPBF16PS reads, row k/2, column 2n + k%2: channel n, input k of the
   group). Decode steps of up to 16 rows (from the row count the load measured faster) read the codes
   as 4-bit tiles (256 bytes) and expand each into L1 as it goes: a decode step reads every weight once,
   and the bfloat16 tiles from memory made a 16-row step slower than the own matmuls. Each tile's 16
   channels' scales and biases lie together after it. The activations' pieces are made per product into
   scratch memory, rows padded to 32 (16 for the few-row kernel, tile by tile). */
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(SIMD_AVX512)
#define AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#else
#define AMX 0
#endif

#define AMX_ROWS 32     /* rows of an item: two 16-row tiles */
#define AMX_CHANNELS 32 /* output channels of an item: two 16-channel tiles */
#define AMX_AHEAD 2     /* groups ahead whose code tiles an item prefetches */
#define FEW_ROWS 16     /* most rows of the few-row kernel: one 16-row tile */
#define FEW_CHANNELS 64 /* output channels of its item: four 16-channel tiles */

typedef struct {
    int out, in;
    uint16_t *tiles;        /* (out / 16, in / 32) tiles of 512 bfloat16 */
    uint8_t *nibbles;       /* the same tiles as 4-bit codes (256 bytes each), or NULL where out % 64 */
    float *factors;         /* per tile: its 16 channels' scales, then their biases */
} amx_weight_t;

static atomic_long amx_calls; /* products through here, in this process (the tests' evidence) */

long amx_products(void) { return atomic_load(&amx_calls); }

#if AMX
/* Linux hands a process AMX's tile state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM for
   XFEATURE_XTILEDATA); without it the first tile instruction faults. Asked once; 1 where granted. */
static int amx_permitted(void) {
    static atomic_int state; /* 0 not asked, 1 granted, -1 refused */
    int s = atomic_load(&state);
    if (!s) {
        s = syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : -1;
        atomic_store(&state, s);
    }
    return s == 1;
}

static inline uint16_t bf16_bits(float f) { /* round to nearest even, as VCVTNEPS2BF16 for normal f */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
#endif

/* 1 where this build has AMX and the OS lets the process use it. */
int amx_supported(void) {
#if AMX
    return amx_permitted();
#else
    return 0;
#endif
}

/* The AMX layout of an exact 4-bit weight: codes (out, in / 2) bytes as cpu_pack.h packs them (byte j
   of a group: code j low, code 16 + j high), scales and biases (out, in / 32). NULL where AMX is not
   usable here, the shape is not whole tiles (out and in multiples of 32), or memory is short. */
void *amx_pack(const uint8_t *codes, const float *scales, const float *biases, int out, int in) {
#if AMX
    if (!amx_permitted() || out % AMX_CHANNELS || in % 32 || out <= 0 || in <= 0) return NULL;
    const int groups = in / 32;
    amx_weight_t *w = calloc(1, sizeof(amx_weight_t));
    if (!w) return NULL;
    w->out = out, w->in = in;
    w->tiles = aligned_alloc(64, (size_t)out * in * 2);
    w->nibbles = out % FEW_CHANNELS ? NULL : aligned_alloc(64, (size_t)out * in / 2);
    w->factors = aligned_alloc(64, sizeof(float) * (size_t)out * groups * 2);
    if (!w->tiles || (!w->nibbles && out % FEW_CHANNELS == 0) || !w->factors) {
        free(w->tiles), free(w->nibbles), free(w->factors), free(w);
        return NULL;
    }
    for (int o = 0; o < out; o++)
        for (int g = 0; g < groups; g++) {
            const uint8_t *c = codes + (size_t)o * in / 2 + (size_t)g * 16;
            uint16_t *tile = w->tiles + ((size_t)(o / 16) * groups + g) * 512;
            uint8_t *nibble = w->nibbles ? w->nibbles + ((size_t)(o / 16) * groups + g) * 256 : NULL;
            for (int k = 0; k < 32; k++) {
                const int code = k < 16 ? c[k] & 15 : c[k - 16] >> 4;
                tile[(k / 2) * 32 + 2 * (o % 16) + k % 2] = bf16_bits((float)code);
                if (nibble) /* row k / 2, byte o % 16: code k in the low nibble where k is even */
                    nibble[(k / 2) * 16 + o % 16] = (uint8_t)(k % 2 ? nibble[(k / 2) * 16 + o % 16] | code << 4 : code);
            }
            float *factors = w->factors + ((size_t)(o / 16) * groups + g) * 32;
            factors[o % 16] = scales[(size_t)o * groups + g], factors[16 + o % 16] = biases[(size_t)o * groups + g];
        }
    return w;
#else
    (void)codes, (void)scales, (void)biases, (void)out, (void)in;
    return NULL;
#endif
}

void amx_free(void *weight) {
    amx_weight_t *w = weight;
    if (!w) return;
    free(w->tiles), free(w->nibbles), free(w->factors), free(w);
}

/* The AMX copy's bytes. */
size_t amx_bytes(void *weight) {
    const amx_weight_t *w = weight;
    return (size_t)w->out * w->in * (w->nibbles ? 5 : 4) / 2 + 2 * sizeof(float) * (size_t)w->out * (w->in / 32);
}

#if AMX
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config_t;

/* Eight tiles of 16 rows of 64 bytes: 0-3 the sums, then the 32-row kernel's two pieces' tiles (4-5)
   and two code tiles (6-7), or the few-row kernel's three pieces' tiles (4-6) and one code tile (7).
   A thread loads the configuration once. */
static void amx_configure(void) {
    static __thread int configured;
    if (configured) return;
    tile_config_t cfg = {.palette = 1};
    for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
    configured = 1;
}

typedef struct {
    const amx_weight_t *w;
    const uint16_t *pieces; /* 3 planes of (padded rows, in) bfloat16 */
    const float *xsum;      /* (padded rows, groups) */
    float *y;
    int rows;
    size_t plane;
} amx_job_t;

/* Item i: rows [32 r, 32 r + 32) against channels [32 c, 32 c + 32), r = i / pairs, c = i % pairs (pairs:
   out / 32): a worker's consecutive items reuse one row block's pieces (6 bytes an input, from L2) and
   read the codes' tiles (2 bytes a weight) once per row block. Channel blocks first read the pieces
   again for every 32 channels: 3x the bytes, and a 512-row forward 1.34x slower. */
static void amx_item(void *ctx, int i, int worker) {
    (void)worker;
    const amx_job_t *job = ctx;
    const amx_weight_t *w = job->w;
    const int in = w->in, out = w->out, groups = in / 32;
    const int pairs = out / AMX_CHANNELS, r0 = i / pairs * AMX_ROWS, c0 = i % pairs * AMX_CHANNELS;
    const int cb = c0 / 16;
    float acc[AMX_ROWS][AMX_CHANNELS] __attribute__((aligned(64)));
    float sums[AMX_ROWS * AMX_CHANNELS] __attribute__((aligned(64)));
    memset(acc, 0, sizeof acc);
    amx_configure();
    for (int g = 0; g < groups; g++) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        const uint16_t *t0 = w->tiles + ((size_t)cb * groups + g) * 512, *t1 = t0 + (size_t)groups * 512;
        if (g + AMX_AHEAD < groups) /* the codes come from L3 or memory: a tile load would wait for them */
            for (int line = 0; line < 1024; line += 64) {
                _mm_prefetch((const char *)(t0 + AMX_AHEAD * 512) + line, _MM_HINT_T0);
                _mm_prefetch((const char *)(t1 + AMX_AHEAD * 512) + line, _MM_HINT_T0);
            }
        _tile_loadd(6, t0, 64);
        _tile_loadd(7, t1, 64);
        for (int p = 0; p < 3; p++) {
            const uint16_t *a = job->pieces + p * job->plane + (size_t)r0 * in + (size_t)g * 32;
            _tile_loadd(4, a, in * 2);
            _tile_loadd(5, a + (size_t)16 * in, in * 2);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, sums, 128);
        _tile_stored(1, sums + 16, 128);
        _tile_stored(2, sums + 16 * 32, 128);
        _tile_stored(3, sums + 16 * 32 + 16, 128);
        const float *f0 = w->factors + ((size_t)cb * groups + g) * 32, *f1 = f0 + (size_t)groups * 32;
        const __m512 s0 = _mm512_load_ps(f0), s1 = _mm512_load_ps(f1);
        const __m512 b0 = _mm512_load_ps(f0 + 16), b1 = _mm512_load_ps(f1 + 16);
        for (int r = 0; r < AMX_ROWS; r++) {
            const __m512 xs = _mm512_set1_ps(job->xsum[(size_t)(r0 + r) * groups + g]);
            const __m512 a0 = _mm512_fmadd_ps(b0, xs, _mm512_load_ps(acc[r]));
            const __m512 a1 = _mm512_fmadd_ps(b1, xs, _mm512_load_ps(acc[r] + 16));
            _mm512_store_ps(acc[r], _mm512_fmadd_ps(s0, _mm512_load_ps(sums + r * 32), a0));
            _mm512_store_ps(acc[r] + 16, _mm512_fmadd_ps(s1, _mm512_load_ps(sums + r * 32 + 16), a1));
        }
    }
    for (int r = 0; r < AMX_ROWS && r0 + r < job->rows; r++)
        memcpy(job->y + (size_t)(r0 + r) * out + c0, acc[r], sizeof(float) * AMX_CHANNELS);
}

/* The few-row kernel's tile of codes: 16 rows of 16 code bytes (two 4-bit codes each) expanded into the
   bfloat16 pairs TDPBF16PS reads, in L1: the codes stay 4 bits in memory, so a decode step reads as
   few bytes as the own matmuls (the bfloat16 tiles from memory made a 16-row step slower than them). */
static inline void amx_expand(const uint8_t *nibbles, uint16_t *tile, __m512i table) {
    const __m512i low = _mm512_set1_epi32(0xF), high = _mm512_set1_epi32(0xF0000);
    for (int row = 0; row < 16; row++) {
        const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(nibbles + row * 16)));
        /* dword n: code (low nibble) in its low word, code (high nibble) in its high word */
        const __m512i codes = _mm512_ternarylogic_epi32(_mm512_and_si512(bytes, low), _mm512_slli_epi32(bytes, 12), high, 0xF8);
        _mm512_store_si512(tile + row * 32, _mm512_permutexvar_epi16(codes, table));
    }
}

/* Item i of the few-row kernel: channels [64 i, 64 i + 64) for the (at most 16) rows; the three pieces'
   tiles loaded once a group, each code tile expanded once and read by three products. */
static void few_item(void *ctx, int i, int worker) {
    (void)worker;
    const amx_job_t *job = ctx;
    const amx_weight_t *w = job->w;
    const int in = w->in, out = w->out, groups = in / 32, c0 = i * FEW_CHANNELS, cb = c0 / 16;
    float acc[FEW_ROWS][FEW_CHANNELS] __attribute__((aligned(64)));
    float sums[FEW_ROWS * FEW_CHANNELS] __attribute__((aligned(64)));
    uint16_t tiles[4][512] __attribute__((aligned(64)));
    uint16_t values[32] __attribute__((aligned(64))) = {0};
    for (int c = 0; c < 16; c++) values[c] = bf16_bits((float)c);
    const __m512i table = _mm512_load_si512(values);
    memset(acc, 0, sizeof acc);
    amx_configure();
    for (int g = 0; g < groups; g++) {
        const uint8_t *nib = w->nibbles + ((size_t)cb * groups + g) * 256;
        const float *factors = w->factors + ((size_t)cb * groups + g) * 32;
        if (g + AMX_AHEAD < groups) /* a decode step's codes come from memory */
            for (int t = 0; t < 4; t++) {
                const char *next = (const char *)(nib + ((size_t)t * groups + AMX_AHEAD) * 256);
                for (int line = 0; line < 256; line += 64) _mm_prefetch(next + line, _MM_HINT_T0);
                const char *more = (const char *)(factors + ((size_t)t * groups + AMX_AHEAD) * 32);
                _mm_prefetch(more, _MM_HINT_T0), _mm_prefetch(more + 64, _MM_HINT_T0);
            }
        for (int t = 0; t < 4; t++) amx_expand(nib + (size_t)t * groups * 256, tiles[t], table);
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        const uint16_t *a = job->pieces + (size_t)g * 3 * FEW_ROWS * 32; /* the group's three tiles */
        _tile_loadd(4, a, 64);
        _tile_loadd(5, a + FEW_ROWS * 32, 64);
        _tile_loadd(6, a + 2 * FEW_ROWS * 32, 64);
/* Sum tile T += the three pieces (tiles 4-6) times code tile T, loaded into tile 7 (tile numbers are
   immediates: one expansion per tile instead of a loop). */
#define FEW_PRODUCTS(T)                \
    do {                               \
        _tile_loadd(7, tiles[T], 64);  \
        _tile_dpbf16ps(T, 4, 7);       \
        _tile_dpbf16ps(T, 5, 7);       \
        _tile_dpbf16ps(T, 6, 7);       \
    } while (0)
        FEW_PRODUCTS(0);
        FEW_PRODUCTS(1);
        FEW_PRODUCTS(2);
        FEW_PRODUCTS(3);
#undef FEW_PRODUCTS
        _tile_stored(0, sums, 256);
        _tile_stored(1, sums + 16, 256);
        _tile_stored(2, sums + 32, 256);
        _tile_stored(3, sums + 48, 256);
        for (int t = 0; t < 4; t++) {
            const float *f = factors + (size_t)t * groups * 32;
            const __m512 s = _mm512_load_ps(f), b = _mm512_load_ps(f + 16);
            for (int r = 0; r < job->rows; r++) {
                const __m512 xs = _mm512_set1_ps(job->xsum[(size_t)r * groups + g]);
                const __m512 sum = _mm512_fmadd_ps(b, xs, _mm512_load_ps(acc[r] + 16 * t));
                _mm512_store_ps(acc[r] + 16 * t, _mm512_fmadd_ps(s, _mm512_load_ps(sums + r * 64 + 16 * t), sum));
            }
        }
    }
    for (int r = 0; r < job->rows; r++) memcpy(job->y + (size_t)r * out + c0, acc[r], sizeof(float) * FEW_CHANNELS);
}

/* A product's input as the tiles read it: x's rows split into three bfloat16 pieces (planes of `plane`
   values, rows past `rows` zero) and each row's group sums (float32, in order). Made once for the
   products that share an input (q, k and v; gate and up). */
typedef struct {
    const float *x;
    uint16_t *pieces;
    float *xsum;
    int rows, padded, in, few; /* few: for the few-row kernel (rows padded to 16) */
    size_t plane;
} amx_input_t;

static void amx_split_item(void *ctx, int r, int worker) {
    (void)worker;
    const amx_input_t *a = ctx;
    const int in = a->in, groups = in / 32;
    uint16_t *p1 = a->pieces + (size_t)r * in, *p2 = p1 + a->plane, *p3 = p2 + a->plane;
    float *xs = a->xsum + (size_t)r * groups;
    if (r >= a->rows) {
        for (int g = 0; a->few && g < groups; g++)
            for (int p = 0; p < 3; p++) memset(a->pieces + ((size_t)(g * 3 + p) * FEW_ROWS + r) * 32, 0, 64);
        if (!a->few) memset(p1, 0, (size_t)in * 2), memset(p2, 0, (size_t)in * 2), memset(p3, 0, (size_t)in * 2);
        memset(xs, 0, sizeof(float) * groups);
        return;
    }
    const float *xr = a->x + (size_t)r * in;
    for (int i = 0; i < in; i += 16) {
        const __m512 v = _mm512_loadu_ps(xr + i);
        const __m256bh h1 = _mm512_cvtneps_pbh(v);
        const __m512 r1 = _mm512_sub_ps(v, _mm512_cvtpbh_ps(h1));
        const __m256bh h2 = _mm512_cvtneps_pbh(r1);
        const __m256bh h3 = _mm512_cvtneps_pbh(_mm512_sub_ps(r1, _mm512_cvtpbh_ps(h2)));
        if (a->few) { /* tile by tile: group i / 32's three pieces, each 16 rows of 32 */
            uint16_t *tile = a->pieces + ((size_t)(i / 32) * 3 * FEW_ROWS + r) * 32 + i % 32;
            _mm256_storeu_si256((__m256i *)tile, (__m256i)h1);
            _mm256_storeu_si256((__m256i *)(tile + FEW_ROWS * 32), (__m256i)h2);
            _mm256_storeu_si256((__m256i *)(tile + 2 * FEW_ROWS * 32), (__m256i)h3);
            continue;
        }
        _mm256_storeu_si256((__m256i *)(p1 + i), (__m256i)h1);
        _mm256_storeu_si256((__m256i *)(p2 + i), (__m256i)h2);
        _mm256_storeu_si256((__m256i *)(p3 + i), (__m256i)h3);
    }
    for (int g = 0; g < groups; g++) {
        float s = 0.f;
        for (int j = 0; j < 32; j++) s += xr[g * 32 + j];
        xs[g] = s;
    }
}

/* x (rows, in) split for the tiles (rows padded to 16 for the few-row kernel, else to 32), into memory kept for the next product (the forward runs one call at
   a time, as its other scratch assumes). Returns 0 where the memory could not be had. */
static int amx_input(const float *x, int rows, int in, int few, amx_input_t *a) {
    static void *scratch;
    static size_t scratch_size;
    const int unit = few ? FEW_ROWS : AMX_ROWS, padded = (rows + unit - 1) / unit * unit;
    const size_t plane = (size_t)padded * in, pieces = (plane * 3 * 2 + 63) / 64 * 64;
    const size_t need = pieces + sizeof(float) * (size_t)padded * (in / 32);
    if (need > scratch_size) {
        free(scratch);
        scratch = aligned_alloc(64, (need + 63) / 64 * 64);
        scratch_size = scratch ? need : 0;
        if (!scratch) return 0;
    }
    *a = (amx_input_t){x, scratch, (float *)((char *)scratch + pieces), rows, padded, in, few, plane};
    parallel_for(padded, amx_split_item, a);
    return 1;
}

/* y = w(x) for an input amx_input made, as items of the pool (the few-row kernel for a `few` input). */
static void amx_product(const amx_weight_t *w, const amx_input_t *a, float *y) {
    amx_job_t job = {w, a->pieces, a->xsum, y, a->rows, a->plane};
    if (a->few)
        parallel_for(w->out / FEW_CHANNELS, few_item, &job);
    else
        parallel_for(a->padded / AMX_ROWS * (w->out / AMX_CHANNELS), amx_item, &job);
    atomic_fetch_add_explicit(&amx_calls, 1, memory_order_relaxed);
}
/* y = x @ w.T, x (rows, in), y (rows, out), for the tests and bench/amx.py (`few`: through the few-row
   kernel, rows at most 16): 0, or -1 without memory or where the weight has no few-row tiles. */
int amx_multiply(void *weight, const float *x, float *y, int rows, int few) {
    const amx_weight_t *w = weight;
    amx_input_t a;
    if ((few && (rows > FEW_ROWS || !w->nibbles)) || !amx_input(x, rows, w->in, few, &a)) return -1;
    amx_product(weight, &a, y);
    return 0;
}
#else
typedef struct {
    int rows;
} amx_input_t;

int amx_multiply(void *weight, const float *x, float *y, int rows, int few) {
    (void)weight, (void)x, (void)y, (void)rows, (void)few;
    return -1;
}

static int amx_input(const float *x, int rows, int in, int few, amx_input_t *a) {
    (void)x, (void)rows, (void)in, (void)few, (void)a;
    return 0;
}

static void amx_product(const amx_weight_t *w, const amx_input_t *a, float *y) { (void)w, (void)a, (void)y; }
#endif

/* How `rows` rows of a weight with AMX tiles are multiplied: AMX_MANY (the 32-row kernel, for rows past
   the own matmuls' (`past`) where the load kept it (`many`)), AMX_FEW (the few-row kernel: from few_min
   to 16 rows, where the load measured it faster than the own matmuls, and the weight has its tiles), or
   0 (not on AMX). */
enum { AMX_MANY = 1, AMX_FEW = 2 };
static inline int amx_use(const void *weight, int rows, int past, int many, int few_min) {
    if (!weight || rows < 1) return 0;
    if (past) return many && rows > 1 ? AMX_MANY : 0;
    return rows >= few_min && rows <= FEW_ROWS && ((const amx_weight_t *)weight)->nibbles ? AMX_FEW : 0;
}
