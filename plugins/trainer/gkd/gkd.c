/* GKD with TRL's semantics (trl.experimental.gkd GKDTrainer, trl 1.16): the generalized
 * Jensen-Shannon divergence between the student's and a frozen teacher's next-token distributions
 * over the completion tokens (beta 0 = forward KL, 1 = reverse KL), normalised by the accumulated
 * batch's completion tokens (num_items_in_batch); completions from the dataset, sampled on-policy
 * by the student with probability lmbda, or else by the teacher with seq_kd, at `temperature`
 * (top_k 0, top_p 1 unless [generation] says otherwise). The core's distill kind holds the teacher
 * ([teacher] path), samples, and computes the divergence chunk by chunk from both heads
 * (ctrl_model_jsd_forward); this plugin says what to do and turns divergences into the loss. */
#include <stdlib.h>

#include <ctrl/plugin_api.h>

CTRL_PLUGIN_API_DEFINE;

struct ctrl_trainer {
    ctrl_distill_spec spec;
};

static ctrl_status gkd_create(const ctrl_host *host, const ctrl_config *cfg, ctrl_trainer **out) {
    (void)host; /* kept by init (plugin_api.h) */
    ctrl_trainer *t = calloc(1, sizeof *t);
    if (!t) return ctrl_error_set(CTRL_ERR_NOMEM, "trainer gkd: out of memory");
    ctrl_status st = CTRL_OK;
    t->spec = (ctrl_distill_spec){.size = sizeof t->spec,
                                  .beta = ctrl_option_float(cfg, "gkd", "beta", &st),
                                  .lmbda = ctrl_option_float(cfg, "gkd", "lmbda", &st),
                                  .seq_kd = ctrl_option_bool(cfg, "gkd", "seq_kd", &st),
                                  .max_new_tokens = (int)ctrl_option_int(cfg, "gkd", "max_new_tokens", &st),
                                  .temperature = ctrl_option_float(cfg, "gkd", "temperature", &st),
                                  /* GKDTrainer.compute_loss calls generalized_jsd_loss at its default
                                   * temperature: the sampling temperature is not applied to the loss */
                                  .loss_temperature = 1.0};
    if (st != CTRL_OK) {
        free(t);
        return st;
    }
    *out = t;
    return CTRL_OK;
}

static ctrl_status gkd_spec(ctrl_trainer *t, ctrl_distill_spec *out) {
    *out = t->spec;
    return CTRL_OK;
}

/* sum_t weight_t jsd_t / num_items_in_batch (TRL's reduction with num_items_in_batch; a batch with
 * no completion token counts as one, where TRL would divide by zero). */
static ctrl_status gkd_loss(ctrl_trainer *t, const ctrl_distill_batch *b, double *loss, float *djsd) {
    (void)t;
    if (b->size < sizeof(ctrl_distill_batch) || !b->weight)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "trainer gkd: the batch carries no token weights "
                                                "(gkd runs under the core's distill kind)");
    const double n = b->num_items > 1 ? b->num_items : 1;
    double sum = 0;
    for (int i = 0; i < b->T; i++) {
        djsd[i] = (float)(b->weight[i] / n);
        if (b->jsd) sum += (double)b->weight[i] * b->jsd[i];
    }
    *loss = sum / n;
    return CTRL_OK;
}

static void gkd_destroy(ctrl_trainer *t) { free(t); }

static const ctrl_trainer_distill_ops gkd_distill = {.distill_spec = gkd_spec, .distill_loss = gkd_loss};

static const ctrl_trainer_ops gkd_ops = {
    .size = sizeof(ctrl_trainer_ops),
    .create = gkd_create,
    .destroy = gkd_destroy,
    .distill = &gkd_distill,
};

static const ctrl_option gkd_options[] = {
    {"beta", CTRL_OPT_FLOAT, "0.5", CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX, 0, 1, NULL,
     "Generalized JSD interpolation: 0 = forward KL(teacher || student), 1 = reverse KL(student || teacher), "
     "between: the JSD of the mixture (1 - beta) p_student + beta p_teacher."},
    {"lmbda", CTRL_OPT_FLOAT, "0.5", CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX, 0, 1, NULL,
     "Fraction of micro-batches whose completions the student samples on-policy from the prompts."},
    {"seq_kd", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "The other micro-batches' completions are sampled by the teacher (sequence-level KD), not the "
     "dataset's."},
    {"max_new_tokens", CTRL_OPT_INT, "128", CTRL_OPT_HAS_MIN, 1, 0, NULL,
     "Tokens sampled per completion at most (TRL's DistillationConfig calls it max_completion_length)."},
    {"temperature", CTRL_OPT_FLOAT, "0.9", CTRL_OPT_HAS_MIN | CTRL_OPT_MIN_OPEN, 0, 0, NULL,
     "Sampling temperature of the student's and the teacher's completions (the divergence is taken at 1, as "
     "TRL's GKDTrainer)."},
    CTRL_OPTION_END,
};

static const ctrl_plugin gkd_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_TRAINER,
    .name = "gkd",
    .version = "0.1.0",
    .summary =
        "Generalized Knowledge Distillation from a [teacher] model (TRL's GKD: JSD with beta, lmbda, seq_kd)",
    .options = gkd_options,
    .init = ctrl_plugin_api_init,
    .ops = &gkd_ops,
};

CTRL_PLUGIN_DEFINE(&gkd_plugin)
