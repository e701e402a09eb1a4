/* The one header a plugin includes (SQLite's sqlite3ext.h pattern). It brings the plugin ABI and
 * every kind's vtable, and routes each core service a plugin calls -- ctrl_error_set, ctrl_log,
 * ctrl_option_int, ... -- through the ctrl_host table the core lends it, so the plugin imports no
 * symbol from libctrl (`nm -D --undefined-only` lists none of ctrl_*). libctrl's own declarations
 * (status.h, log.h, config.h) are for libctrl's users: including one of them after this header
 * fails to compile, and a call to a libctrl function the table does not offer is an undeclared
 * function.
 *
 *   #include <ctrl/plugin_api.h>
 *   CTRL_PLUGIN_API_DEFINE;                      // once per plugin, in one of its files
 *   ...
 *   static const ctrl_plugin p = { CTRL_PLUGIN_HEADER, .init = ctrl_plugin_api_init, ... };
 *
 * A plugin whose init does more calls CTRL_PLUGIN_API_SET(host) first in it instead. Its other
 * source files only include this header. The core calls init once after loading, before any
 * other callback; a test that links a plugin in calls it too. */
#ifndef CTRL_PLUGIN_API_H
#define CTRL_PLUGIN_API_H

#if defined(CTRL_STATUS_H) || defined(CTRL_LOG_H) || defined(CTRL_CONFIG_H) || defined(CTRL_CTRL_H)
#error                                                                                                       \
    "ctrl/plugin_api.h: status.h, log.h, config.h and ctrl.h declare libctrl's functions for its users; a plugin includes plugin_api.h (and kind headers) only"
#endif

#include "attention.h"
#include "memory.h"
#include "optimizer.h"
#include "plugin.h"
#include "reward.h"
#include "trainer.h"

/* The plugin's copy of the host pointer. Hidden, so that plugins loaded side by side never share
 * it; linked into a test program (CTRL_PLUGIN_STATIC_NAME=foo) it is named ctrl_api_foo. */
#ifdef CTRL_PLUGIN_STATIC_NAME
#define ctrl_api CTRL_PLUGIN_CAT(ctrl_api_, CTRL_PLUGIN_STATIC_NAME)
#endif
#if defined(__GNUC__)
#define CTRL_PLUGIN_API_HIDDEN __attribute__((visibility("hidden")))
#define CTRL_PLUGIN_API_UNUSED __attribute__((unused))
#else
#define CTRL_PLUGIN_API_HIDDEN
#define CTRL_PLUGIN_API_UNUSED
#endif
#ifdef __cplusplus
#define CTRL_PLUGIN_API_LINKAGE extern "C"
#else
#define CTRL_PLUGIN_API_LINKAGE extern
#endif

CTRL_PLUGIN_API_LINKAGE CTRL_PLUGIN_API_HIDDEN const ctrl_host *ctrl_api;

/* Defines the pointer and ctrl_plugin_api_init, the init callback that keeps the host -- after
 * refusing a host table smaller than the one this plugin was built against (an older ctrl lacks
 * functions the macros below may call). */
#define CTRL_PLUGIN_API_DEFINE                                                                               \
    CTRL_PLUGIN_API_HIDDEN const ctrl_host *ctrl_api = 0;                                                    \
    static CTRL_PLUGIN_API_UNUSED ctrl_status ctrl_plugin_api_init(const ctrl_host *host) {                  \
        if (host->size < sizeof(ctrl_host))                                                                  \
            return host->error_set(CTRL_ERR_PLUGIN,                                                          \
                                   "built against a newer ctrl (host table of %zu bytes; this ctrl "         \
                                   "lends %zu): rebuild the plugin against these headers",                   \
                                   sizeof(ctrl_host), host->size);                                           \
        ctrl_api = host;                                                                                     \
        return CTRL_OK;                                                                                      \
    }                                                                                                        \
    typedef int ctrl_plugin_api_defined_ /* so the macro takes a semicolon */
#define CTRL_PLUGIN_API_SET(host) (ctrl_api = (host))

/* The services, as libctrl's users call them. */
#define ctrl_log ctrl_api->log
#define ctrl_error_set ctrl_api->error_set
#define ctrl_error_wrap ctrl_api->error_wrap
/* A declared option's validated value; the first failure sticks in *status (see ctrl_host). */
#define ctrl_option_string ctrl_api->option_string
#define ctrl_option_int ctrl_api->option_int
#define ctrl_option_float ctrl_api->option_float
#define ctrl_option_bool ctrl_api->option_bool
/* For keys no option table declares (another section's, ...): NULL / the fallback when absent. */
#define ctrl_config_get_string ctrl_api->config_get_string
#define ctrl_config_get_int ctrl_api->config_get_int
#define ctrl_config_get_float ctrl_api->config_get_float
#define ctrl_config_get_bool ctrl_api->config_get_bool
/* Reward models loaded and run by the core (see ctrl_host). */
#define ctrl_score_model_open ctrl_api->score_model_open
#define ctrl_score_model_score ctrl_api->score_model_score
#define ctrl_score_model_close ctrl_api->score_model_close
#define ctrl_score_model_chat_text ctrl_api->score_model_chat_text

#include <string.h>

/* A CHOICE option's value as its index in `names` (NULL-terminated, in the order of the option's
 * `choices`); -1, with *status set as the readers do, when the value is none of them. */
static inline int ctrl_option_choice(const ctrl_config *cfg, const char *section, const char *key,
                                     const char *const *names, ctrl_status *status) {
    const char *v = ctrl_option_string(cfg, section, key, status);
    for (int i = 0; v && names[i]; i++)
        if (!strcmp(v, names[i])) return i;
    if (*status == CTRL_OK)
        *status = ctrl_error_set(CTRL_ERR_CONFIG, "[%s] %s = %s: not a choice", section, key, v);
    return -1;
}

#endif
