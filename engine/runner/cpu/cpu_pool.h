/* The C forward's work-sharing pool: a helper thread that claims items of the caller's loops.
   Included once, by cpu_decode.c: one translation unit, whose macros (the model's sizes, SIMD_*) it uses. */
#pragma once

/* The work-sharing pool: parallel_for(n, fn, ctx) runs fn(ctx, i, worker) for i < n on the caller
   (worker 0) and the helper (worker 1). Each worker owns a range of the items, first and end packed in
   one atomic, and takes them one at a time from its front, in order: each core streams its own half of
   a weight from memory. (Items dealt out in turn, 24 output channels each, broke both cores' streams
   at every item: a one-row 4-bit forward took 1.5x as long.) A worker whose range is empty takes
   items from the back of the other's, so a preempted worker's items do not wait for it. The caller
   waits only for items already claimed. A job's fields are written while every range is empty, and
   the ranges publish them: a claim that finds an item belongs to the job whose fields it then reads,
   however late the claimer is. */
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
    atomic_int generation, sleeping, done, blas;
    _Atomic uint64_t range[WORKERS]; /* (first << 32) | end of the items a worker has not claimed */
    task_fn fn;
    void *ctx;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* Claims items of `owner`'s range: one from its front for the owner itself, a quarter of what is left
   (at least one) from its back for the other worker. Returns how many, from *first on; 0 when empty. */
static int claim(int owner, int own, int *first) {
    uint64_t range = atomic_load(&pool.range[owner]);
    for (;;) {
        const uint32_t front = (uint32_t)(range >> 32), end = (uint32_t)range;
        if (front >= end) return 0;
        const uint32_t take = own ? 1 : 1 + (end - front - 1) / 4;
        const uint64_t rest = own ? (uint64_t)(front + take) << 32 | end : (uint64_t)front << 32 | (end - take);
        if (atomic_compare_exchange_weak(&pool.range[owner], &range, rest)) {
            *first = (int)(own ? front : end - take);
            return (int)take;
        }
    }
}

static void run_items(int worker) {
    for (int owner = worker, k = 0; k < WORKERS; k++, owner = (owner + 1) % WORKERS) {
        int first, taken;
        while ((taken = claim(owner, owner == worker, &first)) > 0) {
            for (int i = first; i < first + taken; i++) pool.fn(pool.ctx, i, worker);
            atomic_fetch_add(&pool.done, taken);
        }
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
    pool.fn = fn, pool.ctx = ctx; /* every range is empty: the last job's items are all done */
    atomic_store(&pool.blas, 0);
    atomic_store(&pool.done, 0);
    for (int w = 0; w < WORKERS; w++) /* worker w's share: items [n * w / WORKERS, n * (w + 1) / WORKERS) */
        atomic_store(&pool.range[w], (uint64_t)(n * w / WORKERS) << 32 | (uint64_t)(n * (w + 1) / WORKERS));
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
