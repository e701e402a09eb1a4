/* The `length` reward plugin, loaded from its .so through the registry and configured from a real
 * INI file, against TRL's reward_len example (tests/reference/make_reward_fixtures.py). */
#include "reward_case.h"

TEST(matches_trl_reward_len) {
    reward_case_setup("length");
    CHECK(ops != NULL);
    if (!ops) return;
    ctrl_config *cfg =
        reward_case_load("[model]\npath = m\n[memory]\nstrategies =\n[reward.len20]\nplugin = length\n"
                         "[reward.len5]\nplugin = length\ntarget_length = 5\n"
                         "[reward.tok]\nplugin = length\nunit = tokens\ntarget_length = 3\n");
    CHECK(cfg != NULL);
    if (!cfg) return;

    char path[1024];
    snprintf(path, sizeof path, "%s/reward/length.tsv", CTRL_FIXTURE_DIR);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    char line[1024];
    int n = 0;
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
        if (!t2) continue;
        *t1 = *t2 = '\0';
        int target = atoi(line);
        float want = (float)atof(t1 + 1);
        const char *completion = t2 + 1;
        ctrl_reward *r = NULL;
        CHECK_EQ_INT(ops->create(ctrl_host_table(), cfg, target == 20 ? "reward.len20" : "reward.len5", &r),
                     CTRL_OK);
        const char *texts[1] = {completion};
        ctrl_reward_batch b = {.size = sizeof b, .n = 1, .completions = texts};
        float got = 1;
        CHECK_EQ_INT(ops->score(r, &b, &got), CTRL_OK);
        CHECK_MSG(got == want, "target %d, '%s': %g, TRL %g", target, completion, got, want);
        ops->destroy(r);
        n++;
    }
    if (f) fclose(f);
    CHECK_EQ_INT(n, 14);

    /* unit = tokens counts completion ids. */
    ctrl_reward *r = NULL;
    CHECK_EQ_INT(ops->create(ctrl_host_table(), cfg, "reward.tok", &r), CTRL_OK);
    int32_t ids0[5] = {1, 2, 3, 4, 5}, ids1[1] = {7};
    const int32_t *ids[2] = {ids0, ids1};
    int lens[2] = {5, 1};
    const char *texts[2] = {"whatever", "x"};
    ctrl_reward_batch b = {
        .size = sizeof b, .n = 2, .completions = texts, .completion_ids = ids, .completion_lens = lens};
    float out[2];
    CHECK_EQ_INT(ops->score(r, &b, out), CTRL_OK);
    CHECK(out[0] == -2.0f && out[1] == -2.0f);
    ops->destroy(r);
    ctrl_config_free(cfg);
}
