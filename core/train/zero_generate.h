/* ZeRO-3's generation phases (zero_generate.c): what an online trainer's colocated engine reads the
 * policy's weights through while it samples a generation batch, as [generation]
 * ds3_gather_for_generation says (TRL's unwrap_model_for_generation on DeepSpeed ZeRO-3):
 *
 *   true (the default)  the whole model gathered on every rank before the phase and released after
 *                       it (train_zero_whole): the engine decodes as without ZeRO.
 *   false               nothing gathered ahead: every forward pass of the engine -- each prefill
 *                       chunk and each decoding step -- gathers each layer just before it (the next
 *                       layer's gather started ahead, prefetch_bucket_size, as the training forward
 *                       does) and releases it right after (ctrl_model_set_decode_hook), so a rank
 *                       holds its slices, the units kept whole and one or two layers; slower (every
 *                       pass moves every layer), far less memory. The gathers are collectives, so
 *                       the ranks run the same number of passes (transformers' synced_gpus): each
 *                       pass starts with an allreduce of the ranks still generating, and a rank
 *                       whose requests are done keeps taking part -- passes with no tokens, each
 *                       layer gathered and released -- until none is left. The KV cache stays each
 *                       rank's own.
 *
 * Either way the phase measures (the first passes of each phase, and its ends) the parameter bytes
 * resident per rank -- the host's pages (mincore), or a CUDA model's mapped device memory -- and the
 * process's resident memory (VmRSS), and the first phase's numbers are logged on rank 0. */
#ifndef CTRL_CORE_TRAIN_ZERO_GENERATE_H
#define CTRL_CORE_TRAIN_ZERO_GENERATE_H

#include "config/config_load.h"
#include "train/zero.h"

typedef struct train_zero_gen {
    train_zero *z;
    int layerwise;     /* ds3_gather_for_generation = false */
    int open, in_pass; /* a phase layer by layer is on; a pass is between its layers */
    long phases;       /* phases begun */
    int reported;      /* the first phase's numbers logged */
    int passive;       /* this phase found the model whole: nothing done */
    long passes, idle; /* this phase's forward passes, and of them those without tokens */
    int measure;       /* passes of this phase still measured */
    double peak;       /* the most parameter bytes resident seen in a phase (this rank) */
    double rss;        /* the most VmRSS (kB) seen then */
    long prefetched;   /* z->prefetched before the phase: the step's report counts training's */
} train_zero_gen;

/* The state for train_zero_generation (`layerwise`: ds3_gather_for_generation = false). */
void train_zero_gen_init(train_zero_gen *g, train_zero *z, int layerwise);
/* The kinds' generation phase (kind.h's whole_weights; ctx: the train_zero_gen): on = 1 before the
 * engine generates, on = 0 after it (a collective: every rank calls both, whether it had requests or
 * not). Nothing without zero3. */
ctrl_status train_zero_generation(void *ctx, int on);
/* ds3_gather_for_generation = false checked against the run: a config error naming the key without
 * zero3 (the model is whole on every rank) or with a trainer that does not generate (`generates`:
 * the online kind's colocated engine; server mode with zero3 is refused before). */
ctrl_status train_zero_gen_check(const ctrl_config *cfg, int zero_stage, int generates);

#endif
