/* The collectives' watchdog (libctrl_mpi.so, backend_mpi.c). The MPI backend calls the blocking
 * collectives -- MPI's tuned algorithms, progressed by the waiting call itself -- and MPI has no
 * timeout of its own, so a rank whose peers stopped would wait forever. A watchdog thread ends the
 * process instead: a collective armed with mpi_watch_arm() and still not disarmed after the timeout
 * ([train] ddp_timeout) prints an error naming the call, the rank and the timeout, and calls
 * _exit(1); the launcher (mpirun, srun) then ends the other ranks. The thread only sleeps: it wakes
 * when a collective is armed and when its deadline passes. */
#ifndef CTRL_CORE_COLLECTIVE_BACKEND_MPI_WATCH_H
#define CTRL_CORE_COLLECTIVE_BACKEND_MPI_WATCH_H

/* Starts the thread (once; `rank` for the message). 0 when it could not start (the collectives
 * then have no timeout: the caller says so). */
int mpi_watch_start(int rank);
void mpi_watch_set_timeout(double seconds);
/* Around one blocking MPI call named `call` ("MPI_Allreduce"), a string that outlives the call. */
void mpi_watch_arm(const char *call);
void mpi_watch_disarm(void);
/* Stops the thread (MPI_Finalize). */
void mpi_watch_stop(void);

#endif
