/* The table libctrl_mpi.so exports (backend_mpi.c; backend_nccl.c for device buffers when built
 * with NCCL), which collective.c loads with dlopen for a run of several ranks. Functions return
 * ctrl_status with the error set (libctrl_mpi.so links libctrl). The table only grows at the end;
 * `size` says how far a loaded one reaches. */
#ifndef CTRL_CORE_COLLECTIVE_BACKEND_H
#define CTRL_CORE_COLLECTIVE_BACKEND_H

#include <stddef.h>

#include <ctrl/status.h>

typedef enum { CTRL_COLL_F32, CTRL_COLL_F64 } ctrl_coll_dtype;
typedef enum { CTRL_COLL_SUM, CTRL_COLL_MAX } ctrl_coll_op;

typedef struct ctrl_collective_backend {
    size_t size;
    /* MPI_Init_thread (funneled: only the loop's thread communicates); the job's rank and size and
     * the node's (MPI_COMM_TYPE_SHARED). */
    ctrl_status (*init)(int *rank, int *size, int *local_rank, int *local_size);
    ctrl_status (*allreduce)(void *buf, size_t n, ctrl_coll_dtype dtype, ctrl_coll_op op);
    ctrl_status (*broadcast)(void *buf, size_t bytes, int root);
    ctrl_status (*barrier)(void);
    void (*abort_job)(int exit_code);
    void (*finalize)(void);
    /* NULL when built without NCCL. */
    ctrl_status (*device_init)(void);
    ctrl_status (*device_allreduce_mean_f32)(float *device_buf, size_t n);
    /* How long a host collective may wait for the other ranks (seconds; the default 1800) before
     * the backend's watchdog ends the process. */
    void (*set_timeout)(double seconds);
    /* ZeRO (core/train/zero.c): float buffers split in consecutive pieces, rank r's of counts[r]
     * elements at the sum of the counts before it. allgather fills every rank's buf with every
     * piece (in place: each rank's own piece is its input); reduce_scatter sums `buf` (every
     * piece) over the ranks and leaves this rank's piece of the sums at its own place in `buf` (the
     * other pieces are left undefined). */
    ctrl_status (*allgather_f32)(float *buf, const int *counts);
    ctrl_status (*reduce_scatter_sum_f32)(float *buf, const int *counts);
    /* Point to point (a sharded checkpoint's pieces go to rank 0). */
    ctrl_status (*send)(const void *buf, size_t bytes, int to);
    ctrl_status (*recv)(void *buf, size_t bytes, int from);
    /* ZeRO-3's prefetch: allgather_f32 started (*handle: the request, owned by the backend until
     * allgather_wait completes it, timeout as ever). */
    ctrl_status (*allgather_start_f32)(float *buf, const int *counts, void **handle);
    ctrl_status (*allgather_wait)(void *handle);
    /* overlap_comm: reduce_scatter_sum_f32 started, completed (this rank's piece moved to its
     * place) by reduce_scatter_wait. */
    ctrl_status (*reduce_scatter_start_f32)(float *buf, const int *counts, void **handle);
    ctrl_status (*reduce_scatter_wait)(void *handle);
    /* ZeRO on a CUDA model (NULL without NCCL): reduce_scatter's and allgather_f32's meaning on a
     * device buffer, the reduction the mean over the ranks (ncclAvg); done when they return. */
    ctrl_status (*device_reduce_scatter_mean_f32)(float *device_buf, const int *counts);
    ctrl_status (*device_allgather_f32)(float *device_buf, const int *counts);
    /* allgather_f32 to `root` alone (ZeRO-3's save): root's buf gets every piece (its own in
     * place), the others send theirs from its place in their buf and keep buf as it was. */
    ctrl_status (*gather_f32)(float *buf, const int *counts, int root);
    /* ZeRO-3's prefetch on a CUDA model: device_allgather_f32 queued on a side stream (*handle: an
     * event after it), and the compute stream made to wait for it (the host does not wait). */
    ctrl_status (*device_allgather_start_f32)(float *device_buf, const int *counts, void **handle);
    ctrl_status (*device_allgather_wait)(void *handle);
    /* Appended for ZeRO-3 in bf16 on a CUDA model: device_allgather_f32 (handle NULL: done when it
     * returns) or device_allgather_start_f32 (handle given) over pieces of 2-byte values. */
    ctrl_status (*device_allgather_b16)(void *device_buf, const int *counts, void **handle);
    /* Plain data parallel's gradients in memory every rank maps (all ranks on one node; MPI-3's
     * MPI_Win_allocate_shared): n floats per rank, zeroed; *mine is this rank's, peers[p] rank p's
     * (the backend owns both until finalize). One such buffer per process: a second call, or ranks
     * on several nodes, is CTRL_ERR_UNSUPPORTED (the caller keeps allreduce). shared_fence: every
     * rank's writes to the buffers made visible to the others, then a barrier (under the watchdog). */
    ctrl_status (*shared_alloc_f32)(size_t n, float **mine, float *const **peers);
    ctrl_status (*shared_fence)(void);
    /* overlap_comm on a CUDA model (NULL without NCCL): device_reduce_scatter_mean_f32 queued on the
     * communication stream after the compute stream's work so far (*handle: an event after it), the
     * compute stream made to wait for it by device_allgather_wait (the host does not wait). */
    ctrl_status (*device_reduce_scatter_start_mean_f32)(float *device_buf, const int *counts, void **handle);
} ctrl_collective_backend;

const ctrl_collective_backend *ctrl_collective_mpi_backend(void);

#endif
