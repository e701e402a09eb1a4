/* Collective operations between the ranks of a distributed run (data parallel, issue 19), and the
 * process's place in it: rank, number of ranks, rank on this node.
 *
 * The state is the process's own (one job per process, as MPI's): ctrl_collective_init() reads
 * the launcher's environment -- mpirun's OMPI_COMM_WORLD_*, a PMI launcher's PMI_* (MPICH,
 * Hydra), Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) -- and, only when that says
 * more than one rank, loads libctrl_mpi.so (dlopen, RTLD_GLOBAL: OpenMPI's own components resolve
 * against it) and calls MPI_Init there; MPI's answer is then the truth (the launcher's is checked
 * against it). A process not started by a launcher is rank 0 of 1 and never maps MPI: `ctrl`
 * runs exactly as a single process, and builds without MPI (CTRL_HAVE_MPI off) refuse a launched
 * run of several ranks with a message instead.
 *
 * Every operation below is a no-op returning CTRL_OK on a single rank, so the training loop calls
 * them unconditionally. Buffers are host memory (the loop averages the host master copy of the
 * gradients, where the optimizer steps them). On CUDA runs the backend also creates an NCCL
 * communicator (its unique id broadcast over MPI) for device buffers:
 * ctrl_collective_device_allreduce_mean. A collective that fails ends the job (MPI_Abort): a rank
 * left waiting would hang. */
#ifndef CTRL_CORE_COLLECTIVE_H
#define CTRL_CORE_COLLECTIVE_H

#include <stddef.h>

#include <ctrl/status.h>

typedef struct ctrl_collective_info {
    int rank, size;             /* in the whole job */
    int local_rank, local_size; /* on this node (the GPU a rank takes is its local rank) */
    const char *launcher;       /* "none", "mpirun", "pmi", "srun": whose environment said so */
    const char *backend;        /* "none" (one rank) or "mpi" */
} ctrl_collective_info;

/* The launcher's word on rank and size alone (no MPI yet), for what comes before
 * ctrl_collective_init (reading the config): the rank prefix on log lines. */
void ctrl_collective_detect(void);
/* Where the ranks leave a mark before MPI_Init (the run's output directory, existing), so that a
 * rank that never arrives can be named when the start times out (start_watch.h). */
void ctrl_collective_set_start_dir(const char *dir);
/* Detects the launcher and, for several ranks, starts MPI. Idempotent. An error (several ranks
 * but no MPI backend, or MPI disagreeing with the launcher) names what was found. MPI_Init itself
 * is watched: past the timeout (ctrl_collective_set_timeout, before) without every rank, the
 * process ends with a message naming the ranks that never arrived (exit 1). */
ctrl_status ctrl_collective_init(void);
/* Ends MPI. `failed`: this rank stops on an error, which the others may not share (they could
 * be waiting in a collective): the job is aborted with `exit_code` instead of finalized. */
void ctrl_collective_finalize(int failed, int exit_code);

const ctrl_collective_info *ctrl_collective_info_get(void);
int ctrl_collective_rank(void);
int ctrl_collective_size(void);
int ctrl_collective_local_rank(void);
static inline int ctrl_collective_is_root(void) { return ctrl_collective_rank() == 0; }

/* In place over all ranks. */
ctrl_status ctrl_collective_allreduce_sum_f64(double *buf, size_t n);
ctrl_status ctrl_collective_allreduce_max_f64(double *buf, size_t n);
/* Gradients: summed over the ranks, then divided by their number. */
ctrl_status ctrl_collective_allreduce_mean_f32(float *buf, size_t n);
/* Plain data parallel's gradient buffer in memory every rank of the job maps (all on one node):
 * n zeroed floats, this rank's (the backend's until the job ends: never freed by the caller).
 * CTRL_ERR_UNSUPPORTED on one rank, with ranks on several nodes, or with a backend without it;
 * collective (every rank calls it, with the same n). */
ctrl_status ctrl_collective_shared_f32(size_t n, float **buf);
/* allreduce_mean_f32 of that buffer (buf and n as it was made), without copies through MPI: rank r
 * sums slice r of every rank's buffer in rank order into its own (the mean: the product by the
 * exact reciprocal where the number of ranks is a power of two, else the quotient, as
 * allreduce_mean_f32), then every rank copies the other slices from their owners; barriers
 * between the phases (under the watchdog). The same sums on every rank, bit-equal to MPI's
 * allreduce with two ranks. */
ctrl_status ctrl_collective_allreduce_mean_shared_f32(float *buf, size_t n);
/* `bytes` of `buf` from `root` to every rank. */
ctrl_status ctrl_collective_broadcast(void *buf, size_t bytes, int root);
ctrl_status ctrl_collective_barrier(void);
/* A host collective that has waited this long for the other ranks ends the process (a watchdog
 * thread prints an error naming the call, the rank and the timeout, and exits with 1; the launcher
 * then ends the job); MPI_Init too when set before ctrl_collective_init. [train] ddp_timeout; 1800 s
 * until set. */
void ctrl_collective_set_timeout(double seconds);

/* ZeRO's collectives (host buffers, core/train/zero.c): a float buffer cut in consecutive pieces,
 * rank r's counts[r] floats long (counts has one entry per rank). allgather: every rank's buf ends
 * up holding every piece (its own is its input, in place); reduce_scatter_mean: buf (every piece) summed over
 * the ranks and divided by their number, this rank's piece of that left at its own place in buf
 * (the other pieces undefined). On one rank both are no-ops. */
ctrl_status ctrl_collective_allgather_f32(float *buf, const int *counts);
ctrl_status ctrl_collective_reduce_scatter_mean_f32(float *buf, const int *counts);
/* The allgather started, to be completed by ctrl_collective_allgather_wait(*handle) before buf is
 * read (ZeRO-3's prefetch; other collectives may run between, in the same order on every rank);
 * *handle NULL when done already (one rank). */
ctrl_status ctrl_collective_allgather_start_f32(float *buf, const int *counts, void **handle);
ctrl_status ctrl_collective_allgather_wait(void *handle);
/* reduce_scatter_mean started (overlap_comm), and completed -- the sum divided by the ranks -- by
 * ctrl_collective_reduce_scatter_wait_mean(handle, buf, counts) with the same buf and counts. */
ctrl_status ctrl_collective_reduce_scatter_start_f32(float *buf, const int *counts, void **handle);
ctrl_status ctrl_collective_reduce_scatter_wait_mean(void *handle, float *buf, const int *counts);
/* allgather to `root` only (ZeRO-3's save): root's buf gets every piece, each other rank sends its
 * own piece from its place in buf (buf unchanged there). A no-op on one rank. */
ctrl_status ctrl_collective_gather_f32(float *buf, const int *counts, int root);
/* `bytes` from this rank to rank `to`, received there by the matching recv (in order). */
ctrl_status ctrl_collective_send(const void *buf, size_t bytes, int to);
ctrl_status ctrl_collective_recv(void *buf, size_t bytes, int from);

/* CUDA runs: an NCCL communicator over the same ranks, on the current device (set the device
 * first). CTRL_ERR_UNSUPPORTED when libctrl_mpi.so was built without NCCL. Then the mean of a
 * float buffer in device memory, on the default stream (synchronised before returning). */
ctrl_status ctrl_collective_device_init(void);
ctrl_status ctrl_collective_device_allreduce_mean_f32(float *device_buf, size_t n);
/* ZeRO on a CUDA model (after ctrl_collective_device_init): ctrl_collective_reduce_scatter_mean_f32
 * and ctrl_collective_allgather_f32 on a device buffer, over NCCL. No-ops on one rank. */
ctrl_status ctrl_collective_device_reduce_scatter_mean_f32(float *device_buf, const int *counts);
ctrl_status ctrl_collective_device_allgather_f32(float *device_buf, const int *counts);
/* ZeRO-3's prefetch: ctrl_collective_device_allgather_f32 started on a side stream, and the compute
 * stream's next work made to wait for it (ctrl_collective_device_allgather_wait; *handle NULL: done
 * at once). */
ctrl_status ctrl_collective_device_allgather_start_f32(float *device_buf, const int *counts, void **handle);
ctrl_status ctrl_collective_device_allgather_wait(void *handle);
/* ZeRO-3 in bf16 on a CUDA model: ctrl_collective_device_allgather_f32 (handle NULL) or _start_f32
 * (handle given; completed by ctrl_collective_device_allgather_wait) over counts[r] 2-byte values a
 * rank, copied as they are. No-op on one rank. */
ctrl_status ctrl_collective_device_allgather_b16(void *device_buf, const int *counts, void **handle);
/* overlap_comm on a CUDA model: ctrl_collective_device_reduce_scatter_mean_f32 queued on the
 * communication stream after the compute stream's work so far, the host and the compute stream going
 * on at once; ctrl_collective_device_reduce_scatter_wait(handle) makes the compute stream's next work
 * wait for it (the host does not wait: synchronize the device before the host reads the buffer or
 * unmaps it). *handle NULL: nothing to do (one rank); an older libctrl_mpi.so without it: an error. */
ctrl_status ctrl_collective_device_reduce_scatter_start_mean_f32(float *device_buf, const int *counts,
                                                                 void **handle);
ctrl_status ctrl_collective_device_reduce_scatter_wait(void *handle);

#endif
