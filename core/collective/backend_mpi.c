/* The MPI backend of the collectives (libctrl_mpi.so; see collective_backend.h). Errors return
 * (MPI_ERRORS_RETURN) as ctrl errors naming the call; the caller ends the job on them. Counts are
 * int in MPI: long buffers go in chunks. Each collective is MPI's blocking call -- its tuned
 * algorithms, progressed by the waiting call itself at the transport's speed -- under a watchdog
 * (backend_mpi_watch.h) that ends the process with a message naming the call once it has waited
 * longer than [train] ddp_timeout: never a hang. (Until 2026-11 each was the non-blocking call
 * polled with MPI_Test and short sleeps: OpenMPI progresses a non-blocking collective only inside
 * MPI calls, so every sleep stalled the transfer -- a 126 MB gradient allreduce took ~1.7 s instead
 * of ~0.1-0.5 s, and two ranks ran slower than one.) The started collectives ZeRO overlaps
 * (allgather_start, reduce_scatter_start) stay non-blocking and are completed with MPI_Wait. */
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/log.h>

#include "collective/backend_mpi_watch.h"
#include "collective/backend_nccl.h"
#include "collective/collective_backend.h"

#define CHUNK (1 << 28) /* elements per call, below INT_MAX for any element size */

static void mpi_set_timeout(double seconds) { mpi_watch_set_timeout(seconds); }

static ctrl_status mpi_fail(int rc, const char *call) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
    msg[len] = '\0';
    return ctrl_error_set(CTRL_ERR_DEVICE, "%s: %s", call, len ? msg : "failed");
}

/* The return code of a blocking MPI call, made under the watchdog: MPI_SUCCESS or an error. */
#define WATCHED(call, expr) (mpi_watch_arm(call), watched_rc = (expr), mpi_watch_disarm(), watched_rc)
static int watched_rc; /* funneled: one thread communicates */

/* Completes a started collective. */
static ctrl_status wait_for(MPI_Request *req, const char *call) {
    int rc = WATCHED(call, MPI_Wait(req, MPI_STATUS_IGNORE));
    return rc == MPI_SUCCESS ? CTRL_OK : mpi_fail(rc, call);
}

static ctrl_status mpi_init(int *rank, int *size, int *local_rank, int *local_size) {
    int inited = 0, provided = 0, rc = MPI_Initialized(&inited);
    /* OpenMPI: a rank waiting in a collective yields its core between polls (sched_yield) instead of
     * spinning, unless the launcher or the user said otherwise (--mca mpi_yield_when_idle 0): on a
     * node running more than the ranks (other work, OpenMP threads) a spinning rank delays the very
     * rank it waits for; on free cores the yield returns at once. */
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
    if (rc == MPI_SUCCESS && !inited) rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Init_thread");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm node;
    if ((rc = MPI_Comm_rank(MPI_COMM_WORLD, rank)) != MPI_SUCCESS ||
        (rc = MPI_Comm_size(MPI_COMM_WORLD, size)) != MPI_SUCCESS)
        return mpi_fail(rc, "MPI_Comm_rank");
    if ((rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, *rank, MPI_INFO_NULL, &node)) !=
        MPI_SUCCESS)
        return mpi_fail(rc, "MPI_Comm_split_type");
    MPI_Comm_rank(node, local_rank);
    MPI_Comm_size(node, local_size);
    MPI_Comm_free(&node);
    if (!mpi_watch_start(*rank))
        CTRL_WARN("MPI: the collectives' watchdog did not start: a rank that stops would hang the others "
                  "([train] ddp_timeout has no effect)");
    return CTRL_OK;
}

static ctrl_status mpi_allreduce(void *buf, size_t n, ctrl_coll_dtype dtype, ctrl_coll_op op) {
    const MPI_Datatype t = dtype == CTRL_COLL_F32 ? MPI_FLOAT : MPI_DOUBLE;
    const size_t elem = dtype == CTRL_COLL_F32 ? sizeof(float) : sizeof(double);
    for (size_t i = 0; i < n; i += CHUNK) {
        const int count = (int)(n - i < CHUNK ? n - i : CHUNK);
        int rc =
            WATCHED("MPI_Allreduce", MPI_Allreduce(MPI_IN_PLACE, (char *)buf + i * elem, count, t,
                                                   op == CTRL_COLL_SUM ? MPI_SUM : MPI_MAX, MPI_COMM_WORLD));
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Allreduce");
    }
    return CTRL_OK;
}

static ctrl_status mpi_broadcast(void *buf, size_t bytes, int root) {
    for (size_t i = 0; i < bytes; i += CHUNK) {
        const int count = (int)(bytes - i < CHUNK ? bytes - i : CHUNK);
        int rc = WATCHED("MPI_Bcast", MPI_Bcast((char *)buf + i, count, MPI_BYTE, root, MPI_COMM_WORLD));
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Bcast");
    }
    return CTRL_OK;
}

static ctrl_status mpi_barrier(void) {
    int rc = WATCHED("MPI_Barrier", MPI_Barrier(MPI_COMM_WORLD));
    return rc == MPI_SUCCESS ? CTRL_OK : mpi_fail(rc, "MPI_Barrier");
}

/* The displacements of counts' pieces (ints: a piece's offset must fit, checked by the caller). */
static int *displacements(const int *counts, int *n) {
    if (MPI_Comm_size(MPI_COMM_WORLD, n) != MPI_SUCCESS) return NULL;
    int *d = malloc(sizeof(int) * (size_t)*n);
    for (int r = 0, at = 0; d && r < *n; at += counts[r], r++) d[r] = at;
    return d;
}

static ctrl_status mpi_allgather_f32(float *buf, const int *counts) {
    int n;
    int *displs = displacements(counts, &n);
    if (!displs) return ctrl_error_set(CTRL_ERR_NOMEM, "MPI_Allgatherv: out of memory");
    int rc = WATCHED("MPI_Allgatherv", MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs,
                                                      MPI_FLOAT, MPI_COMM_WORLD));
    free(displs);
    return rc == MPI_SUCCESS ? CTRL_OK : mpi_fail(rc, "MPI_Allgatherv");
}

static ctrl_status mpi_gather_f32(float *buf, const int *counts, int root) {
    int n, rank;
    int *displs = displacements(counts, &n);
    if (!displs) return ctrl_error_set(CTRL_ERR_NOMEM, "MPI_Gatherv: out of memory");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const int rc = rank == root
                       ? WATCHED("MPI_Gatherv", MPI_Gatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts,
                                                            displs, MPI_FLOAT, root, MPI_COMM_WORLD))
                       : WATCHED("MPI_Gatherv", MPI_Gatherv(buf + displs[rank], counts[rank], MPI_FLOAT, NULL,
                                                            NULL, NULL, MPI_FLOAT, root, MPI_COMM_WORLD));
    free(displs);
    return rc == MPI_SUCCESS ? CTRL_OK : mpi_fail(rc, "MPI_Gatherv");
}

/* A started allgather: MPI reads the counts and displacements until it completes (the caller's
 * counts are scratch, so copied). */
typedef struct pending_gather {
    MPI_Request req;
    int *displs, *counts;
} pending_gather;

static ctrl_status mpi_allgather_start_f32(float *buf, const int *counts, void **handle) {
    int n;
    pending_gather *g = calloc(1, sizeof *g);
    if (!g || !(g->displs = displacements(counts, &n)) || !(g->counts = malloc(sizeof(int) * (size_t)n))) {
        if (g) free(g->displs);
        free(g);
        return ctrl_error_set(CTRL_ERR_NOMEM, "MPI_Iallgatherv: out of memory");
    }
    memcpy(g->counts, counts, sizeof(int) * (size_t)n);
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, g->counts, g->displs, MPI_FLOAT,
                             MPI_COMM_WORLD, &g->req);
    if (rc != MPI_SUCCESS) {
        free(g->displs), free(g->counts), free(g);
        return mpi_fail(rc, "MPI_Iallgatherv");
    }
    *handle = g;
    return CTRL_OK;
}

static ctrl_status mpi_allgather_wait(void *handle) {
    pending_gather *g = handle;
    ctrl_status st = wait_for(&g->req, "MPI_Allgatherv");
    free(g->displs), free(g->counts), free(g);
    return st;
}

/* In place: MPI leaves the rank's piece of the sums at the start of the buffer; moved to its own
 * place after. */
static ctrl_status mpi_reduce_scatter_sum_f32(float *buf, const int *counts) {
    int n, rank;
    int *displs = displacements(counts, &n);
    if (!displs) return ctrl_error_set(CTRL_ERR_NOMEM, "MPI_Reduce_scatter: out of memory");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int rc = WATCHED("MPI_Reduce_scatter",
                     MPI_Reduce_scatter(MPI_IN_PLACE, buf, counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    ctrl_status st = rc == MPI_SUCCESS ? CTRL_OK : mpi_fail(rc, "MPI_Reduce_scatter");
    if (st == CTRL_OK && displs[rank] > 0)
        memmove(buf + displs[rank], buf, sizeof(float) * (size_t)counts[rank]);
    free(displs);
    return st;
}

/* A started reduce-scatter: its counts copied (MPI reads them until it completes), and where this
 * rank's piece goes once it does. */
typedef struct pending_reduce {
    MPI_Request req;
    int *counts;
    float *buf;
    int at, n;
} pending_reduce;

static ctrl_status mpi_reduce_scatter_start_f32(float *buf, const int *counts, void **handle) {
    int size, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    pending_reduce *p = calloc(1, sizeof *p);
    if (!p || !(p->counts = malloc(sizeof(int) * (size_t)size))) {
        free(p);
        return ctrl_error_set(CTRL_ERR_NOMEM, "MPI_Ireduce_scatter: out of memory");
    }
    memcpy(p->counts, counts, sizeof(int) * (size_t)size);
    for (int r = 0; r < rank; r++) p->at += counts[r];
    p->buf = buf, p->n = counts[rank];
    int rc = MPI_Ireduce_scatter(MPI_IN_PLACE, buf, p->counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &p->req);
    if (rc != MPI_SUCCESS) {
        free(p->counts), free(p);
        return mpi_fail(rc, "MPI_Ireduce_scatter");
    }
    *handle = p;
    return CTRL_OK;
}

static ctrl_status mpi_reduce_scatter_wait(void *handle) {
    pending_reduce *p = handle;
    ctrl_status st = wait_for(&p->req, "MPI_Reduce_scatter");
    if (st == CTRL_OK && p->at > 0) memmove(p->buf + p->at, p->buf, sizeof(float) * (size_t)p->n);
    free(p->counts), free(p);
    return st;
}

#define P2P_TAG 19

static ctrl_status mpi_send(const void *buf, size_t bytes, int to) {
    for (size_t i = 0; i < bytes || i == 0; i += CHUNK) {
        const int count = (int)(bytes - i < CHUNK ? bytes - i : CHUNK);
        int rc = WATCHED("MPI_Send",
                         MPI_Send((const char *)buf + i, count, MPI_BYTE, to, P2P_TAG, MPI_COMM_WORLD));
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Send");
        if (bytes == 0) return CTRL_OK;
    }
    return CTRL_OK;
}

static ctrl_status mpi_recv(void *buf, size_t bytes, int from) {
    for (size_t i = 0; i < bytes || i == 0; i += CHUNK) {
        const int count = (int)(bytes - i < CHUNK ? bytes - i : CHUNK);
        int rc = WATCHED("MPI_Recv", MPI_Recv((char *)buf + i, count, MPI_BYTE, from, P2P_TAG, MPI_COMM_WORLD,
                                              MPI_STATUS_IGNORE));
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Recv");
        if (bytes == 0) return CTRL_OK;
    }
    return CTRL_OK;
}

/* The shared gradient buffer: its window (locked for passive access from the start, so that
 * MPI_Win_sync orders the loads and stores), every rank's base address. */
static MPI_Win shared_win = MPI_WIN_NULL;
static float **shared_peers;

static ctrl_status mpi_shared_alloc_f32(size_t n, float **mine, float *const **peers) {
    int size, node_size, rank;
    MPI_Comm node;
    if (shared_win != MPI_WIN_NULL)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "MPI: one shared buffer only");
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Comm_split_type");
    MPI_Comm_size(node, &node_size);
    /* every rank must take the same branch: the node sizes agree iff all ranks share one node */
    int all_here = node_size == size, agreed = 0;
    rc = WATCHED("MPI_Allreduce", MPI_Allreduce(&all_here, &agreed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (rc != MPI_SUCCESS || !agreed) {
        MPI_Comm_free(&node);
        return rc != MPI_SUCCESS
                   ? mpi_fail(rc, "MPI_Allreduce")
                   : ctrl_error_set(CTRL_ERR_UNSUPPORTED, "MPI: the ranks are on several nodes");
    }
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true"); /* each rank's pages near it */
    void *base = NULL;
    rc = WATCHED("MPI_Win_allocate_shared",
                 MPI_Win_allocate_shared((MPI_Aint)((n ? n : 1) * sizeof(float)), sizeof(float), info, node,
                                         &base, &shared_win));
    MPI_Info_free(&info);
    MPI_Comm_free(&node);
    if (rc != MPI_SUCCESS) {
        shared_win = MPI_WIN_NULL;
        return mpi_fail(rc, "MPI_Win_allocate_shared");
    }
    if (!(shared_peers = calloc((size_t)size, sizeof *shared_peers))) {
        MPI_Win_free(&shared_win);
        return ctrl_error_set(CTRL_ERR_NOMEM, "MPI: out of memory");
    }
    for (int p = 0; p < size && rc == MPI_SUCCESS; p++) {
        MPI_Aint bytes;
        int unit;
        rc = MPI_Win_shared_query(shared_win, p, &bytes, &unit, &shared_peers[p]);
    }
    if (rc == MPI_SUCCESS) rc = MPI_Win_lock_all(MPI_MODE_NOCHECK, shared_win);
    if (rc != MPI_SUCCESS) {
        free(shared_peers), shared_peers = NULL;
        MPI_Win_free(&shared_win);
        return mpi_fail(rc, "MPI_Win_shared_query");
    }
    memset(base, 0, n * sizeof(float));
    *mine = base, *peers = shared_peers;
    return CTRL_OK;
}

static ctrl_status mpi_shared_fence(void) {
    int rc = MPI_Win_sync(shared_win);
    if (rc == MPI_SUCCESS) rc = WATCHED("MPI_Barrier", MPI_Barrier(MPI_COMM_WORLD));
    if (rc == MPI_SUCCESS) rc = MPI_Win_sync(shared_win);
    return rc == MPI_SUCCESS ? CTRL_OK : mpi_fail(rc, "MPI_Barrier");
}

static void shared_free(void) {
    if (shared_win == MPI_WIN_NULL) return;
    MPI_Win_unlock_all(shared_win);
    (void)WATCHED("MPI_Win_free", MPI_Win_free(&shared_win)); /* collective */
    free(shared_peers), shared_peers = NULL;
}

static void mpi_abort_job(int exit_code) { MPI_Abort(MPI_COMM_WORLD, exit_code); }

static void mpi_finalize(void) {
#ifdef CTRL_HAVE_NCCL
    ctrl_collective_nccl_finalize(); /* before MPI goes */
#endif
    int done = 0;
    MPI_Finalized(&done);
    if (!done) shared_free();
    if (!done) (void)WATCHED("MPI_Finalize", MPI_Finalize()); /* waits for the other ranks */
    mpi_watch_stop();
}

const ctrl_collective_backend *ctrl_collective_mpi_backend(void) {
    static const ctrl_collective_backend table = {
        .size = sizeof table,
        .init = mpi_init,
        .allreduce = mpi_allreduce,
        .broadcast = mpi_broadcast,
        .barrier = mpi_barrier,
        .abort_job = mpi_abort_job,
        .finalize = mpi_finalize,
#ifdef CTRL_HAVE_NCCL
        .device_init = ctrl_collective_nccl_init,
        .device_allreduce_mean_f32 = ctrl_collective_nccl_allreduce_mean_f32,
#endif
        .set_timeout = mpi_set_timeout,
        .allgather_f32 = mpi_allgather_f32,
        .reduce_scatter_sum_f32 = mpi_reduce_scatter_sum_f32,
        .send = mpi_send,
        .recv = mpi_recv,
        .allgather_start_f32 = mpi_allgather_start_f32,
        .allgather_wait = mpi_allgather_wait,
        .reduce_scatter_start_f32 = mpi_reduce_scatter_start_f32,
        .reduce_scatter_wait = mpi_reduce_scatter_wait,
#ifdef CTRL_HAVE_NCCL
        .device_reduce_scatter_mean_f32 = ctrl_collective_nccl_reduce_scatter_mean_f32,
        .device_allgather_f32 = ctrl_collective_nccl_allgather_f32,
        .device_allgather_start_f32 = ctrl_collective_nccl_allgather_start_f32,
        .device_allgather_wait = ctrl_collective_nccl_allgather_wait,
#endif
        .gather_f32 = mpi_gather_f32,
#ifdef CTRL_HAVE_NCCL
        .device_allgather_b16 = ctrl_collective_nccl_allgather_b16,
#endif
        .shared_alloc_f32 = mpi_shared_alloc_f32,
        .shared_fence = mpi_shared_fence,
#ifdef CTRL_HAVE_NCCL
        .device_reduce_scatter_start_mean_f32 = ctrl_collective_nccl_reduce_scatter_start_mean_f32,
#endif
    };
    return &table;
}
