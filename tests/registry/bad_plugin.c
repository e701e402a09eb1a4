/* One source, many broken plugins: BAD_CASE selects what is wrong with this build of it. Each
 * case is its own .so in its own directory (see tests.cmake), loaded by test_registry. */
#include <ctrl/reward.h>

static ctrl_status ok_create(const ctrl_host *h, const ctrl_config *c, const char *s, ctrl_reward **out) {
    (void)h;
    (void)c;
    (void)s;
    *out = 0;
    return CTRL_OK;
}
static ctrl_status ok_score(ctrl_reward *r, const ctrl_reward_batch *b, float *out) {
    (void)r;
    for (int i = 0; i < b->n; i++) out[i] = 0;
    return CTRL_OK;
}
static void ok_destroy(ctrl_reward *r) { (void)r; }

__attribute__((unused)) static const ctrl_reward_ops ops = {
    .size = sizeof(ctrl_reward_ops), .create = ok_create, .score = ok_score, .destroy = ok_destroy};

#ifndef BAD_NAME
#define BAD_NAME "good"
#endif

static ctrl_status failing_init(const ctrl_host *host) {
    return host->error_set(CTRL_ERR_RUNTIME, "license file not found");
}

__attribute__((unused)) static const ctrl_plugin plugin = {
#if BAD_CASE == 1 /* wrong ABI */
    .abi = CTRL_PLUGIN_ABI + 6,
    .size = sizeof(ctrl_plugin),
    .signature = CTRL_PLUGIN_SIGNATURE,
#elif BAD_CASE == 2 /* wrong signature */
    .abi = CTRL_PLUGIN_ABI,
    .size = sizeof(ctrl_plugin),
    .signature = "ctrl1-ilp32",
#elif BAD_CASE == 3 /* descriptor too small */
    .abi = CTRL_PLUGIN_ABI,
    .size = 8,
    .signature = CTRL_PLUGIN_SIGNATURE,
#else
    CTRL_PLUGIN_HEADER,
#endif
    .kind = CTRL_KIND_REWARD,
    .name = BAD_NAME,
    .version = "1.0",
    .summary = "a test plugin",
#if BAD_CASE == 4 /* no ops */
    .ops = 0,
#else
    .ops = &ops,
#endif
#if BAD_CASE == 5
    .init = failing_init,
#endif
};

#if BAD_CASE == 6 /* no entry symbol */
const ctrl_plugin *const *not_the_entry(void);
const ctrl_plugin *const *not_the_entry(void) {
    static const ctrl_plugin *const list[] = {&plugin, 0};
    return list;
}
#elif BAD_CASE == 7 /* entry returns NULL */
CTRL_PLUGIN_EXPORT const ctrl_plugin *const *ctrl_plugins(void);
CTRL_PLUGIN_EXPORT const ctrl_plugin *const *ctrl_plugins(void) { return 0; }
#else
CTRL_PLUGIN_DEFINE(&plugin)
#endif

#if BAD_CASE != 5
/* Keep -Wunused-function quiet in the cases that do not use it. */
void *bad_plugin_unused(void);
void *bad_plugin_unused(void) { return (void *)(unsigned long)failing_init; }
#endif
