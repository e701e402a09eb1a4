/* The `command` reward plugin, loaded from its .so through the registry: scores from a program over
 * JSON lines (tests/reward/command_helper.c), against TRL's reward_len on the fixture TRL wrote
 * (tests/reference/make_reward_fixtures.py); the row's columns and completion ids reach the
 * program; a program that exits, stalls or answers garbage is an error naming the reward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/ctrl.h>

#include "config/config_load.h"
#include "registry/registry.h"
#include "test.h"

static ctrl_registry *reg;
static const ctrl_reward_ops *ops;

static ctrl_config *load(const char *ini) {
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

/* A reward instance from "[reward.x]\nplugin = command\n" + `options`. */
static ctrl_reward *make(const char *options, ctrl_config **cfg) {
    char ini[2048];
    snprintf(ini, sizeof ini, "[model]\npath = m\n[memory]\nstrategies =\n[reward.x]\nplugin = command\n%s",
             options);
    *cfg = load(ini);
    ctrl_reward *r = NULL;
    if (*cfg && ops->create(ctrl_host_table(), *cfg, "reward.x", &r) != CTRL_OK)
        printf("  create: %s\n", ctrl_error_message());
    return r;
}

static void setup(void) {
    if (reg) return;
    ctrl_registry_create(&reg);
    char so[1024];
    snprintf(so, sizeof so, "%s/command.so", CTRL_PLUGIN_DIR);
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
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_REWARD, "command");
    ops = e ? e->plugin->ops : NULL;
}

TEST(matches_trl_reward_len) {
    setup();
    CHECK(ops != NULL);
    if (!ops) return;
    ctrl_config *cfg;
    ctrl_reward *r = make("command = " CTRL_HELPER " len\n", &cfg);
    CHECK(r != NULL);
    char path[1024], line[1024];
    snprintf(path, sizeof path, "%s/reward/length.tsv", CTRL_FIXTURE_DIR);
    FILE *f = fopen(path, "r");
    /* every target-20 completion of the fixture in one batch, as the trainer sends a batch */
    const char *texts[32];
    float want[32], got[32];
    char store[32][256];
    int n = 0;
    while (r && f && n < 32 && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
        if (!t2 || atoi(line) != 20) continue;
        snprintf(store[n], sizeof store[n], "%s", t2 + 1);
        texts[n] = store[n], want[n] = (float)atof(t1 + 1), n++;
    }
    if (f) fclose(f);
    CHECK(n >= 5);
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
    for (int round = 0; r && round < 3; round++) { /* the same program serves batch after batch */
        CHECK_EQ_INT(ops->score(r, &b, got), CTRL_OK);
        for (int i = 0; i < n; i++)
            CHECK_MSG(got[i] == want[i], "'%s': %g, TRL %g", texts[i], got[i], want[i]);
    }
    if (r) ops->destroy(r);
    ctrl_config_free(cfg);
}

TEST(columns_and_ids_reach_the_program) {
    setup();
    if (!ops) return;
    ctrl_config *cfg;
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
    float got[3];
    ctrl_reward *r = make("command = " CTRL_HELPER " column answer\n", &cfg);
    CHECK(r && ops->score(r, &b, got) == CTRL_OK);
    CHECK(got[0] == 42.0f && isnan(got[1]) && isnan(got[2])); /* null: the reward does not apply */
    if (r) ops->destroy(r);
    ctrl_config_free(cfg);
    r = make("command = " CTRL_HELPER " ids\n", &cfg);
    CHECK(r && ops->score(r, &b, got) == CTRL_OK);
    CHECK(got[0] == 2.007f && got[1] == 2.5f && got[2] == 0.0f);
    if (r) ops->destroy(r);
    ctrl_config_free(cfg);
}

/* A program that misbehaves: the score call fails naming the reward and the cause. */
static void expect_error(const char *options, const char *part) {
    ctrl_config *cfg;
    ctrl_reward *r = make(options, &cfg);
    CHECK(r != NULL);
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
    float got[2];
    if (r) {
        CHECK_EQ_INT(ops->score(r, &b, got), CTRL_ERR_RUNTIME);
        CHECK_MSG(strstr(ctrl_error_message(), "reward.x") && strstr(ctrl_error_message(), part),
                  "'%s' lacks '%s'", ctrl_error_message(), part);
        CHECK_EQ_INT(ops->score(r, &b, got), CTRL_ERR_RUNTIME); /* and stays stopped */
        ops->destroy(r);
    }
    ctrl_config_free(cfg);
}

TEST(misbehaving_programs_are_clear_errors) {
    setup();
    if (!ops) return;
    expect_error("command = exit 3\n", "status 3");
    expect_error("command = sleep 30\ntimeout = 0.3\n", "no reply within");
    expect_error("command = \"echo hello; cat >/dev/null\"\n", "not a JSON list of 2");
    expect_error("command = \"echo '[1]'; cat >/dev/null\"\n", "not a JSON list of 2");
    expect_error("command = kill -9 $$\n", "signal 9");
}
