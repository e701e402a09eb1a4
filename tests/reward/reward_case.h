/* What the tests of the reward plugins that hand the work to another program (`command`, `http`)
 * share: a registry with the plugin's .so and stand-ins for the plugins every config selects; an
 * instance made from "[reward.x]\nplugin = NAME\n" + options through a real config file; TRL's
 * reward_len fixture (tests/reference/make_reward_fixtures.py) as one batch; a batch with ids and a
 * column; the two-completion batch of the error cases. */
#ifndef CTRL_TESTS_REWARD_CASE_H
#define CTRL_TESTS_REWARD_CASE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/ctrl.h>

#include "config/config_load.h"
#include "registry/registry.h"
#include "test.h"

static ctrl_registry *reg;
static const ctrl_reward_ops *ops;

/* Loads CTRL_PLUGIN_DIR/NAME.so once; ops is NULL when it is not there. */
static inline void reward_case_setup(const char *name) {
    if (reg) return;
    ctrl_registry_create(&reg);
    char so[1024];
    snprintf(so, sizeof so, "%s/%s.so", CTRL_PLUGIN_DIR, name);
    if (ctrl_registry_load_file(reg, so) != CTRL_OK) printf("  %s\n", ctrl_error_message());
    static const ctrl_trainer_ops tops = {.size = sizeof tops};
    static const ctrl_optimizer_ops oops = {.size = sizeof oops};
    static const ctrl_attention_ops aops = {.size = sizeof aops};
    static const ctrl_plugin t = {CTRL_PLUGIN_HEADER, .kind = CTRL_KIND_TRAINER, .name = "sft", .ops = &tops};
    static const ctrl_plugin o = {CTRL_PLUGIN_HEADER, .kind = CTRL_KIND_OPTIMIZER, .name = "adamw",
                                  .ops = &oops};
    static const ctrl_plugin a = {CTRL_PLUGIN_HEADER, .kind = CTRL_KIND_ATTENTION, .name = "flash",
                                  .ops = &aops};
    static const ctrl_plugin *const list[] = {&t, &o, &a, NULL};
    ctrl_registry_add_list(reg, list, "<test>");
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_REWARD, name);
    ops = e ? e->plugin->ops : NULL;
}

/* The INI text `ini`, written to a file and loaded against the registry (NULL, printed, when refused). */
static inline ctrl_config *reward_case_load(const char *ini) {
    char path[] = "/tmp/ctrl-reward-test-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "w");
    fputs(ini, f);
    fclose(f);
    ctrl_config *cfg = NULL;
    if (ctrl_config_load(path, NULL, 0, reg, &cfg) != CTRL_OK) printf("  config: %s\n", ctrl_error_message());
    remove(path);
    return cfg;
}

/* The config of "[reward.x]\nplugin = NAME\n" + options. */
static inline ctrl_config *reward_case_config(const char *name, const char *options) {
    char ini[4096];
    snprintf(ini, sizeof ini, "[model]\npath = m\n[memory]\nstrategies =\n[reward.x]\nplugin = %s\n%s", name,
             options);
    return reward_case_load(ini);
}

/* An instance of reward.x (NULL, its error printed, when create fails). */
static inline ctrl_reward *reward_case_make(const char *name, const char *options, ctrl_config **cfg) {
    *cfg = reward_case_config(name, options);
    ctrl_reward *r = NULL;
    if (*cfg && ops->create(ctrl_host_table(), *cfg, "reward.x", &r) != CTRL_OK)
        printf("  create: %s\n", ctrl_error_message());
    return r;
}

/* The fixture's completions with target 20 (at most 32) and TRL's scores of them. */
static inline int reward_case_len_fixture(char store[][256], const char **texts, float *want) {
    char path[1024], line[1024];
    snprintf(path, sizeof path, "%s/reward/length.tsv", CTRL_FIXTURE_DIR);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && n < 32 && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
        if (!t2 || atoi(line) != 20) continue;
        snprintf(store[n], 256, "%s", t2 + 1);
        texts[n] = store[n], want[n] = (float)atof(t1 + 1), n++;
    }
    if (f) fclose(f);
    CHECK(n >= 5);
    return n;
}

/* TRL's reward_len scores from r, batch after batch (the same program or server serves them all). */
static inline void reward_case_check_len(ctrl_reward *r, int rounds) {
    static char store[32][256];
    const char *texts[32];
    float want[32], got[32];
    const int n = reward_case_len_fixture(store, texts, want);
    static const int32_t none[1] = {0};
    const int32_t *ids[32];
    int lens[32];
    for (int i = 0; i < n; i++) ids[i] = none, lens[i] = 0;
    const ctrl_reward_batch b = {.size = sizeof b,
                                 .n = n,
                                 .prompts = texts,
                                 .completions = texts,
                                 .completion_ids = ids,
                                 .completion_lens = lens};
    for (int round = 0; r && round < rounds; round++) {
        CHECK_MSG(ops->score(r, &b, got) == CTRL_OK, "%s", ctrl_error_message());
        for (int i = 0; i < n; i++)
            CHECK_MSG(got[i] == want[i], "'%s': %g, TRL %g", texts[i], got[i], want[i]);
    }
}

/* Scores the batch {"x", "y"} (no ids, no columns). */
static inline ctrl_status reward_case_score_pair(ctrl_reward *r, float got[2]) {
    const char *texts[2] = {"x", "y"};
    static const int32_t none[1] = {0};
    const int32_t *ids[2] = {none, none};
    const int lens[2] = {0, 0};
    const ctrl_reward_batch b = {.size = sizeof b,
                                 .n = 2,
                                 .prompts = texts,
                                 .completions = texts,
                                 .completion_ids = ids,
                                 .completion_lens = lens};
    return ops->score(r, &b, got);
}

/* Scores the batch {"a", "b", "c"} with completion ids {7, 9}, {1500}, {} and an "answer" column
 * of 42, a missing value and "text". */
static inline ctrl_status reward_case_score_columns(ctrl_reward *r, float got[3]) {
    const char *texts[3] = {"a", "b", "c"};
    static const int32_t i0[2] = {7, 9}, i1[1] = {1500};
    const int32_t *ids[3] = {i0, i1, i0};
    const int lens[3] = {2, 1, 0};
    const char *answer[3] = {"42", NULL, "\"text\""}; /* a number, a missing value, a string */
    const ctrl_reward_column col = {.name = "answer", .values = answer};
    const ctrl_reward_batch b = {.size = sizeof b,
                                 .n = 3,
                                 .prompts = texts,
                                 .completions = texts,
                                 .completion_ids = ids,
                                 .completion_lens = lens,
                                 .n_columns = 1,
                                 .columns = &col};
    return ops->score(r, &b, got);
}

#endif
