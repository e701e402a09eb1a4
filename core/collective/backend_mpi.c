/* The MPI backend of the collectives (libctrl_mpi.so; see collective_backend.h). Errors return
 * (MPI_ERRORS_RETURN) as ctrl errors naming the call; the caller ends the job on them. Counts are
 * int in MPI: long buffers go in chunks. */
#include <limits.h>
#include <mpi.h>

#include "collective/collective_backend.h"

#define CHUNK (1 << 28) /* elements per call, below INT_MAX for any element size */

static ctrl_status mpi_fail(int rc, const char *call) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
    msg[len] = '\0';
    return ctrl_error_set(CTRL_ERR_DEVICE, "%s: %s", call, len ? msg : "failed");
}

static ctrl_status mpi_init(int *rank, int *size, int *local_rank, int *local_size) {
    int inited = 0, provided = 0, rc = MPI_Initialized(&inited);
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
    return CTRL_OK;
}

static ctrl_status mpi_allreduce(void *buf, size_t n, ctrl_coll_dtype dtype, ctrl_coll_op op) {
    const MPI_Datatype t = dtype == CTRL_COLL_F32 ? MPI_FLOAT : MPI_DOUBLE;
    const size_t elem = dtype == CTRL_COLL_F32 ? sizeof(float) : sizeof(double);
    for (size_t i = 0; i < n; i += CHUNK) {
        const int count = (int)(n - i < CHUNK ? n - i : CHUNK);
        int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + i * elem, count, t,
                               op == CTRL_COLL_SUM ? MPI_SUM : MPI_MAX, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Allreduce");
    }
    return CTRL_OK;
}

static ctrl_status mpi_broadcast(void *buf, size_t bytes, int root) {
    for (size_t i = 0; i < bytes; i += CHUNK) {
        const int count = (int)(bytes - i < CHUNK ? bytes - i : CHUNK);
        int rc = MPI_Bcast((char *)buf + i, count, MPI_BYTE, root, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Bcast");
    }
    return CTRL_OK;
}

static ctrl_status mpi_barrier(void) {
    int rc = MPI_Barrier(MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? CTRL_OK : mpi_fail(rc, "MPI_Barrier");
}

static void mpi_abort_job(int exit_code) { MPI_Abort(MPI_COMM_WORLD, exit_code); }

static void mpi_finalize(void) {
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
}

#ifdef CTRL_HAVE_NCCL
ctrl_status ctrl_collective_nccl_init(void);
ctrl_status ctrl_collective_nccl_allreduce_mean_f32(float *device_buf, size_t n);
#endif

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
    };
    return &table;
}
