/* The shared loop's pieces that need no model: which kind of trainer a plugin's ops call for
 * (train/kind.c, TRAINER_HAS against an older plugin's shorter table), and the collapse warning's
 * logic (train/health.c). */
#include <math.h>

#include "test.h"
#include "train/health.h"
#include "train/kind.h"

static ctrl_status t_loss(ctrl_trainer *t, const ctrl_trainer_batch *b, double *loss, float *d) {
    (void)t, (void)b, (void)loss, (void)d;
    return CTRL_OK;
}
static ctrl_status t_spec(ctrl_trainer *t, ctrl_online_spec *o) {
    (void)t, (void)o;
    return CTRL_OK;
}
static ctrl_status t_adv(ctrl_trainer *t, const ctrl_rollout *r, float *a) {
    (void)t, (void)r, (void)a;
    return CTRL_OK;
}
static ctrl_status t_seq(ctrl_trainer *t, const ctrl_sequence_batch *b, double *loss, double *ds,
                         float *dscore, float *dlogp, int *per_token) {
    (void)t, (void)b, (void)loss, (void)ds, (void)dscore, (void)dlogp, (void)per_token;
    return CTRL_OK;
}

static ctrl_status t_seq_spec(ctrl_trainer *t, ctrl_sequence_spec *o) {
    (void)t, (void)o;
    return CTRL_OK;
}

TEST(kind_from_the_plugin_ops) {
    const train_kind_ops *k = NULL;
    ctrl_trainer_ops sft = {.size = sizeof sft, .loss = t_loss};
    CHECK_EQ_INT(train_kind_for(&sft, "sft", &k), CTRL_OK);
    CHECK(k == &train_kind_token);
    ctrl_trainer_ops grpo = {.size = sizeof grpo, .loss = t_loss, .online_spec = t_spec, .advantages = t_adv};
    CHECK_EQ_INT(train_kind_for(&grpo, "grpo", &k), CTRL_OK);
    CHECK(k == &train_kind_online);
    /* a table built before online trainers existed ends before `online_spec`: what lies beyond its
     * size is not read, so it is a token-level trainer */
    grpo.size = offsetof(ctrl_trainer_ops, online_spec);
    CHECK_EQ_INT(train_kind_for(&grpo, "old", &k), CTRL_OK);
    CHECK(k == &train_kind_token);
    /* sequence-level: the sequence kind; without a sequence_spec named, not run as SFT */
    ctrl_trainer_ops dpo = {.size = sizeof dpo, .sequence_loss = t_seq};
    k = NULL;
    CHECK_EQ_INT(train_kind_for(&dpo, "dpo", &k), CTRL_ERR_UNSUPPORTED);
    CHECK(k == NULL);
    CHECK(strstr(ctrl_error_message(), "trainer 'dpo' is sequence-level") != NULL);
    dpo.sequence_spec = t_seq_spec;
    CHECK_EQ_INT(train_kind_for(&dpo, "dpo", &k), CTRL_OK);
    CHECK(k == &train_kind_sequence);
    ctrl_trainer_ops none = {.size = sizeof none};
    CHECK_EQ_INT(train_kind_for(&none, "empty", &k), CTRL_ERR_UNSUPPORTED);
    CHECK(strstr(ctrl_error_message(), "trainer 'empty' has no loss") != NULL);
}

TEST(non_finite_stops_naming_the_step) {
    CHECK_EQ_INT(train_health_step(4, 1.5, 0.25), CTRL_OK);
    CHECK_EQ_INT(train_health_step(4, NAN, 0.25), CTRL_ERR_RUNTIME);
    CHECK(strstr(ctrl_error_message(), "step 5: non-finite loss (nan)") != NULL);
    CHECK_EQ_INT(train_health_step(6, 2.0, INFINITY), CTRL_ERR_RUNTIME);
    CHECK(strstr(ctrl_error_message(), "step 7: non-finite grad_norm (inf)") != NULL);
}

TEST(collapse_warns_once_after_consecutive_zero_windows) {
    train_health h = {0};
    /* two zero windows, then a non-zero one: the count starts over */
    train_health_window(&h, 10, 10, 0.0, 6.9, 1e6);
    train_health_window(&h, 20, 10, 0.0, 6.9, 1e6);
    train_health_window(&h, 30, 10, 1e-9, 6.9, 1e6);
    CHECK_EQ_INT(h.zero_windows, 0);
    CHECK(!h.warned);
    for (int i = 1; i < TRAIN_HEALTH_ZERO_WINDOWS; i++)
        train_health_window(&h, 30 + 10 * i, 10, 0.0, 6.9, 1e6);
    CHECK(!h.warned);
    train_health_window(&h, 60, 10, 0.0, 6.9, 1e6);
    CHECK(h.warned);
    CHECK_EQ_INT(h.zero_steps, 10L * TRAIN_HEALTH_ZERO_WINDOWS);
    /* once: more zero windows, or a recovery and a new collapse, say nothing more */
    train_health_window(&h, 70, 10, 0.0, 6.9, 1e6);
    train_health_window(&h, 80, 10, 0.5, 6.9, 1e6);
    for (int i = 0; i < 2 * TRAIN_HEALTH_ZERO_WINDOWS; i++)
        train_health_window(&h, 90 + 10 * i, 10, 0.0, 6.9, 1e6);
    CHECK(h.warned == 1);
}
