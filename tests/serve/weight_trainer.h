/* The trainer's side of vLLM's NCCL weight transfer, in C, for tests/serve/test_serve_weight_
 * transfer.c: what TRL's VLLMClient does with vLLM's trainer helpers (StatelessProcessGroup.create
 * as rank 0, PyNcclCommunicator, packed_nccl_broadcast_producer), over the emulated NCCL
 * (kernels/cuda/emu/emu_nccl.c). It hosts a TCPStore master speaking torch's wire protocol (the
 * commands a worker uses: validate, ping, set, get, add, wait with cancel, check), publishes the
 * NCCL unique id there as vLLM pickles it (tests/fixtures/serve/nccl_unique_id.pickle with this
 * id's bytes in place of the fixture's), waits for the worker to add itself to "init/", then joins
 * the NCCL group as rank 0 and runs the warm-up all-reduce. */
#ifndef CTRL_TESTS_WEIGHT_TRAINER_H
#define CTRL_TESTS_WEIGHT_TRAINER_H

#include <stddef.h>

#include "nccl.h"

typedef struct wt_trainer wt_trainer;

/* The store listening on 127.0.0.1 (its port in *port) with the pickled unique id of a fresh
 * emulated NCCL id under "/broadcast_from/0/0"; NULL on failure. */
wt_trainer *wt_trainer_start(int *port);
/* Waits (at most timeout_s) for `world` - 1 workers in "init/", then ncclCommInitRank as rank 0 of
 * `world` and the warm-up all-reduce of one float; 0 on success. */
int wt_trainer_join(wt_trainer *t, int world, double timeout_s);
ncclComm_t wt_trainer_comm(wt_trainer *t);
/* Closes the communicator as a dying trainer's would (the worker's collective sees the connection
 * close), and stops the store. */
void wt_trainer_free(wt_trainer *t);

#endif
