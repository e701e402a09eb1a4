/* The NCCL side of libctrl_mpi.so (built when CUDA and NCCL are found): one communicator over the
 * MPI job's ranks, on the device each rank selected, its unique id made by rank 0 and broadcast
 * over MPI; the mean of a device buffer with ncclAvg. */
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include "collective/collective_backend.h"

static ncclComm_t comm;

ctrl_status ctrl_collective_nccl_init(void);
ctrl_status ctrl_collective_nccl_allreduce_mean_f32(float *device_buf, size_t n);
void ctrl_collective_nccl_finalize(void);

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
