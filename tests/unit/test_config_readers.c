/* No declared key without a reader (issue 23 item 9): after a config is loaded, every key of every
 * core section has been asked for by a reader -- the typed settings (config_settings_fill) or the
 * validation that resolves plugins from it -- set or not (config_note_read logs the accessors' reads). A key
 * nothing reads is accepted and silently ignored, the worst thing a config can do to a user: this test names
 * any such key. */
#include "config/config_internal.h"
#include "config_test_support.h"
#include "test.h"

TEST(every_core_key_is_read) {
    ctrl_registry *reg = test_registry();
    CHECK(reg != NULL);
    if (!reg) return;
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(write_ini("all.ini", "[model]\npath = m\n", 0), NULL, 0, reg, &cfg),
                 CTRL_OK);
    if (!cfg) {
        printf("  %s\n", ctrl_error_message());
        ctrl_registry_destroy(reg);
        return;
    }
    int keys = 0;
    for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++) {
        if (strchr(s->name, '.')) continue; /* [reward.NAME] and the like: per instance, read by plugins */
        for (const ctrl_option *o = s->options; o && o->key; o++) {
            keys++;
            CHECK_MSG(config_was_read(cfg, s->name, o->key), "[%s] %s: declared, but nothing reads it",
                      s->name, o->key);
        }
    }
    printf("  %d core keys, each read by the typed settings\n", keys);
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}
