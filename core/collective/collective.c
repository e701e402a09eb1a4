/* The process's place in a distributed run and the collectives' dispatch (see collective.h). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/log.h>

#include "collective/collective.h"
#include "collective/collective_backend.h"
#include "collective/start_watch.h"
#include "sibling_library.h"

static ctrl_collective_info info = {0, 1, 0, 1, "none", "none"};
static const ctrl_collective_backend *backend; /* NULL on a single rank */
static int initialised, device_ready;
static double timeout_s = 1800; /* [train] ddp_timeout: MPI_Init's and every host collective's */
static char start_dir[4096];    /* where the ranks leave their mark before MPI_Init (start_watch.h) */

/* An integer environment variable, or -1. */
static int env_int(const char *name) {
    const char *v = getenv(name);
    if (!v || !*v) return -1;
    char *end;
    long x = strtol(v, &end, 10);
    return *end || x < 0 || x > 1 << 30 ? -1 : (int)x;
}

/* The launcher's word on rank, size and local rank: mpirun (OpenMPI), a PMI launcher (MPICH's
 * Hydra, Intel MPI), Slurm's srun. */
static void from_environment(ctrl_collective_info *e) {
    static const struct {
        const char *launcher, *rank, *size, *local_rank, *local_size;
    } vars[] = {
        {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE"},
        {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
        {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
    };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const int rank = env_int(vars[i].rank), size = env_int(vars[i].size);
        if (rank < 0 || size < 1 || rank >= size) continue;
        const int lr = env_int(vars[i].local_rank), ls = env_int(vars[i].local_size);
        *e = (ctrl_collective_info){rank, size, lr >= 0 ? lr : 0, ls > 0 ? ls : 1, vars[i].launcher, "none"};
        return;
    }
}

static int rank_prefix(char *buf, int cap, void *user) {
    (void)user;
    return snprintf(buf, (size_t)cap, "[rank %d] ", info.rank);
}

void ctrl_collective_detect(void) {
    if (initialised) return;
    from_environment(&info);
    if (info.size > 1) ctrl_log_set_prefix(rank_prefix, NULL);
}

void ctrl_collective_set_start_dir(const char *dir) {
    snprintf(start_dir, sizeof start_dir, "%s", dir && strlen(dir) < sizeof start_dir ? dir : "");
}

ctrl_status ctrl_collective_init(void) {
    if (initialised) return CTRL_OK;
    ctrl_collective_info env = {0, 1, 0, 1, "none", "none"};
    from_environment(&env);
    if (env.size == 1) { /* not launched, or launched as one rank: no MPI at all */
        initialised = 1;
        return CTRL_OK;
    }
    char why[1024];
    /* RTLD_GLOBAL: OpenMPI dlopens its own components, which expect libmpi's symbols global */
    const ctrl_collective_backend *b = ctrl_sibling_library_table(
        "libctrl_mpi.so", "CTRL_MPI_LIBRARY", "ctrl_collective_mpi_backend", 1, why, sizeof why);
    if (!b)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "started as rank %d of %d (%s's environment): %s (ctrl built without MPI?)",
                              env.rank, env.size, env.launcher, why);
    ctrl_collective_info got = env;
    start_watch_begin(&env, start_dir[0] ? start_dir : NULL, timeout_s); /* MPI_Init has no timeout */
    ctrl_status st = b->init(&got.rank, &got.size, &got.local_rank, &got.local_size);
    /* MPI_Init returned on this rank: every rank called it, so their marks can go */
    start_watch_done(st == CTRL_OK && got.size == env.size && got.rank == env.rank);
    if (st != CTRL_OK) return ctrl_error_wrap(st, "rank %d of %d (%s)", env.rank, env.size, env.launcher);
    if (got.size != env.size || got.rank != env.rank) {
        b->finalize();
        return ctrl_error_set(CTRL_ERR_DEVICE,
                              "the launcher (%s) started rank %d of %d but MPI_Init made rank %d of %d: "
                              "this MPI cannot talk to that launcher (with srun, try --mpi=pmix, or "
                              "launch with mpirun)",
                              env.launcher, env.rank, env.size, got.rank, got.size);
    }
    got.backend = "mpi";
    info = got, backend = b, initialised = 1;
    ctrl_log_set_prefix(rank_prefix, NULL);
    ctrl_collective_set_timeout(timeout_s);
    return CTRL_OK;
}

void ctrl_collective_finalize(int failed, int exit_code) {
    if (!backend) return;
    if (failed) backend->abort_job(exit_code ? exit_code : 1);
    backend->finalize();
    backend = NULL;
}

const ctrl_collective_info *ctrl_collective_info_get(void) { return &info; }
int ctrl_collective_rank(void) { return info.rank; }
int ctrl_collective_size(void) { return info.size; }
int ctrl_collective_local_rank(void) { return info.local_rank; }

ctrl_status ctrl_collective_allreduce_sum_f64(double *buf, size_t n) {
    return backend ? backend->allreduce(buf, n, CTRL_COLL_F64, CTRL_COLL_SUM) : CTRL_OK;
}

ctrl_status ctrl_collective_allreduce_max_f64(double *buf, size_t n) {
    return backend ? backend->allreduce(buf, n, CTRL_COLL_F64, CTRL_COLL_MAX) : CTRL_OK;
}

/* buf[0..n) divided by the number of ranks: a product where that is a power of two (the reciprocal
 * exact: the same bits as the quotient), else the quotient; vectorised and over the OpenMP threads
 * (a scalar division was ~20-40 ms of a 126 MB gradient's allreduce). */
static void divide_by_ranks(float *buf, size_t n) {
    const float d = (float)info.size;
    const long count = (long)n;
    if ((info.size & (info.size - 1)) == 0) {
        const float inv = 1.0f / d;
#pragma omp parallel for simd schedule(static)
        for (long i = 0; i < count; i++) buf[i] *= inv;
    } else {
#pragma omp parallel for simd schedule(static)
        for (long i = 0; i < count; i++) buf[i] /= d;
    }
}

ctrl_status ctrl_collective_allreduce_mean_f32(float *buf, size_t n) {
    if (!backend) return CTRL_OK;
    ctrl_status st = backend->allreduce(buf, n, CTRL_COLL_F32, CTRL_COLL_SUM);
    if (st == CTRL_OK) divide_by_ranks(buf, n);
    return st;
}

static float *shared_buf;
static size_t shared_n;
static float *const *shared_peers; /* every rank's buffer, mapped here */

ctrl_status ctrl_collective_shared_f32(size_t n, float **buf) {
    *buf = NULL;
    if (!backend) return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "collective: one rank");
    if (backend->size < offsetof(ctrl_collective_backend, shared_fence) + sizeof backend->shared_fence ||
        !backend->shared_alloc_f32 || !backend->shared_fence)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "libctrl_mpi.so has no shared buffers (an old build)");
    ctrl_status st = backend->shared_alloc_f32(n, &shared_buf, &shared_peers);
    if (st == CTRL_OK) *buf = shared_buf, shared_n = n;
    return st;
}

/* Slice r of n floats over `size` ranks: [*lo, *hi), the bounds multiples of 16 floats (64 bytes:
 * no two ranks write one cache line). */
static void slice(size_t n, int r, int size, size_t *lo, size_t *hi) {
    const size_t lines = (n + 15) / 16, per = lines / (size_t)size, extra = lines % (size_t)size;
    const size_t a = (size_t)r * per + ((size_t)r < extra ? (size_t)r : extra);
    const size_t b = a + per + ((size_t)r < extra ? 1 : 0);
    *lo = a * 16 < n ? a * 16 : n, *hi = b * 16 < n ? b * 16 : n;
}

/* out[i] = (sum over the ranks p in order of peers[p][lo + i]) / size, i < count. */
static void sum_slice(float *out, float *const *peers, int size, size_t lo, size_t count) {
    const long c = (long)count;
    const float d = (float)size, inv = 1.0f / d;
    const int pow2 = (size & (size - 1)) == 0;
    const float *a = peers[0] + lo, *b = peers[1] + lo;
    if (size == 2) { /* the common case in one pass */
#pragma omp parallel for simd schedule(static)
        for (long i = 0; i < c; i++) out[i] = (a[i] + b[i]) * inv;
        return;
    }
#pragma omp parallel for schedule(static)
    for (long i = 0; i < c; i++) {
        float s = a[i] + b[i];
        for (int p = 2; p < size; p++) s += peers[p][lo + (size_t)i];
        out[i] = pow2 ? s * inv : s / d;
    }
}

ctrl_status ctrl_collective_allreduce_mean_shared_f32(float *buf, size_t n) {
    if (!backend) return CTRL_OK;
    if (!shared_buf || buf != shared_buf || n != shared_n)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "collective: not the shared buffer");
    const int size = info.size, me = info.rank;
    size_t lo, hi;
    ctrl_status st = backend->shared_fence(); /* every rank's gradients written */
    if (st != CTRL_OK) return st;
    slice(n, me, size, &lo, &hi);
    sum_slice(buf + lo, shared_peers, size, lo, hi - lo);
    if ((st = backend->shared_fence()) != CTRL_OK) return st; /* every slice summed */
    for (int p = 0; p < size; p++) {
        if (p == me) continue;
        slice(n, p, size, &lo, &hi);
        memcpy(buf + lo, shared_peers[p] + lo, (hi - lo) * sizeof(float));
    }
    return backend->shared_fence(); /* copied: the next backward may write this rank's slice */
}

ctrl_status ctrl_collective_broadcast(void *buf, size_t bytes, int root) {
    return backend ? backend->broadcast(buf, bytes, root) : CTRL_OK;
}

/* The table's ZeRO entries (a libctrl_mpi.so from before them lacks them). */
static int has_zero_ops(void) {
    return backend->size >= offsetof(ctrl_collective_backend, recv) + sizeof backend->recv;
}

static ctrl_status no_zero_ops(void) {
    return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                          "libctrl_mpi.so has no allgather/reduce-scatter (an old build)");
}

ctrl_status ctrl_collective_allgather_f32(float *buf, const int *counts) {
    if (!backend) return CTRL_OK;
    return has_zero_ops() ? backend->allgather_f32(buf, counts) : no_zero_ops();
}

ctrl_status ctrl_collective_allgather_start_f32(float *buf, const int *counts, void **handle) {
    *handle = NULL;
    if (!backend) return CTRL_OK;
    if (!has_zero_ops()) return no_zero_ops();
    if (backend->size < offsetof(ctrl_collective_backend, allgather_wait) + sizeof backend->allgather_wait ||
        !backend->allgather_start_f32)
        return backend->allgather_f32(buf, counts); /* an older backend: done at once */
    return backend->allgather_start_f32(buf, counts, handle);
}

ctrl_status ctrl_collective_allgather_wait(void *handle) {
    return handle ? backend->allgather_wait(handle) : CTRL_OK;
}

ctrl_status ctrl_collective_reduce_scatter_start_f32(float *buf, const int *counts, void **handle) {
    *handle = NULL;
    if (!backend) return CTRL_OK;
    if (!has_zero_ops()) return no_zero_ops();
    if (backend->size <
            offsetof(ctrl_collective_backend, reduce_scatter_wait) + sizeof backend->reduce_scatter_wait ||
        !backend->reduce_scatter_start_f32)
        return backend->reduce_scatter_sum_f32(buf, counts); /* an older backend: done at once */
    return backend->reduce_scatter_start_f32(buf, counts, handle);
}

ctrl_status ctrl_collective_reduce_scatter_wait_mean(void *handle, float *buf, const int *counts) {
    ctrl_status st = handle ? backend->reduce_scatter_wait(handle) : CTRL_OK;
    if (!backend) return st;
    size_t at = 0;
    for (int r = 0; r < info.rank; r++) at += (size_t)counts[r];
    if (st == CTRL_OK) divide_by_ranks(buf + at, (size_t)counts[info.rank]);
    return st;
}

ctrl_status ctrl_collective_reduce_scatter_mean_f32(float *buf, const int *counts) {
    if (!backend) return CTRL_OK;
    ctrl_status st = has_zero_ops() ? backend->reduce_scatter_sum_f32(buf, counts) : no_zero_ops();
    size_t at = 0;
    for (int r = 0; r < info.rank; r++) at += (size_t)counts[r];
    if (st == CTRL_OK) divide_by_ranks(buf + at, (size_t)counts[info.rank]);
    return st;
}

ctrl_status ctrl_collective_gather_f32(float *buf, const int *counts, int root) {
    if (!backend) return CTRL_OK;
    if (backend->size < offsetof(ctrl_collective_backend, gather_f32) + sizeof backend->gather_f32 ||
        !backend->gather_f32)
        return has_zero_ops() ? backend->allgather_f32(buf, counts) : no_zero_ops(); /* an older backend */
    return backend->gather_f32(buf, counts, root);
}

ctrl_status ctrl_collective_send(const void *buf, size_t bytes, int to) {
    if (!backend) return ctrl_error_set(CTRL_ERR_RUNTIME, "collective: send on a single rank");
    return has_zero_ops() ? backend->send(buf, bytes, to) : no_zero_ops();
}

ctrl_status ctrl_collective_recv(void *buf, size_t bytes, int from) {
    if (!backend) return ctrl_error_set(CTRL_ERR_RUNTIME, "collective: recv on a single rank");
    return has_zero_ops() ? backend->recv(buf, bytes, from) : no_zero_ops();
}

ctrl_status ctrl_collective_barrier(void) { return backend ? backend->barrier() : CTRL_OK; }

void ctrl_collective_set_timeout(double seconds) {
    timeout_s = seconds;
    if (backend && backend->size > offsetof(ctrl_collective_backend, set_timeout) && backend->set_timeout)
        backend->set_timeout(seconds);
}

ctrl_status ctrl_collective_device_init(void) {
    if (!backend || device_ready) return CTRL_OK;
    if (!backend->device_init)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "libctrl_mpi.so was built without NCCL");
    ctrl_status st = backend->device_init();
    device_ready = st == CTRL_OK;
    return st;
}

ctrl_status ctrl_collective_device_allreduce_mean_f32(float *device_buf, size_t n) {
    if (!backend) return CTRL_OK;
    if (!device_ready)
        return ctrl_error_set(CTRL_ERR_DEVICE,
                              "collective: no NCCL communicator (ctrl_collective_device_init)");
    return backend->device_allreduce_mean_f32(device_buf, n);
}

/* The device collectives of ZeRO (a libctrl_mpi.so without NCCL, or older, lacks them). */
static ctrl_status device_zero_ready(void) {
    if (!device_ready) return ctrl_error_set(CTRL_ERR_DEVICE, "collective: no NCCL communicator");
    if (backend->size <
            offsetof(ctrl_collective_backend, device_allgather_f32) + sizeof backend->device_allgather_f32 ||
        !backend->device_reduce_scatter_mean_f32 || !backend->device_allgather_f32)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "libctrl_mpi.so has no NCCL reduce-scatter/all-gather "
                                                    "(built without NCCL, or an old build)");
    return CTRL_OK;
}

ctrl_status ctrl_collective_device_reduce_scatter_mean_f32(float *device_buf, const int *counts) {
    if (!backend) return CTRL_OK;
    ctrl_status st = device_zero_ready();
    return st == CTRL_OK ? backend->device_reduce_scatter_mean_f32(device_buf, counts) : st;
}

ctrl_status ctrl_collective_device_allgather_f32(float *device_buf, const int *counts) {
    if (!backend) return CTRL_OK;
    ctrl_status st = device_zero_ready();
    return st == CTRL_OK ? backend->device_allgather_f32(device_buf, counts) : st;
}

ctrl_status ctrl_collective_device_allgather_start_f32(float *device_buf, const int *counts, void **handle) {
    *handle = NULL;
    if (!backend) return CTRL_OK;
    ctrl_status st = device_zero_ready();
    if (st != CTRL_OK) return st;
    if (backend->size < offsetof(ctrl_collective_backend, device_allgather_wait) +
                            sizeof backend->device_allgather_wait ||
        !backend->device_allgather_start_f32)
        return backend->device_allgather_f32(device_buf, counts); /* an older backend: done at once */
    return backend->device_allgather_start_f32(device_buf, counts, handle);
}

ctrl_status ctrl_collective_device_allgather_b16(void *device_buf, const int *counts, void **handle) {
    if (handle) *handle = NULL;
    if (!backend) return CTRL_OK;
    ctrl_status st = device_zero_ready();
    if (st != CTRL_OK) return st;
    if (backend->size <
            offsetof(ctrl_collective_backend, device_allgather_b16) + sizeof backend->device_allgather_b16 ||
        !backend->device_allgather_b16)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "libctrl_mpi.so has no NCCL all-gather of bf16 values (an older build)");
    return backend->device_allgather_b16(device_buf, counts, handle);
}

ctrl_status ctrl_collective_device_allgather_wait(void *handle) {
    return handle ? backend->device_allgather_wait(handle) : CTRL_OK;
}

ctrl_status ctrl_collective_device_reduce_scatter_start_mean_f32(float *device_buf, const int *counts,
                                                                 void **handle) {
    *handle = NULL;
    if (!backend) return CTRL_OK;
    ctrl_status st = device_zero_ready();
    if (st != CTRL_OK) return st;
    if (backend->size < offsetof(ctrl_collective_backend, device_reduce_scatter_start_mean_f32) +
                            sizeof backend->device_reduce_scatter_start_mean_f32 ||
        !backend->device_reduce_scatter_start_mean_f32)
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "[memory] overlap_comm = true on a CUDA model: libctrl_mpi.so cannot start an NCCL "
            "reduce-scatter on its communication stream (an older build)");
    return backend->device_reduce_scatter_start_mean_f32(device_buf, counts, handle);
}

ctrl_status ctrl_collective_device_reduce_scatter_wait(void *handle) {
    return handle ? backend->device_allgather_wait(handle) : CTRL_OK; /* the same event wait */
}
