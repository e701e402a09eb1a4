/* The sft trainer's loss against transformers' ForCausalLMLoss with num_items_in_batch
 * (tests/reference/make_sft_loss_fixtures.py): three micro-batches of one accumulated batch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/trainer.h>

#include "registry/registry.h"
#include "test.h"

const ctrl_plugin *const *ctrl_plugins_sft(void);

static int read_tagged(FILE *f, const char *tag, float *x, int n) {
    char word[32];
    if (fscanf(f, "%31s", word) != 1 || strcmp(word, tag) != 0) return 0;
    for (int i = 0; i < n; i++)
        if (fscanf(f, "%f", &x[i]) != 1) return 0;
    return 1;
}

TEST(loss_matches_transformers_with_accumulation) {
    const ctrl_plugin *p = ctrl_plugins_sft()[0];
    CHECK(p->kind == CTRL_KIND_TRAINER && !strcmp(p->name, "sft"));
    const ctrl_trainer_ops *ops = p->ops;
    CHECK_EQ_INT(p->init(ctrl_host_table()), CTRL_OK); /* as the registry does after loading */
    ctrl_trainer *t = NULL;
    CHECK_EQ_INT(ops->create(ctrl_host_table(), NULL, &t), CTRL_OK);

    char path[1024];
    snprintf(path, sizeof path, "%s/trainer/sft_loss.txt", CTRL_FIXTURE_DIR);
    FILE *f = fopen(path, "r");
    CHECK_MSG(f != NULL, "cannot open %s", path);
    if (!f) return;
    char line[256], word[32];
    if (!fgets(line, sizeof line, f)) line[0] = 0;
    int n_micro, num_items;
    CHECK(fscanf(f, "%31s %d %d", word, &n_micro, &num_items) == 3);
    for (int m = 0; m < n_micro; m++) {
        int T;
        double want;
        CHECK(fscanf(f, "%31s %d %lf", word, &T, &want) == 3);
        float *logp = malloc(sizeof(float) * T), *mask = malloc(sizeof(float) * T);
        float *dwant = malloc(sizeof(float) * T), *dlogp = malloc(sizeof(float) * T);
        CHECK(read_tagged(f, "logp", logp, T) && read_tagged(f, "mask", mask, T) &&
              read_tagged(f, "dlogp", dwant, T));
        memset(dlogp, 0xff, sizeof(float) * T); /* poisoned: every element must be written */
        ctrl_trainer_batch b = {
            .size = sizeof b, .T = T, .logp = logp, .weight = mask, .num_items = num_items};
        double loss;
        CHECK_EQ_INT(ops->loss(t, &b, &loss, dlogp), CTRL_OK);
        CHECK_NEAR(loss, want, 1e-6 * (1 + want));
        CHECK_REL(dlogp, dwant, T, 1e-6);
        free(logp);
        free(mask);
        free(dwant);
        free(dlogp);
    }
    fclose(f);
    ops->destroy(t);
}

TEST(empty_accumulated_batch_is_an_error) {
    const ctrl_plugin *p = ctrl_plugins_sft()[0];
    const ctrl_trainer_ops *ops = p->ops;
    CHECK_EQ_INT(p->init(ctrl_host_table()), CTRL_OK);
    ctrl_trainer *t = NULL;
    CHECK_EQ_INT(ops->create(ctrl_host_table(), NULL, &t), CTRL_OK);
    float logp[2] = {-1, -2}, w[2] = {0, 0}, d[2];
    ctrl_trainer_batch b = {.size = sizeof b, .T = 2, .logp = logp, .weight = w, .num_items = 0};
    double loss;
    CHECK_EQ_INT(ops->loss(t, &b, &loss, d), CTRL_ERR_RUNTIME);
    CHECK_CONTAINS(ctrl_error_message(), "no trained token");
    ops->destroy(t);
}

/* A plugin built against these headers refuses, with a message, the smaller host table of an older
 * ctrl, which lacks functions plugin_api.h's macros call (ctrl_option_* ...). */
TEST(init_refuses_an_older_host_table) {
    const ctrl_plugin *p = ctrl_plugins_sft()[0];
    ctrl_host old = *ctrl_host_table();
    old.size = offsetof(ctrl_host, option_string);
    CHECK_EQ_INT(p->init(&old), CTRL_ERR_PLUGIN);
    CHECK_CONTAINS(ctrl_error_message(), "built against a newer ctrl");
    CHECK_EQ_INT(p->init(ctrl_host_table()), CTRL_OK);
}
