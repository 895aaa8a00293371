/* Many-row float32 products of the C forward through oneDNN's matmul (engine/runner/cpu/onednn.py builds
   and loads this beside cpu_decode.c, which calls it through pointers: cpu_matmul.h's onednn_linear).

   Why: a prefill chunk's products are most of a 16-client load's time on the CPU, and OpenBLAS's sgemm
   packs the whole weight again at every call and splits each call over its own two threads, which
   wait for each other at its end (a thread preempted by another process holds up its partner).
   oneDNN's matmul reads a weight packed once at load in the layout its kernel wants (brgemm on
   AVX-512/AVX2, picked at run time for the CPU), and one call on one thread runs near the core's peak,
   so the forward hands out (rows, output channels) blocks as items of its own work-sharing pool
   (parallel_for), and a preempted worker's blocks go to the other. A weight is packed as blocks of
   output channels, each its own matrix: a worker streams its own channels' weights (each byte read
   once a product), and a call writes a dense (rows, channels) result that is copied into place.

   Each call runs on the calling thread alone: oneDNN's OpenMP runtime is held to one thread on every
   thread that calls it (omp_set_num_threads(1) before the first call), and the primitives are created
   under that setting, so none of them starts a parallel region. A primitive exists per row count
   (1 to MAX_ROWS) and block shape (blocks of one shape share them: the packed block is an argument),
   created at first use under a lock and never freed; execution is concurrent (each call brings its own
   memory objects, stream and scratchpad). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#define MAX_ROWS 256    /* the most rows one call takes: cpu_matmul.h's ONEDNN_ROWS */
#define CHANNELS 256    /* output channels a block holds at most */
#define MAX_SHAPES 64   /* distinct (inputs, channels) block shapes */
#define MAX_BLOCKS 1024 /* blocks of one weight */

void omp_set_num_threads(int); /* libgomp's, which libdnnl links */

typedef struct {
    int in, out;
    char impl[64];                                /* the kernel oneDNN picked, e.g. "brg:avx512_core" */
    dnnl_memory_desc_t packed_md;                 /* the blocks' layout the primitives read */
    _Atomic(dnnl_primitive_t) rows[MAX_ROWS + 1]; /* by row count */
    dnnl_memory_desc_t src[MAX_ROWS + 1], dst[MAX_ROWS + 1], scratch[MAX_ROWS + 1];
} shape_t;

typedef struct {
    int out, n_blocks, per; /* per: channels of every block but the last */
    shape_t *shape[MAX_BLOCKS];
    dnnl_memory_t packed[MAX_BLOCKS];
} weight_t;

static dnnl_engine_t engine;
static shape_t shapes[MAX_SHAPES];
static int n_shapes;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_long calls, live;

static __thread int single;           /* omp_set_num_threads(1) done on this thread */
static __thread dnnl_stream_t stream; /* this thread's */
static __thread float *buf;           /* this thread's dense result, then its scratchpad */
static __thread size_t buf_size;

static void one_thread(void) {
    if (!single) omp_set_num_threads(1), single = 1;
}

/* The matmul primitive of `rows` rows: src (rows, in), weights (in, out) as `wmd` (or any layout when
   NULL), dst (rows, out) dense, scratchpad the caller's. */
static dnnl_primitive_desc_t matmul_pd(int rows, int in, int out, const_dnnl_memory_desc_t wmd) {
    dnnl_memory_desc_t src = NULL, dst = NULL, any = NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_dims_t sd = {rows, in}, wd = {in, out}, dd = {rows, out};
    if (dnnl_memory_desc_create_with_tag(&src, 2, sd, dnnl_f32, dnnl_ab) ||
        dnnl_memory_desc_create_with_tag(&dst, 2, dd, dnnl_f32, dnnl_ab) ||
        (!wmd && dnnl_memory_desc_create_with_tag(&any, 2, wd, dnnl_f32, dnnl_format_tag_any)) ||
        dnnl_primitive_attr_create(&attr) || dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) ||
        dnnl_matmul_primitive_desc_create(&pd, engine, src, wmd ? wmd : any, NULL, dst, attr))
        pd = NULL;
    dnnl_memory_desc_destroy(src), dnnl_memory_desc_destroy(dst), dnnl_memory_desc_destroy(any);
    dnnl_primitive_attr_destroy(attr);
    return pd;
}

/* The block shape (in, out) with its packed layout, added at first use (under the lock); NULL where
   oneDNN has no matmul for it. */
static shape_t *shape_of(int in, int out) {
    for (int i = 0; i < n_shapes; i++)
        if (shapes[i].in == in && shapes[i].out == out) return &shapes[i];
    dnnl_primitive_desc_t pd = matmul_pd(MAX_ROWS, in, out, NULL);
    shape_t *shape = NULL;
    if (pd && n_shapes < MAX_SHAPES &&
        !dnnl_memory_desc_clone(&shapes[n_shapes].packed_md, dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0))) {
        shape = &shapes[n_shapes++];
        shape->in = in, shape->out = out;
        const char *name = "";
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
        strncpy(shape->impl, name, sizeof(shape->impl) - 1);
    }
    dnnl_primitive_desc_destroy(pd);
    return shape;
}

/* Rows [c0, c0 + n) of w (out, in) as `shape`'s packed layout; NULL where oneDNN could not. */
static dnnl_memory_t pack_block(const float *w, int in, int c0, int n, shape_t *shape) {
    dnnl_memory_desc_t plain = NULL;
    dnnl_memory_t from = NULL, packed = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t reorder = NULL;
    dnnl_stream_t s = NULL;
    dnnl_dims_t dims = {in, n}, strides = {1, in}; /* the block's transpose, without a copy */
    int ok = !dnnl_memory_desc_create_with_strides(&plain, 2, dims, dnnl_f32, strides) &&
             !dnnl_memory_create(&from, plain, engine, (void *)(w + (size_t)c0 * in)) &&
             !dnnl_memory_create(&packed, shape->packed_md, engine, DNNL_MEMORY_ALLOCATE) &&
             !dnnl_reorder_primitive_desc_create(&pd, plain, engine, shape->packed_md, engine, NULL) &&
             !dnnl_primitive_create(&reorder, pd) && !dnnl_stream_create(&s, engine, dnnl_stream_default_flags);
    if (ok) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, packed}};
        ok = !dnnl_primitive_execute(reorder, s, 2, args) && !dnnl_stream_wait(s);
    }
    dnnl_primitive_desc_destroy(pd), dnnl_primitive_destroy(reorder), dnnl_stream_destroy(s);
    dnnl_memory_desc_destroy(plain), dnnl_memory_destroy(from);
    if (!ok) dnnl_memory_destroy(packed);
    return ok ? packed : NULL;
}

/* The weight w (out, in) float32, row-major (nn.Linear's), packed as blocks of output channels, and
   the name of the kernel oneDNN picked (impl, at least 64 bytes). NULL where oneDNN cannot. */
void *onednn_weight(const float *w, int out, int in, char *impl) {
    one_thread();
    pthread_mutex_lock(&lock);
    if (!engine && dnnl_engine_create(&engine, dnnl_cpu, 0)) engine = NULL;
    weight_t *wt = engine ? calloc(1, sizeof(weight_t)) : NULL;
    int ok = wt != NULL;
    if (ok) {
        wt->n_blocks = (out + CHANNELS - 1) / CHANNELS;
        wt->per = ((out + wt->n_blocks - 1) / wt->n_blocks + 15) / 16 * 16; /* even blocks, 16-channel steps */
        wt->n_blocks = (out + wt->per - 1) / wt->per;
        wt->out = out;
        ok = wt->n_blocks <= MAX_BLOCKS;
    }
    for (int b = 0; ok && b < wt->n_blocks; b++) {
        const int c0 = b * wt->per, n = out - c0 < wt->per ? out - c0 : wt->per;
        ok = (wt->shape[b] = shape_of(in, n)) && (wt->packed[b] = pack_block(w, in, c0, n, wt->shape[b]));
    }
    if (ok) memcpy(impl, wt->shape[0]->impl, sizeof(wt->shape[0]->impl));
    pthread_mutex_unlock(&lock);
    if (!ok && wt)
        for (int b = 0; b < wt->n_blocks && b < MAX_BLOCKS; b++) dnnl_memory_destroy(wt->packed[b]);
    if (!ok) free(wt), wt = NULL;
    if (wt) atomic_fetch_add(&live, 1);
    return wt;
}

int onednn_blocks(void *weight) { return ((weight_t *)weight)->n_blocks; }

/* Frees a weight's packed blocks (its engine is gone; the shapes' primitives stay for the next). */
void onednn_free(void *weight) {
    weight_t *wt = weight;
    for (int b = 0; b < wt->n_blocks; b++) dnnl_memory_destroy(wt->packed[b]);
    free(wt);
    atomic_fetch_sub(&live, 1);
}

/* Packed weights not freed yet, in this process. */
long onednn_live(void) { return atomic_load(&live); }

/* The primitive for `rows` rows of `shape`, created at first use; NULL where oneDNN has none that
   reads the packed layout. */
static dnnl_primitive_t rows_primitive(shape_t *shape, int rows) {
    dnnl_primitive_t prim = atomic_load(&shape->rows[rows]);
    if (prim) return prim;
    pthread_mutex_lock(&lock);
    prim = atomic_load(&shape->rows[rows]);
    if (!prim) {
        dnnl_primitive_desc_t pd = matmul_pd(rows, shape->in, shape->out, shape->packed_md);
        if (pd && !dnnl_primitive_create(&prim, pd)) {
            dnnl_memory_desc_clone(&shape->src[rows], dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0));
            dnnl_memory_desc_clone(&shape->dst[rows], dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0));
            dnnl_memory_desc_clone(&shape->scratch[rows], dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
            atomic_store(&shape->rows[rows], prim);
        } else {
            prim = NULL;
        }
        dnnl_primitive_desc_destroy(pd);
    }
    pthread_mutex_unlock(&lock);
    return prim;
}

/* Whether calls of `rows` rows can run on every block (their primitives created now where they were
   not): the caller asks before handing out a product's blocks, and runs sgemm instead on 0. */
int onednn_ready(void *weight, int rows) {
    weight_t *wt = weight;
    if (rows < 1 || rows > MAX_ROWS) return 0;
    one_thread();
    for (int b = 0; b < wt->n_blocks; b++)
        if (!rows_primitive(wt->shape[b], rows)) return 0;
    return 1;
}

/* y[:, block's channels] = x @ block.T on this thread: x (rows, in) dense, y (rows, out) row-major,
   for a row count onednn_ready accepted. Returns 0, or -1 where oneDNN could not (out of memory). */
int onednn_rows(void *weight, int block, const float *x, float *y, int rows) {
    weight_t *wt = weight;
    shape_t *shape = wt->shape[block];
    one_thread();
    dnnl_primitive_t prim = atomic_load(&shape->rows[rows]);
    const size_t result = (size_t)rows * shape->out * sizeof(float);
    const size_t need = (result + 63) / 64 * 64 + dnnl_memory_desc_get_size(shape->scratch[rows]);
    if (need > buf_size) {
        free(buf);
        buf = aligned_alloc(64, (need + 63) / 64 * 64);
        buf_size = buf ? need : 0;
        if (!buf) return -1;
    }
    if (!stream && dnnl_stream_create(&stream, engine, dnnl_stream_default_flags)) return stream = NULL, -1;
    dnnl_memory_t src = NULL, dst = NULL, scratch = NULL;
    int ok = !dnnl_memory_create(&src, shape->src[rows], engine, (void *)x) &&
             !dnnl_memory_create(&dst, shape->dst[rows], engine, buf) &&
             !dnnl_memory_create(&scratch, shape->scratch[rows], engine, (char *)buf + (result + 63) / 64 * 64);
    if (ok) {
        dnnl_exec_arg_t args[4] = {
            {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wt->packed[block]}, {DNNL_ARG_DST, dst}, {DNNL_ARG_SCRATCHPAD, scratch}};
        ok = !dnnl_primitive_execute(prim, stream, 4, args) && !dnnl_stream_wait(stream);
    }
    dnnl_memory_destroy(src), dnnl_memory_destroy(dst), dnnl_memory_destroy(scratch);
    if (!ok) return -1;
    const int c0 = block * wt->per, n = shape->out;
    for (int r = 0; r < rows; r++) memcpy(y + (size_t)r * wt->out + c0, buf + (size_t)r * n, sizeof(float) * n);
    atomic_fetch_add_explicit(&calls, 1, memory_order_relaxed);
    return 0;
}

/* Blocks multiplied so far, in this process (the tests' evidence that the forward took this path). */
long onednn_calls(void) { return atomic_load(&calls); }

/* The packed copy's bytes (what the weight costs in memory beside the float32 one). */
size_t onednn_bytes(void *weight) {
    weight_t *wt = weight;
    size_t total = 0;
    for (int b = 0; b < wt->n_blocks; b++) total += dnnl_memory_desc_get_size(wt->shape[b]->packed_md);
    return total;
}

/* The instruction set oneDNN generates its kernels for on this machine (ONEDNN_MAX_CPU_ISA may lower it). */
const char *onednn_isa(void) {
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse4.1";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2_vnni_2: return "avx2_vnni_2";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_fp16: return "avx512_core_fp16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}
