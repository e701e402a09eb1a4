/* offload_optimizer's host step overlapped with the next step's compute (offload_overlap.c). */
#ifndef CTRL_CORE_TRAIN_OFFLOAD_OVERLAP_H
#define CTRL_CORE_TRAIN_OFFLOAD_OVERLAP_H

#include <ctrl/optimizer.h>

#include "model/model.h"

typedef struct train_offload train_offload;
struct train_zero;

/* The overlap for a model stepped on the host with `groups` (the host's parameters and gradients,
 * train_param_groups' order); *out NULL (and CTRL_OK) where it does not apply, with the reason in
 * *why: the backend has no upload stream, the optimizer no step_groups, a LoRA model, zero3's
 * persistent tensors. Installs the model's layer hooks (ctrl_model_set_sharding) -- but with `z`
 * (zero3 with offload_optimizer on a device: groups are this rank's slices, train_zero_shard_groups),
 * whose units it steps and whose own hooks call train_offload_need. */
ctrl_status train_offload_create(train_offload **out, const char **why, ctrl_model *m,
                                 const ctrl_optimizer_ops *oo, ctrl_optimizer *opt,
                                 const ctrl_param_group *groups, int n_groups, struct train_zero *z);
/* ZeRO-3's hooks: unit u (u < 0: every unit) stepped on the host and ready on the device (its upload
 * waited for by the compute stream, what follows it done) before its gather; a no-op outside a
 * step's round. train_offload_active: a round is in flight (not every unit needed yet). */
ctrl_status train_offload_need(train_offload *o, int u);
int train_offload_active(const train_offload *o);
/* After the gradients are on the host (clipped): starts the host step of every unit (the parameters
 * before the layers, each layer, the head) in forward order on a host thread, waits for the first
 * unit only and has the compute stream wait for its upload; each layer's forward then waits for its
 * own (the layer hooks), the final norm and head for theirs. */
ctrl_status train_offload_launch(train_offload *o, double lr, int64_t step);
/* Whatever is in flight finished: the host step joined, every upload waited for by the compute
 * stream and the host. Before anything reads the host's parameters or optimizer state, or runs the
 * model other than through its layer hooks (a save, an evaluation, the end). */
ctrl_status train_offload_drain(train_offload *o);
/* What the overlap did, for the log: steps, units per step, the per-unit waits of the forwards, how
 * many units the host stepped after the next forward had begun. */
void train_offload_report(const train_offload *o);
/* The same counts: steps launched, per-unit waits of the compute stream, unit steps (after the
 * first unit) the host began once the next forward had begun. */
void train_offload_counts(const train_offload *o, long *steps, long *waits, long *late);
/* 1: the host's parameters and gradients are page-locked (the backend's host_register). */
int train_offload_pinned(const train_offload *o);
void train_offload_destroy(train_offload *o);

#endif
