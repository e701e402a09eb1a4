/* Logging to stderr: "HH:MM:SS.mmm LEVEL [prefix]message". The prefix hook lets distributed runs
 * add the rank without the callers knowing about it. */
#include <ctrl/log.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static ctrl_log_level current_level = CTRL_LOG_INFO;
static ctrl_log_prefix_fn prefix_fn;
static void *prefix_user;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const level_names[] = {"trace", "debug", "info", "warn", "error", "off"};

void ctrl_log_set_level(ctrl_log_level level) { current_level = level; }
ctrl_log_level ctrl_log_get_level(void) { return current_level; }

int ctrl_log_level_parse(const char *name, ctrl_log_level *out) {
    for (int i = 0; i <= CTRL_LOG_OFF; i++) {
        if (strcasecmp(name, level_names[i]) == 0) {
            *out = (ctrl_log_level)i;
            return 0;
        }
    }
    if (strcasecmp(name, "warning") == 0) {
        *out = CTRL_LOG_WARN;
        return 0;
    }
    return -1;
}

const char *ctrl_log_level_name(ctrl_log_level level) {
    return (level >= 0 && level <= CTRL_LOG_OFF) ? level_names[level] : "?";
}

void ctrl_log_set_prefix(ctrl_log_prefix_fn fn, void *user) {
    prefix_fn = fn;
    prefix_user = user;
}

void ctrl_logv(ctrl_log_level level, const char *fmt, va_list ap) {
    if (level < current_level || level >= CTRL_LOG_OFF) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    char prefix[128] = "";
    if (prefix_fn) prefix_fn(prefix, (int)sizeof prefix, prefix_user);
    char msg[4096];
    vsnprintf(msg, sizeof msg, fmt, ap);
    static const char *const tags[] = {"TRACE", "DEBUG", "INFO ", "WARN ", "ERROR"};
    pthread_mutex_lock(&log_lock);
    fprintf(stderr, "%02d:%02d:%02d.%03ld %s %s%s\n", tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
            tags[level], prefix, msg);
    fflush(stderr);
    pthread_mutex_unlock(&log_lock);
}

void ctrl_log(ctrl_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ctrl_logv(level, fmt, ap);
    va_end(ap);
}
