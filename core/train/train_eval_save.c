/* What a training run writes as it goes: the logging window (metrics.jsonl), evaluations,
 * checkpoints (rank 0 writes, ZeRO slices sent to it), and the checkpoint of an interrupted run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train_run.h"

ctrl_status train_run_log_window(run_state *r, ctrl_train_state *ts, long total, double lr, double rate) {
    const double n = ts->win;
    train_health_window(&r->health, ts->step, ts->win, ts->win_norm / n, ts->win_loss / n, lr);
    const train_window w = {.step = ts->step,
                            .total = total,
                            .loss = ts->win_loss / n,
                            .grad_norm = ts->win_norm / n,
                            .learning_rate = lr,
                            .entropy = ts->win_ent / n,
                            .accuracy = ts->win_acc / n,
                            .tokens_per_second = rate};
    FILE *f = train_metrics_stage(&r->metrics);
    fprintf(f, "{\"step\": %ld, ", ts->step);
    r->kind_ops->log_window(r->kind, &w, f);
    fprintf(f, "\"num_tokens\": %ld, \"epoch\": %.4f, \"tokens_per_second\": %.1f}\n", ts->num_tokens,
            (double)ts->cursor / r->kind_ops->row_count(r->kind), rate);
    ts->win_loss = ts->win_acc = ts->win_norm = ts->win_ent = 0, ts->win = 0;
    return train_metrics_commit(&r->metrics);
}

static ctrl_status kind_save_state(void *user, const char *dir) {
    run_state *r = user;
    return r->kind_ops->save_state(r->kind, dir);
}

ctrl_status train_run_save_checkpoint(run_state *r, const char *out_dir, const ctrl_train_state *ts) {
    char dir[4200];
    const int keep = r->s->train.save_total_limit;
    /* zero3: the model's layers streamed to rank 0 one at a time as its writer reaches them
     * (zero_save.c), with LoRA the adapters alone all-gathered (the frozen base never); else the
     * whole model on every rank first */
    const int streamed = train_zero_save_streams(&r->zero), adapters = train_zero_save_adapter_only(&r->zero);
    ctrl_status st = streamed   ? CTRL_OK
                     : adapters ? train_zero_gather_adapters(&r->zero)
                                : train_zero_gather_all(&r->zero);
    /* zero3's slices have one owner each: nothing to compare */
    if (st == CTRL_OK && !streamed && !adapters) st = train_dp_check_weights(&r->dp, r->model, ts->step);
    if (st == CTRL_OK && streamed) train_zero_save_begin(&r->zero);
    if (st == CTRL_OK && streamed && !r->root) /* rank 0 writes the model: this rank sends its slices */
        st = train_zero_save_serve(&r->zero);
    if (st == CTRL_OK && !r->root && r->zero.stage) /* ZeRO: its slice of the state to rank 0 */
        st = train_zero_send_state(&r->zero, r->opt_ops, r->opt);
    if (st == CTRL_OK && !r->root && r->kind_ops->save_state_serve) /* zero3's sliced value model */
        st = r->kind_ops->save_state_serve(r->kind);
    const ctrl_checkpoint_shards shards = {r->zero.size, train_zero_write_shard, &r->zero,
                                           streamed ? train_zero_save_model_written : NULL};
    const ctrl_checkpoint_extra extra = {kind_save_state, r}; /* a value model */
    if (st == CTRL_OK && r->root)                             /* rank 0 writes */
        st = ctrl_checkpoint_save(out_dir, r->model, r->s->model.path, r->opt_ops, r->opt, ts,
                                  r->zero.stage ? &shards : NULL, r->kind_ops->save_state ? &extra : NULL,
                                  keep, dir, sizeof dir);
    if (streamed && r->root) { /* the others stop serving, however the save went (once) */
        const ctrl_status e = train_zero_save_end(&r->zero);
        st = st != CTRL_OK ? st : e;
    }
    if (st == CTRL_OK && r->root) CTRL_INFO("checkpoint saved to %s", dir);
    if (streamed || adapters) {
        char what[64];
        snprintf(what, sizeof what, "checkpoint-%ld's %s", ts->step, adapters ? "adapter" : "model");
        train_zero_save_report(&r->zero, what);
    }
    train_zero_release_all(&r->zero);
    return st;
}

/* zero3 on several ranks, a kind whose evaluation runs the training's forwards: those gather each
 * layer around its use as in training (every rank running as many forwards: the lockstep), as
 * DeepSpeed evaluates; CTRL_TEST_ZERO3_WHOLE_EVAL gathers the whole model instead, as before
 * (tests and benchmarks compare). */
static int eval_layerwise(const run_state *r) {
    return r->zero.stage >= 3 && r->zero.size > 1 && r->kind_ops->eval_layerwise &&
           !getenv("CTRL_TEST_ZERO3_WHOLE_EVAL");
}

/* An evaluation at `step` (has_eval: there is an eval set, the same on every rank): every rank
 * evaluates its share and the kind sums the ranks' values (train_dp_eval_reduce), `metrics` NULL
 * except on rank 0, which writes the line; with zero3 the layers are gathered around each use by
 * every rank in lockstep (eval_layerwise), or every rank first gathers the whole model (a
 * collective) and releases it after. */
ctrl_status train_run_evaluate(run_state *r, int has_eval, long step) {
    const int any = r->kind_ops->has_eval(r->kind); /* the same on every rank */
    if (any && eval_layerwise(r)) {
        train_dp_eval_set_lockstep(1);
        /* a CUDA model's zero3 in bf16: the fp32 masters, as the whole gather */
        ctrl_status st = train_zero_fp32_phase(&r->zero, 1);
        if (st == CTRL_OK && has_eval)
            st = r->kind_ops->evaluate(r->kind, step, train_metrics_stage(&r->metrics));
        const ctrl_status sf = train_zero_fp32_phase(&r->zero, 0);
        if (st == CTRL_OK) st = sf;
        train_dp_eval_set_lockstep(0);
        return st == CTRL_OK && has_eval ? train_metrics_commit(&r->metrics) : st;
    }
    ctrl_status st = any ? train_zero_gather_all(&r->zero) : CTRL_OK;
    if (st == CTRL_OK && any && r->kind_ops->eval_whole) st = r->kind_ops->eval_whole(r->kind, 1);
    if (st == CTRL_OK && has_eval)
        st = r->kind_ops->evaluate(r->kind, step, train_metrics_stage(&r->metrics));
    if (st == CTRL_OK && has_eval)
        st = train_metrics_commit(&r->metrics); /* the root's lines to every sink */
    if (any) train_zero_release_all(&r->zero);
    if (any && r->kind_ops->eval_whole) {
        const ctrl_status sr = r->kind_ops->eval_whole(r->kind, 0);
        if (st == CTRL_OK) st = sr;
    }
    return st;
}

/* Interrupted after step ts->step (or during the next one, whose partial work is dropped): a
 * checkpoint of that step; the model is saved by the caller. */
ctrl_status train_run_save_interrupted(run_state *r, const char *out_dir, const ctrl_train_state *ts,
                                       const char *when) {
    ctrl_status st = train_run_save_checkpoint(r, out_dir, ts);
    if (st != CTRL_OK) return st;
    return ctrl_error_set(CTRL_ERR_INTERRUPTED,
                          "interrupted %s step %ld: checkpoint and model saved; continue with [train] "
                          "resume_from_checkpoint = last",
                          when, !strcmp(when, "after") ? ts->step : ts->step + 1);
}

/* Why the run stopped at a failed step: what is left to resume from. */
void train_run_name_last_checkpoint(ctrl_status st, const char *out_dir) {
    char last[4200];
    if (ctrl_checkpoint_last(out_dir, last, sizeof last))
        ctrl_error_append(st, "the last good checkpoint, %s, is intact", last);
    else
        ctrl_error_append(st, "no checkpoint was saved before it");
}
