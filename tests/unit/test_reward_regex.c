/* The `format` and `regex` reward plugins against Python (tests/reference/
 * make_regex_reward_fixtures.py): TRL's think_format_reward for the default `format`, and re.match /
 * re.search / re.fullmatch / re.findall with the same flags for other settings (UTF-8 text, empty
 * matches, multi-line anchors, case folding); an invalid pattern is a config error naming the
 * section and key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>
#include <ctrl/reward.h>

#include "file_text.h"
#include "test.h"
#include "test_registry.h"

TEST(format_and_regex_match_python) {
    char path[1024];
    snprintf(path, sizeof path, "%s/reward/regex.json", CTRL_FIXTURE_DIR);
    ctrl_status st;
    char *text = ctrl_read_text_file(path, 1 << 20, &st);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK_MSG(root != NULL, "cannot read %s", path);
    if (!root) return;
    const cJSON *settings = cJSON_GetObjectItem(root, "settings"),
                *cases = cJSON_GetObjectItem(root, "cases");
    char ini[8192];
    int n = snprintf(ini, sizeof ini, "[model]\npath = m\n[memory]\nstrategies =\n");
    for (const cJSON *s = settings->child; s; s = s->next) {
        n += snprintf(ini + n, sizeof ini - n, "[reward.%s]\nplugin = %s\n", s->string,
                      cJSON_GetObjectItem(s, "plugin")->valuestring);
        for (const cJSON *o = cJSON_GetObjectItem(s, "options")->child; o; o = o->next)
            n += snprintf(ini + n, sizeof ini - n, "%s = %s\n", o->string, o->valuestring);
    }
    ctrl_registry *reg = test_plugin_registry();
    ctrl_config *cfg = test_config_from_text(reg, "regex.ini", ini);
    CHECK(cfg != NULL);
    const int nc = cJSON_GetArraySize(cases);
    const char **completions = calloc((size_t)nc, sizeof(char *));
    float *got = calloc((size_t)nc, sizeof(float));
    int i = 0;
    for (const cJSON *c = cases->child; c; c = c->next)
        completions[i++] = cJSON_GetObjectItem(c, "completion")->valuestring;
    const ctrl_reward_batch b = {.size = sizeof b, .n = nc, .completions = completions};
    int checked = 0;
    for (const cJSON *s = settings->child; cfg && s; s = s->next) {
        const ctrl_plugin_entry *e =
            ctrl_registry_find(reg, CTRL_KIND_REWARD, cJSON_GetObjectItem(s, "plugin")->valuestring);
        CHECK(e != NULL);
        if (!e) continue;
        const ctrl_reward_ops *ops = e->plugin->ops;
        char section[128];
        snprintf(section, sizeof section, "reward.%s", s->string);
        ctrl_reward *r = NULL;
        CHECK_EQ_INT(ops->create(ctrl_host_table(), cfg, section, &r), CTRL_OK);
        if (!r) continue;
        CHECK_EQ_INT(ops->score(r, &b, got), CTRL_OK);
        i = 0;
        for (const cJSON *c = cases->child; c; c = c->next, i++) {
            const double want =
                cJSON_GetObjectItem(cJSON_GetObjectItem(c, "expected"), s->string)->valuedouble;
            CHECK_MSG(got[i] == (float)want, "[%s] on '%s': %g, Python %g", section, completions[i], got[i],
                      want);
            checked++;
        }
        ops->destroy(r);
    }
    printf("  %d scores equal to Python's\n", checked);
    ctrl_config_free(cfg);

    /* an invalid pattern: a config error naming file:line, the section and key */
    test_config_refused(reg, "bad.ini",
                        "[model]\npath = m\n[memory]\nstrategies =\n[reward.bad]\nplugin = regex\n"
                        "pattern = (unclosed\n",
                        "bad.ini:7: [reward.bad] pattern: invalid at offset 9");
    free(completions), free(got);
    cJSON_Delete(root);
    ctrl_registry_destroy(reg);
}

/* An empty pattern is refused naming the key, for `regex` (required) and for `format` (which used to
 * fall back silently to its default when the file set `pattern =`). The flags come from each
 * plugin's option table: `format` defaults dotall and multiline to true, so TRL's think format
 * matches across lines with no flag in the file. */
TEST(empty_pattern_is_refused_and_flags_come_from_the_table) {
    ctrl_registry *reg = test_plugin_registry();
    static const char *const empty = "[model]\npath = m\n[memory]\nstrategies =\n"
                                     "[reward.re]\nplugin = regex\npattern =\n"
                                     "[reward.fmt]\nplugin = format\npattern =\n";
    /* refused when the config is validated (ctrl config check), each at its line */
    test_config_refused(reg, "empty.ini", empty, "empty.ini:7: [reward.re] pattern: must not be empty");
    test_config_refused(reg, "empty.ini", empty, "empty.ini:10: [reward.fmt] pattern: must not be empty");
    ctrl_config *cfg = test_config_from_text(reg, "think.ini",
                                             "[model]\npath = m\n[memory]\nstrategies =\n"
                                             "[reward.think]\nplugin = format\n");
    const ctrl_plugin_entry *fmt = ctrl_registry_find(reg, CTRL_KIND_REWARD, "format");
    CHECK(cfg && fmt);
    if (!cfg || !fmt) return;
    const ctrl_reward_ops *fmt_ops = fmt->plugin->ops;
    ctrl_reward *r = NULL;
    CHECK_EQ_INT(fmt_ops->create(ctrl_host_table(), cfg, "reward.think", &r), CTRL_OK);
    if (r) {
        const char *completions[] = {"<think>\nstep one\nstep two\n</think>\nanswer", "no think"};
        ctrl_reward_batch b = {.size = sizeof b, .n = 2, .completions = completions};
        float out[2];
        CHECK_EQ_INT(fmt_ops->score(r, &b, out), CTRL_OK);
        CHECK_NEAR(out[0], 1.0, 0);
        CHECK_NEAR(out[1], 0.0, 0);
        fmt_ops->destroy(r);
    }
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}
