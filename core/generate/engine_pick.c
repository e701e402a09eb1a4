/* Which sequences one engine step runs (engine_schedule.c calls it): the running ones decode a
 * token each, then waiting ones prefill a chunk each (at most the prefill chunk, within the step's
 * token budget). When more sequences want a slot than the step has (max_num_seqs), every group of
 * requests (ctrl_gen_request.group: one caller's, e.g. one HTTP request) first gets an equal share
 * of the slots, in arrival order within it, and only then do the rest go in arrival order — so a
 * small request that arrives behind one of thousands of sequences is decoded from the next step on
 * instead of after all of them. With one group (ctrl generate, the trainers) this is plain arrival
 * order. */
#include <stdlib.h>

#include "generate/engine_internal.h"

typedef struct pick {
    ctrl_engine *e;
    int nb, budget, chunk;
    long mark; /* this step's: a sequence already picked carries it */
} pick;

static int wants_slot(const gen_seq *s) { return s->state == RUNNING || s->state == WAITING; }

/* Picks s if the step has room for it; whether it did. */
static int take(pick *p, gen_seq *s) {
    ctrl_engine *e = p->e;
    if (s->mark == p->mark || p->nb >= e->scratch || p->budget <= 0) return 0;
    int n = 1;
    if (s->state == WAITING) {
        n = s->n_tokens - s->kv.len;
        if (n > p->chunk) n = p->chunk;
        if (n > p->budget) n = p->budget;
    }
    s->mark = p->mark;
    e->batch[p->nb] = s, e->n_new[p->nb++] = n, p->budget -= n;
    return 1;
}

/* Every group's share: up to `share` of its sequences in `state`, counting those it already got
 * (used[g], groups numbered by runs of equal group in arrival order). */
static void fair_pass(pick *p, int state, int share, int *used) {
    ctrl_engine *e = p->e;
    int g = -1;
    const gen_seq *prev = NULL; /* the last one that wants a slot */
    for (int i = 0; i < e->n; i++) {
        gen_seq *s = &e->seqs[i];
        if (!wants_slot(s)) continue;
        g += !prev || s->rq->r.group != prev->rq->r.group;
        prev = s;
        if (s->state == state && used[g] < share) used[g] += take(p, s);
    }
}

int engine_pick(ctrl_engine *e) {
    pick p = {.e = e, .budget = e->cfg.max_num_batched_tokens, .mark = e->steps + 1};
    p.chunk = e->prefill_chunk > 0 ? e->prefill_chunk : p.budget;
    int want = 0, groups = 0;
    const gen_seq *prev = NULL;
    for (int i = 0; i < e->n; i++) {
        if (!wants_slot(&e->seqs[i])) continue;
        want++;
        groups += !prev || e->seqs[i].rq->r.group != prev->rq->r.group;
        prev = &e->seqs[i];
    }
    int *used = want > e->scratch && groups > 1 ? calloc((size_t)groups, sizeof *used) : NULL;
    if (used) { /* not enough slots for everyone: each group's share first */
        const int share = e->scratch / groups > 0 ? e->scratch / groups : 1;
        fair_pass(&p, RUNNING, share, used);
        fair_pass(&p, WAITING, share, used);
        free(used);
    }
    for (int i = 0; i < e->n; i++)
        if (e->seqs[i].state == RUNNING) take(&p, &e->seqs[i]);
    for (int i = 0; i < e->n; i++)
        if (e->seqs[i].state == WAITING) take(&p, &e->seqs[i]);
    return p.nb;
}
