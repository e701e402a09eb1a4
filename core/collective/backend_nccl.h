/* The NCCL side of libctrl_mpi.so (backend_nccl.c, built when CUDA and NCCL are found): the device
 * entries of the backend table (collective_backend.h), which backend_mpi.c fills with these. Each has
 * the meaning of the table's entry of the same name; the communicator spans the MPI job's ranks. */
#ifndef CTRL_CORE_COLLECTIVE_BACKEND_NCCL_H
#define CTRL_CORE_COLLECTIVE_BACKEND_NCCL_H

#include <stddef.h>

#include <ctrl/status.h>

/* The communicator (after MPI_Init, on the device this rank selected); device_init. */
ctrl_status ctrl_collective_nccl_init(void);
/* device_allreduce_mean_f32, device_reduce_scatter_mean_f32, device_allgather_f32. */
ctrl_status ctrl_collective_nccl_allreduce_mean_f32(float *device_buf, size_t n);
ctrl_status ctrl_collective_nccl_reduce_scatter_mean_f32(float *device_buf, const int *counts);
ctrl_status ctrl_collective_nccl_allgather_f32(float *device_buf, const int *counts);
/* device_allgather_start_f32, device_allgather_wait, device_allgather_b16 (ZeRO-3's prefetch). */
ctrl_status ctrl_collective_nccl_allgather_start_f32(float *device_buf, const int *counts, void **handle);
ctrl_status ctrl_collective_nccl_allgather_wait(void *handle);
ctrl_status ctrl_collective_nccl_allgather_b16(void *device_buf, const int *counts, void **handle);
/* device_reduce_scatter_start_mean_f32 (overlap_comm), completed by ctrl_collective_nccl_allgather_wait. */
ctrl_status ctrl_collective_nccl_reduce_scatter_start_mean_f32(float *device_buf, const int *counts,
                                                               void **handle);
/* Destroys the communicator (the backend's finalize, before MPI_Finalize); nothing when none. */
void ctrl_collective_nccl_finalize(void);

#endif
