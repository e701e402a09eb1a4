/* The start of a job of several ranks (collective.c): MPI_Init waits until every rank has called it
 * and has no timeout of its own, so a rank that never starts, or stops while starting, would hang
 * the others there. A watchdog thread ends the process instead once the start took longer than
 * the timeout, naming the ranks that never arrived when it can tell: each rank first leaves a mark
 * (an empty file named after its rank) in a directory of the job's output directory named after
 * the launcher's job id (PMIX_NAMESPACE, SLURM_JOB_ID.SLURM_STEP_ID), and the ranks whose mark is
 * missing are the ones that never got there; without a shared output directory or a job id the
 * message says that a rank did not arrive, not which. */
#ifndef CTRL_CORE_COLLECTIVE_START_WATCH_H
#define CTRL_CORE_COLLECTIVE_START_WATCH_H

#include "collective/collective.h"

/* Leaves the mark (dir NULL: none) and starts the watchdog: `seconds` from now without
 * start_watch_done(), it prints the error and calls _exit(1) (the launcher ends the others). */
void start_watch_begin(const ctrl_collective_info *env, const char *dir, double seconds);
/* MPI_Init returned (ok or not): the watchdog stops. `last`: every rank has passed its barrier, so
 * the marks can go (rank 0 removes them). */
void start_watch_done(int remove_marks);

#endif
