/* Validation problems reported together: a user who mistyped three keys learns of all three in
 * one run, in file order, instead of one per attempt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

void config_problem_note(config_problems *p, ctrl_status status) {
    if (p->n == 0) p->status = status;
    if (p->n < CONFIG_MAX_PROBLEMS) snprintf(p->text[p->n], sizeof p->text[0], "%s", ctrl_error_message());
    p->n++;
}

/* The line a message starts with ("FILE:LINE: ..."), or a number past every line for messages of
 * --set overrides and of the file as a whole, which then keep the order they were found in. */
static long message_line(const char *msg, const char *file_name) {
    size_t n = strlen(file_name);
    if (strncmp(msg, file_name, n) != 0 || msg[n] != ':') return 1L << 40;
    char *end;
    long line = strtol(msg + n + 1, &end, 10);
    return (end != msg + n + 1 && *end == ':') ? line : 1L << 40;
}

ctrl_status config_problems_report(config_problems *p, const char *file_name) {
    if (p->n == 0) return CTRL_OK;
    int kept = p->n < CONFIG_MAX_PROBLEMS ? p->n : CONFIG_MAX_PROBLEMS;
    int order[CONFIG_MAX_PROBLEMS];
    long line[CONFIG_MAX_PROBLEMS];
    for (int i = 0; i < kept; i++) {
        order[i] = i;
        line[i] = message_line(p->text[i], file_name);
    }
    for (int i = 1; i < kept; i++) /* insertion sort: stable, and there are at most a few */
        for (int j = i; j > 0 && line[order[j - 1]] > line[order[j]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    char out[3800];
    size_t len = 0;
    int shown = 0;
    for (int i = 0; i < kept; i++) {
        const char *t = p->text[order[i]];
        size_t tl = strlen(t);
        if (len + tl + 2 > sizeof out - 64) break;
        if (len) out[len++] = '\n';
        memcpy(out + len, t, tl);
        len += tl;
        shown++;
    }
    out[len] = '\0';
    if (p->n > shown)
        snprintf(out + len, sizeof out - len, "\n(and %d more problem%s)", p->n - shown,
                 p->n - shown == 1 ? "" : "s");
    return ctrl_error_set(p->status, "%s", out);
}
