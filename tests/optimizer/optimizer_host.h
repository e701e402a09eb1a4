/* What the optimizer plugin tests share: a plugin host whose option readers read a table of
 * hyper-parameters (the ctrl_config a test hands the plugin is this table), standing in for a
 * validated config. A key the table lacks is a CTRL_ERR_CONFIG naming it. */
#ifndef CTRL_TEST_OPTIMIZER_HOST_H
#define CTRL_TEST_OPTIMIZER_HOST_H

#include <ctrl/plugin.h>

typedef struct test_hp_table {
    char key[8][32];
    double val[8];
    int n;
} test_hp_table;

/* The host: option_float, option_int and option_bool read the table that stands as the config. */
extern const ctrl_host test_optimizer_host;

/* Sets key to value (added at the end, or replaced where the table holds it already). */
void test_hp_set(test_hp_table *t, const char *key, double value);

/* What validation does: every key plugin p declares that the table leaves out gets the option's
 * default. */
void test_hp_fill_defaults(test_hp_table *t, const ctrl_plugin *p);

/* The table as the config the plugin's create() reads. */
static inline const ctrl_config *test_hp_config(const test_hp_table *t) { return (const ctrl_config *)t; }

#endif
