/* The NCCL side of libctrl_mpi.so (built when CUDA and NCCL are found): one communicator over the
 * MPI job's ranks, on the device each rank selected, its unique id made by rank 0 and broadcast
 * over MPI; the mean of a device buffer with ncclAvg; ZeRO's reduce-scatter and all-gather of pieces
 * of any lengths (collective_backend.h) as one group of ncclReduce / ncclBroadcast calls, one a rank's
 * piece (ncclReduceScatter and ncclAllGather need equal pieces), on the compute stream (done when
 * they return) or queued on a communication stream (ZeRO-3's prefetch, overlap_comm). */
#include <stdint.h>

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include "collective/backend_nccl.h"
#include "collective/collective_backend.h"

static ncclComm_t comm;
static int comm_size;

void ctrl_collective_nccl_finalize(void) {
    if (comm) ncclCommDestroy(comm);
    comm = NULL;
}

ctrl_status ctrl_collective_nccl_init(void) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ncclUniqueId id;
    ncclResult_t r = rank == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
    if (r != ncclSuccess)
        return ctrl_error_set(CTRL_ERR_DEVICE, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    int rc = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return ctrl_error_set(CTRL_ERR_DEVICE, "MPI_Bcast of the NCCL unique id failed");
    comm_size = size;
    if ((r = ncclCommInitRank(&comm, size, id, rank)) != ncclSuccess)
        return ctrl_error_set(CTRL_ERR_DEVICE, "ncclCommInitRank (rank %d of %d): %s", rank, size,
                              ncclGetErrorString(r));
    return CTRL_OK;
}

ctrl_status ctrl_collective_nccl_allreduce_mean_f32(float *device_buf, size_t n) {
    cudaError_t e = cudaDeviceSynchronize(); /* the backward's kernels, on whatever stream, are done */
    if (e != cudaSuccess)
        return ctrl_error_set(CTRL_ERR_DEVICE, "before ncclAllReduce: %s", cudaGetErrorString(e));
    ncclResult_t r = ncclAllReduce(device_buf, device_buf, n, ncclFloat32, ncclAvg, comm, 0);
    if (r != ncclSuccess) return ctrl_error_set(CTRL_ERR_DEVICE, "ncclAllReduce: %s", ncclGetErrorString(r));
    e = cudaStreamSynchronize(0);
    if (e != cudaSuccess) return ctrl_error_set(CTRL_ERR_DEVICE, "ncclAllReduce: %s", cudaGetErrorString(e));
    return CTRL_OK;
}

/* `what` enqueued by `r` (a group's end), then the stream drained. */
static ctrl_status nccl_done(const char *what, ncclResult_t r) {
    if (r != ncclSuccess) return ctrl_error_set(CTRL_ERR_DEVICE, "%s: %s", what, ncclGetErrorString(r));
    cudaError_t e = cudaStreamSynchronize(0);
    if (e != cudaSuccess) return ctrl_error_set(CTRL_ERR_DEVICE, "%s: %s", what, cudaGetErrorString(e));
    return CTRL_OK;
}

/* Every rank's piece of device_buf (counts[k] elements of `dt` each, in rank order) broadcast from
 * its owner, as one group on `stream`. */
static ncclResult_t broadcast_pieces(void *device_buf, const int *counts, ncclDataType_t dt, size_t elem,
                                     cudaStream_t stream) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    char *at = device_buf;
    for (int k = 0; k < comm_size && r == ncclSuccess; at += (size_t)counts[k] * elem, k++)
        r = ncclBroadcast(at, at, (size_t)counts[k], dt, k, comm, stream);
    const ncclResult_t end = ncclGroupEnd(); /* closed even after a failed call */
    return r != ncclSuccess ? r : end;
}

/* Every rank's piece of device_buf (counts[k] floats each, in rank order) averaged over the ranks
 * into its owner's piece (ncclAvg, in place), as one group on `stream`. */
static ncclResult_t reduce_pieces(float *device_buf, const int *counts, cudaStream_t stream) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    size_t at = 0;
    for (int k = 0; k < comm_size && r == ncclSuccess; at += (size_t)counts[k], k++)
        r = ncclReduce(device_buf + at, device_buf + at, (size_t)counts[k], ncclFloat32, ncclAvg, k, comm,
                       stream);
    const ncclResult_t end = ncclGroupEnd(); /* closed even after a failed call */
    return r != ncclSuccess ? r : end;
}

static ctrl_status nccl_pieces(float *device_buf, const int *counts, int reduce) {
    const char *what = reduce ? "ncclReduce (ZeRO's reduce-scatter)" : "ncclBroadcast (ZeRO's all-gather)";
    cudaError_t e = cudaDeviceSynchronize(); /* what wrote the buffer, on whatever stream, is done */
    if (e != cudaSuccess)
        return ctrl_error_set(CTRL_ERR_DEVICE, "before %s: %s", what, cudaGetErrorString(e));
    if (!reduce) return nccl_done(what, broadcast_pieces(device_buf, counts, ncclFloat32, sizeof(float), 0));
    return nccl_done(what, reduce_pieces(device_buf, counts, 0));
}

ctrl_status ctrl_collective_nccl_reduce_scatter_mean_f32(float *device_buf, const int *counts) {
    return nccl_pieces(device_buf, counts, 1);
}

ctrl_status ctrl_collective_nccl_allgather_f32(float *device_buf, const int *counts) {
    return nccl_pieces(device_buf, counts, 0);
}

/* The communication stream: ZeRO-3's prefetch gathers and overlap_comm's reduce-scatters are queued
 * there (after what the compute stream queued so far), an event recorded after each; the wait makes
 * the compute stream wait for that event (the host does not wait). Events are reused round robin:
 * a handle whose event was recorded again since names a later point of the same stream, so waiting
 * for it waits for at least what it stood for. */
#define SIDE_EVENTS 64
static cudaStream_t side;
static cudaEvent_t side_ready, side_done[SIDE_EVENTS];
static int side_next;

/* The side stream and its events (made at the first prefetch), the side stream made to wait for
 * what the compute stream queued so far. */
static ctrl_status side_ready_now(void) {
    cudaError_t e = cudaSuccess;
    if (!side) {
        e = cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&side_ready, cudaEventDisableTiming);
        for (int i = 0; i < SIDE_EVENTS && e == cudaSuccess; i++)
            e = cudaEventCreateWithFlags(&side_done[i], cudaEventDisableTiming);
    }
    if (e == cudaSuccess) e = cudaEventRecord(side_ready, 0);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(side, side_ready, 0);
    if (e != cudaSuccess)
        return ctrl_error_set(CTRL_ERR_DEVICE, "ZeRO's communication stream: %s", cudaGetErrorString(e));
    return CTRL_OK;
}

/* r (a group queued on the side stream by `what`), then an event recorded after it: *handle. */
static ctrl_status side_done_now(const char *what, ncclResult_t r, void **handle) {
    if (r != ncclSuccess) return ctrl_error_set(CTRL_ERR_DEVICE, "%s: %s", what, ncclGetErrorString(r));
    const int k = side_next++ % SIDE_EVENTS;
    const cudaError_t e = cudaEventRecord(side_done[k], side);
    if (e != cudaSuccess) return ctrl_error_set(CTRL_ERR_DEVICE, "%s: %s", what, cudaGetErrorString(e));
    *handle = (void *)(intptr_t)(k + 1);
    return CTRL_OK;
}

/* The pieces broadcast on the side stream, an event recorded after them: *handle. */
static ctrl_status side_gather(void *device_buf, const int *counts, ncclDataType_t dt, size_t elem,
                               void **handle) {
    *handle = NULL;
    ctrl_status st = side_ready_now();
    if (st != CTRL_OK) return st;
    return side_done_now("ncclBroadcast (ZeRO-3's prefetch)",
                         broadcast_pieces(device_buf, counts, dt, elem, side), handle);
}

/* overlap_comm: the reduce-scatter queued on the side stream after the kernels that wrote the pieces
 * (the compute stream's work so far), an event after it; the compute stream goes on at once. */
ctrl_status ctrl_collective_nccl_reduce_scatter_start_mean_f32(float *device_buf, const int *counts,
                                                               void **handle) {
    *handle = NULL;
    ctrl_status st = side_ready_now();
    if (st != CTRL_OK) return st;
    return side_done_now("ncclReduce (overlap_comm's reduce-scatter)",
                         reduce_pieces(device_buf, counts, side), handle);
}

ctrl_status ctrl_collective_nccl_allgather_start_f32(float *device_buf, const int *counts, void **handle) {
    return side_gather(device_buf, counts, ncclFloat32, sizeof(float), handle);
}

/* ZeRO-3 in bf16: pieces of 2-byte values (ncclBfloat16, copied as they are), on the side stream when
 * `handle` is given (completed by ctrl_collective_nccl_allgather_wait), else on the compute stream and
 * done when it returns. */
ctrl_status ctrl_collective_nccl_allgather_b16(void *device_buf, const int *counts, void **handle) {
    if (handle) return side_gather(device_buf, counts, ncclBfloat16, 2, handle);
    const char *what = "ncclBroadcast (ZeRO-3's bf16 all-gather)";
    cudaError_t e = cudaDeviceSynchronize(); /* what wrote the buffer, on whatever stream, is done */
    if (e != cudaSuccess)
        return ctrl_error_set(CTRL_ERR_DEVICE, "before %s: %s", what, cudaGetErrorString(e));
    return nccl_done(what, broadcast_pieces(device_buf, counts, ncclBfloat16, 2, 0));
}

ctrl_status ctrl_collective_nccl_allgather_wait(void *handle) {
    const int k = (int)(intptr_t)handle - 1;
    if (k < 0 || k >= SIDE_EVENTS) return CTRL_OK;
    cudaError_t e = cudaStreamWaitEvent(0, side_done[k], 0);
    if (e != cudaSuccess)
        return ctrl_error_set(CTRL_ERR_DEVICE, "waiting for ZeRO's communication stream: %s",
                              cudaGetErrorString(e));
    return CTRL_OK;
}
