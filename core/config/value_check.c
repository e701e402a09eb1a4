/* Checking one value against its declared option: type, range, choices. Messages name where the
 * value came from (file:line, --set or default), the section and the key. */
#include <stdio.h>
#include <string.h>

#include "config/config_internal.h"

/* A word of a '|'-separated list, for did-you-mean among choices. */
static int split_choices(const char *choices, char buf[][64], const char **out, int cap) {
    int n = 0;
    for (const char *p = choices; p && *p && n < cap;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len >= 64) len = 63;
        memcpy(buf[n], p, len);
        buf[n][len] = '\0';
        out[n] = buf[n];
        n++;
        p = bar ? bar + 1 : NULL;
    }
    return n;
}

static void choices_text(const char *choices, char *out, size_t cap) {
    snprintf(out, cap, "%s", choices);
    for (char *c = out; *c; c++)
        if (*c == '|') *c = ',';
}

static ctrl_status bad_choice(const config_entry *e, const char *word, const char *choices) {
    char buf[64][64];
    const char *names[64];
    int n = split_choices(choices, buf, names, 64);
    const char *s = config_suggest(word, names, n);
    char list[1024];
    choices_text(choices, list, sizeof list);
    char hint[160] = "";
    if (s) snprintf(hint, sizeof hint, " (did you mean '%s'?)", s);
    return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s = '%s': expected one of %s%s", e->where, e->section,
                          e->key, word, list, hint);
}

static ctrl_status check_range(const config_entry *e, const ctrl_option *o, double v) {
    int lo_bad = (o->flags & CTRL_OPT_HAS_MIN) && ((o->flags & CTRL_OPT_MIN_OPEN) ? v <= o->min : v < o->min);
    int hi_bad = (o->flags & CTRL_OPT_HAS_MAX) && ((o->flags & CTRL_OPT_MAX_OPEN) ? v >= o->max : v > o->max);
    if (!lo_bad && !hi_bad) return CTRL_OK;
    char range[128];
    if ((o->flags & CTRL_OPT_HAS_MIN) && (o->flags & CTRL_OPT_HAS_MAX))
        snprintf(range, sizeof range, "%s%g, %g%s", (o->flags & CTRL_OPT_MIN_OPEN) ? "(" : "[", o->min,
                 o->max, (o->flags & CTRL_OPT_MAX_OPEN) ? ")" : "]");
    else if (o->flags & CTRL_OPT_HAS_MIN)
        snprintf(range, sizeof range, "%s %g", (o->flags & CTRL_OPT_MIN_OPEN) ? ">" : ">=", o->min);
    else
        snprintf(range, sizeof range, "%s %g", (o->flags & CTRL_OPT_MAX_OPEN) ? "<" : "<=", o->max);
    return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s = %s: out of range (must be %s)", e->where,
                          e->section, e->key, e->value, range);
}

ctrl_status config_check_value(const config_entry *e, const ctrl_option *o) {
    const char *v = e->value;
    switch (o->type) {
    case CTRL_OPT_INT: {
        int64_t x;
        double f;
        int r = config_parse_int(v, &x);
        if (r == -2)
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s = %s: too large for a 64-bit integer",
                                  e->where, e->section, e->key, v);
        if (r != 0) {
            if (config_parse_float(v, &f) == 0)
                return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s = %s: expected a whole number", e->where,
                                      e->section, e->key, v);
            if (!v[0])
                return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s: empty value; expected an integer",
                                      e->where, e->section, e->key);
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s = '%s': expected an integer", e->where,
                                  e->section, e->key, v);
        }
        return check_range(e, o, (double)x);
    }
    case CTRL_OPT_FLOAT: {
        double x;
        int r = config_parse_float(v, &x);
        if (r == -2)
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s = %s: not a finite number", e->where,
                                  e->section, e->key, v);
        if (r != 0 && !v[0])
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s: empty value; expected a number", e->where,
                                  e->section, e->key);
        if (r != 0)
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s = '%s': expected a number", e->where,
                                  e->section, e->key, v);
        return check_range(e, o, x);
    }
    case CTRL_OPT_BOOL: {
        bool b;
        if (config_parse_bool(v, &b) != 0)
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s = '%s': expected true or false", e->where,
                                  e->section, e->key, v);
        return CTRL_OK;
    }
    case CTRL_OPT_CHOICE: return config_choice_ok(o->choices, v) ? CTRL_OK : bad_choice(e, v, o->choices);
    case CTRL_OPT_LIST: {
        if (!o->choices) return CTRL_OK;
        char w[128];
        int r;
        for (const char *pos = v; (r = config_list_next(&pos, w, sizeof w)) != 0;) {
            if (r < 0)
                return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s: a list item is too long", e->where,
                                      e->section, e->key);
            if (!config_choice_ok(o->choices, w)) return bad_choice(e, w, o->choices);
        }
        return CTRL_OK;
    }
    case CTRL_OPT_PATH:
        if (!v[0])
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s: empty path", e->where, e->section, e->key);
        return CTRL_OK;
    case CTRL_OPT_STRING: /* any text, unless the option declares its words (held to them: never ignored) */
        return !o->choices || config_choice_ok(o->choices, v) ? CTRL_OK : bad_choice(e, v, o->choices);
    }
    return CTRL_OK;
}
