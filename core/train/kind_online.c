/* The online kind (GRPO, RLOO, PPO; see kind.h): rows are prompts; online_loop.c generates, scores and
 * trains on the generation batches. */
#include <stdlib.h>
#include <unistd.h>

#include "train/kind.h"
#include "train/online.h"
#include "train/zero_ref.h"

struct train_kind {
    ctrl_online *online;
    ctrl_online_spec spec;
    ctrl_model *ref;      /* zero3 on several ranks: the reference sliced as the policy (zero_ref.h), */
    train_zero *ref_zero; /* lent to the online loop; NULL otherwise (the loop loads it whole) */
};

static void online_destroy(train_kind *k) {
    if (!k) return;
    ctrl_online_free(k->online);
    train_zero_ref_free(k->ref_zero, k->ref);
    free(k);
}

static ctrl_status online_create(const train_kind_env *env, train_kind **out) {
    train_kind *k = calloc(1, sizeof *k);
    if (!k) return ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    k->spec.size = sizeof k->spec;
    ctrl_status st = env->trainer_ops->online_spec(env->trainer, &k->spec);
    /* the policy, its reference, a value model (PPO) and the generation engine follow [run] device */
    /* zero3 on several ranks: the reference (GRPO / RLOO with beta > 0, Online DPO, PPO) sliced as the
     * policy, as TRL prepares it with the policy's DeepSpeed config; with LoRA the base is the reference */
    if (st == CTRL_OK && k->spec.needs_ref_logp && !ctrl_model_lora(env->model) &&
        train_zero_ref_applies(env))
        st = train_zero_ref_load(env, &k->ref, &k->ref_zero);
    if (st == CTRL_OK)
        st = ctrl_online_create(env->cfg, env->plugins, env->model, env->tok, env->trainer_ops, env->trainer,
                                k->ref, env->zero3_frozen, &k->online);
    if (st == CTRL_OK)
        ctrl_online_set_whole_weights(k->online, env->whole_weights, env->whole_ctx, env->push_whole,
                                      env->push_ctx);
    if (st != CTRL_OK) {
        online_destroy(k);
        return st;
    }
    *out = k;
    return CTRL_OK;
}

static int online_rows(const train_kind *k) { return ctrl_online_prompt_count(k->online); }

/* A step consumes bs x ga completions: bs x ga / (num_generations x num_iterations) prompts. */
static long online_rows_per_step(const train_kind *k, int bs, int ga) {
    const long rows = (long)ctrl_online_micro_batch(&k->spec, bs) * ga /
                      ((long)k->spec.num_generations * k->spec.num_iterations);
    return rows < 1 ? 1 : rows;
}

static void online_describe(const train_kind *k, long total, int bs, int ga, size_t n_params) {
    CTRL_INFO("training: %d prompts, %ld steps of %d x %d completions, %zu parameters", online_rows(k), total,
              ctrl_online_micro_batch(&k->spec, bs), ga, n_params);
}

static ctrl_status online_accumulate(train_kind *k, const int *order, long *cursor, int bs, int ga,
                                     train_step_stats *out) {
    ctrl_status st = ctrl_online_accumulate(k->online, order, cursor, bs, ga, &out->loss, &out->tokens);
    if (st == CTRL_OK) /* the first step's (its generation batch's reference forwards), once */
        st = train_zero_ref_report(k->ref_zero, "the reference model");
    return st;
}

static ctrl_status online_after_step(train_kind *k, long step) {
    (void)step;
    return ctrl_online_after_step(k->online);
}

static ctrl_status online_optimizer_step(train_kind *k, double lr, long step) {
    return ctrl_online_optimizer_step(k->online, lr, step);
}

static void online_step_time(train_kind *k, double seconds, double cpu_seconds) {
    ctrl_online_report(k->online, "step_time", seconds); /* as TRL logs it */
    ctrl_online_report(k->online, "timing/step_cpu_s", cpu_seconds);
    /* data parallel: the step's metrics summed over the ranks, before rank 0 logs them (a failure
     * here is the next step's: the same collective fails there) */
    (void)ctrl_online_sync_metrics(k->online);
}

/* TRL's online metrics come from the trainer and the generation batches. */
static void online_log_window(train_kind *k, const train_window *w, FILE *f) {
    fprintf(f, "\"loss\": %.6g, \"grad_norm\": %.6f, \"learning_rate\": %.6g, ", w->loss, w->grad_norm,
            w->learning_rate);
    ctrl_online_log_window(k->online, f);
    if (!isatty(fileno(stderr)))
        fprintf(stderr, "step %ld/%ld  loss %.4g  grad_norm %.3f  lr %.3g  %.0f tok/s\n", w->step, w->total,
                w->loss, w->grad_norm, w->learning_rate, w->tokens_per_second);
}

/* eval prompts: without them an evaluation point does nothing (under zero3 it would gather the whole
 * model on every rank for nothing) */
static int online_has_eval(const train_kind *k) { return ctrl_online_has_eval(k->online); }

static ctrl_status online_evaluate(train_kind *k, long step, FILE *f) {
    return ctrl_online_evaluate(k->online, step, f);
}

/* A value model in checkpoints (online_ppo.c). */
static ctrl_status online_save_state(train_kind *k, const char *dir) {
    return ctrl_online_save_state(k->online, dir);
}
static ctrl_status online_save_serve(train_kind *k) { return ctrl_online_save_serve(k->online); }
static ctrl_status online_load_state(train_kind *k, const char *dir, long step) {
    return ctrl_online_load_state(k->online, dir, step);
}

const train_kind_ops train_kind_online = {
    .name = "online",
    .create = online_create,
    .destroy = online_destroy,
    .row_count = online_rows,
    .rows_per_step = online_rows_per_step,
    .describe = online_describe,
    .accumulate = online_accumulate,
    .after_step = online_after_step,
    .step_time = online_step_time,
    .log_window = online_log_window,
    .has_eval = online_has_eval,
    .evaluate = online_evaluate,
    .eval_at_start = 1,
    .splits_ranks = 1,
    .optimizer_step = online_optimizer_step,
    .save_state = online_save_state,
    .load_state = online_load_state,
    .save_state_serve = online_save_serve,
    .eval_layerwise = 1, /* the evaluation generates through whole_weights, as training does */
};
