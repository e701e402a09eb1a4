/* The `accuracy` reward: 1.0 when the completion's final answer equals the solution column's, else
 * 0.0; NaN when the row has no such column or its solution holds no answer (TRL's None). The
 * answer of a text is the content of its last \boxed{...} (nested braces kept), else what follows
 * its last "####" (GSM8K), else its last number; numbers may carry a sign, thousands commas,
 * decimals, a fraction a/b or \frac{a}{b}, a trailing % (a hundredth), and compare as values;
 * anything else compares as text without spaces and `$`. This is math_verify's default parse of
 * both sides (tests/reference/make_reward_fixtures.py checks it case by case); TRL's own
 * accuracy_reward parses the completion more strictly (it requires \boxed or a LaTeX anchor, so a
 * bare "39" scores 0 there) and agrees on boxed answers. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/plugin_api.h>

CTRL_PLUGIN_API_DEFINE;

struct ctrl_reward {
    char column[128];
};

typedef struct answer {
    int ok, numeric;
    double value;
    char text[256];
} answer;

/* The number starting at s (sign, digits with commas, decimals, a/b, %); its end in *end. */
static int parse_number(const char *s, double *v, const char **end) {
    const char *p = s;
    int neg = 0;
    if (*p == '-' || *p == '+') neg = *p++ == '-';
    if (!isdigit((unsigned char)*p) && !(*p == '.' && isdigit((unsigned char)p[1]))) return 0;
    char digits[128];
    int n = 0;
    while ((isdigit((unsigned char)*p) || (*p == ',' && isdigit((unsigned char)p[1]))) && n < 100)
        if (*p++ != ',') digits[n++] = p[-1];
    if (*p == '.' && isdigit((unsigned char)p[1])) {
        digits[n++] = *p++;
        while (isdigit((unsigned char)*p) && n < 120) digits[n++] = *p++;
    }
    digits[n] = '\0';
    double x = strtod(digits, NULL);
    if (*p == '/' && isdigit((unsigned char)p[1])) {
        const double d = strtod(p + 1, (char **)&p);
        if (d == 0) return 0;
        x /= d;
    }
    if (*p == '%') x /= 100, p++;
    *v = neg ? -x : x, *end = p;
    return 1;
}

/* The brace-balanced group starting at s ('{'): copies its inside, returns the text after it. */
static const char *brace_group(const char *s, char *out, size_t cap) {
    if (*s != '{') return NULL;
    int depth = 0;
    size_t n = 0;
    for (const char *p = s; *p; p++) {
        if (*p == '{' && depth++ == 0) continue;
        if (*p == '}' && --depth == 0) {
            out[n < cap ? n : cap - 1] = '\0';
            return p + 1;
        }
        if (n + 1 < cap) out[n++] = *p;
    }
    return NULL;
}

/* \frac{a}{b} or \dfrac{a}{b} of two plain numbers starting at s; its end in *end. */
static int parse_frac(const char *s, double *v, const char **end) {
    const char *f = !strncmp(s, "\\frac", 5) ? s + 5 : !strncmp(s, "\\dfrac", 6) ? s + 6 : NULL;
    char num[128], den[128];
    const char *rest = f ? brace_group(f, num, sizeof num) : NULL, *e;
    if (!rest || !(rest = brace_group(rest, den, sizeof den))) return 0;
    double x, y;
    if (!parse_number(num, &x, &e) || *e || !parse_number(den, &y, &e) || *e || y == 0) return 0;
    *v = x / y, *end = rest;
    return 1;
}

/* A candidate answer string to a value or normalized text. */
static void interpret(const char *raw, answer *a) {
    char t[256];
    size_t n = 0;
    for (const char *p = raw; *p && n + 1 < sizeof t; p++)
        if (!isspace((unsigned char)*p) && *p != '$') t[n++] = *p;
    t[n] = '\0';
    if (!n) return;
    a->ok = 1;
    snprintf(a->text, sizeof a->text, "%s", t);
    const char *end;
    double v;
    if (parse_frac(t, &v, &end) && !*end) {
        a->numeric = 1, a->value = v;
        return;
    }
    if (parse_number(t, &v, &end) && (!*end || !strcmp(end, "."))) a->numeric = 1, a->value = v;
}

/* The final answer of a text: last \boxed{...}, else after the last "####", else the last number. */
static void extract(const char *text, answer *a) {
    memset(a, 0, sizeof *a);
    const char *box = NULL;
    for (const char *p = strstr(text, "\\boxed"); p; p = strstr(p + 1, "\\boxed")) box = p;
    char inner[256];
    if (box && brace_group(box + 6, inner, sizeof inner)) {
        interpret(inner, a);
        return;
    }
    const char *hash = NULL;
    for (const char *p = strstr(text, "####"); p; p = strstr(p + 1, "####")) hash = p;
    const char *from = hash ? hash + 4 : text;
    double v, last = 0;
    int found = 0;
    for (const char *p = from; *p;) {
        const char *end;
        const int boundary = p == text || !isalnum((unsigned char)p[-1]);
        if (parse_frac(p, &v, &end) || (boundary && parse_number(p, &v, &end))) {
            last = v, found = 1, p = end;
            continue;
        }
        p++;
    }
    if (found) a->ok = 1, a->numeric = 1, a->value = last;
}

static int same(const answer *x, const answer *y) {
    if (x->numeric && y->numeric) return fabs(x->value - y->value) <= 1e-6 * fmax(1.0, fabs(y->value));
    return !x->numeric && !y->numeric && !strcmp(x->text, y->text);
}

/* The column's JSON text: a string's content, or a number as written. -1 when out of memory. */
static int gold_of(const char *json, answer *a) {
    memset(a, 0, sizeof *a);
    if (!json) return 0;
    if (json[0] != '"') {
        extract(json, a);
        return 0;
    }
    char *s = malloc(strlen(json) + 1);
    if (!s) return -1;
    size_t n = 0;
    for (const char *p = json + 1; *p && *p != '"'; p++) {
        if (*p == '\\' && p[1]) {
            p++;
            s[n++] = *p == 'n' ? '\n' : *p == 't' ? '\t' : *p; /* \\ \" \/ and the two whitespace escapes */
        } else {
            s[n++] = *p;
        }
    }
    s[n] = '\0';
    extract(s, a);
    free(s);
    return 0;
}

/* [section] column, checked (create, and check_options when the config is validated). */
static ctrl_status read_column(const ctrl_config *cfg, const char *section, const char **col) {
    ctrl_status st = CTRL_OK;
    *col = ctrl_option_string(cfg, section, "column", &st);
    if (st != CTRL_OK) return st;
    if (!(*col)[0] || strlen(*col) >= sizeof((ctrl_reward *)0)->column)
        return ctrl_error_set(CTRL_ERR_CONFIG, "[%s] column: must name a dataset column (at most %zu bytes)",
                              section, sizeof((ctrl_reward *)0)->column - 1);
    return CTRL_OK;
}

static ctrl_status accuracy_check_options(const ctrl_config *cfg, const char *section) {
    const char *col;
    return read_column(cfg, section, &col);
}

static ctrl_status accuracy_create(const ctrl_host *host, const ctrl_config *cfg, const char *section,
                                   ctrl_reward **out) {
    (void)host; /* kept by init (plugin_api.h) */
    const char *col;
    ctrl_status st = read_column(cfg, section, &col);
    if (st != CTRL_OK) return st;
    ctrl_reward *r = calloc(1, sizeof *r);
    if (!r) return ctrl_error_set(CTRL_ERR_NOMEM, "reward accuracy: out of memory");
    snprintf(r->column, sizeof r->column, "%s", col);
    *out = r;
    return CTRL_OK;
}

static ctrl_status accuracy_score(ctrl_reward *r, const ctrl_reward_batch *b, float *out) {
    const ctrl_reward_column *col = NULL;
    for (int k = 0; k < b->n_columns; k++)
        if (!strcmp(b->columns[k].name, r->column)) col = &b->columns[k];
    for (int i = 0; i < b->n; i++) {
        answer gold, got;
        if (gold_of(col ? col->values[i] : NULL, &gold) != 0)
            return ctrl_error_set(CTRL_ERR_NOMEM, "reward accuracy: out of memory for a solution");
        if (!gold.ok) {
            out[i] = NAN; /* nothing to compare with: does not apply */
            continue;
        }
        extract(b->completions[i] ? b->completions[i] : "", &got);
        out[i] = got.ok && same(&got, &gold) ? 1.0f : 0.0f;
    }
    return CTRL_OK;
}

static void accuracy_destroy(ctrl_reward *r) { free(r); }

static const ctrl_reward_ops accuracy_ops = {
    .size = sizeof(ctrl_reward_ops),
    .create = accuracy_create,
    .score = accuracy_score,
    .destroy = accuracy_destroy,
};

static const ctrl_option accuracy_options[] = {
    {.key = "column",
     .type = CTRL_OPT_STRING,
     .default_value = "solution",
     .doc = "Dataset column holding the reference answer (text with an answer in it, or a number)."},
    CTRL_OPTION_END,
};

static const ctrl_plugin accuracy_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_REWARD,
    .name = "accuracy",
    .version = "0.1.0",
    .summary = "1 when the completion's final answer (\\boxed{}, ####, or last number) equals the solution's",
    .options = accuracy_options,
    .init = ctrl_plugin_api_init,
    .ops = &accuracy_ops,
    .check_options = accuracy_check_options,
};

CTRL_PLUGIN_DEFINE(&accuracy_plugin)
