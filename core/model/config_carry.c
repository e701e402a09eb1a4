/* config.json carried over from the model a saved model was loaded from: the source's text, byte for
 * byte, with only the fields the saved model changed rewritten in place (its dtype; architectures
 * when the head changed; id2label, label2id and pad_token_id of a sequence classifier; a size the
 * model no longer has). Every other key -- those ctrl does not read included, eos_token_id lists,
 * number spellings (10000.0 stays a float), key order, indentation -- is the source's. A key that
 * must be added goes where sort_keys would put it when the source is sorted (as transformers
 * writes it), else at the end. The top-level object is scanned as text; values are skipped by
 * their JSON syntax (strings with escapes, nested brackets), never re-printed. */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

#define MAX_MEMBERS 512
#define MAX_EDITS 16

typedef struct member {
    size_t lead;   /* just after the ',' or '{' before the key: the whitespace that leads it */
    size_t key;    /* the key's opening quote */
    size_t vb, ve; /* the value: [vb, ve) */
    char name[64]; /* the key (truncated: only short keys are looked for) */
} member;

typedef struct edit {
    size_t pos, del; /* replace [pos, pos + del) */
    char *text;      /* malloc'd */
    int seq;         /* the order edits at one position were made in */
} edit;

typedef struct carry {
    const char *src;
    size_t len;
    member m[MAX_MEMBERS];
    int n;
    size_t close; /* the top-level object's closing brace */
    edit e[MAX_EDITS];
    int n_edits;
    int ok; /* no allocation failed */
} carry;

static size_t skip_ws(const char *s, size_t i, size_t n) {
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

/* Past the string starting at s[i] (a quote); 0 when unterminated. */
static size_t skip_string(const char *s, size_t i, size_t n) {
    for (i++; i < n; i++) {
        if (s[i] == '\\')
            i++;
        else if (s[i] == '"')
            return i + 1;
    }
    return 0;
}

/* Past the value starting at s[i]; 0 when malformed. */
static size_t skip_value(const char *s, size_t i, size_t n) {
    if (i >= n) return 0;
    if (s[i] == '"') return skip_string(s, i, n);
    if (s[i] == '{' || s[i] == '[') {
        int depth = 0;
        for (; i < n; i++) {
            if (s[i] == '"') {
                const size_t j = skip_string(s, i, n);
                if (!j) return 0;
                i = j - 1;
            } else if (s[i] == '{' || s[i] == '[') {
                depth++;
            } else if (s[i] == '}' || s[i] == ']') {
                if (--depth == 0) return i + 1;
            }
        }
        return 0;
    }
    const size_t b = i; /* a number, true, false, null */
    while (i < n && !strchr(",}] \t\r\n", s[i])) i++;
    return i > b ? i : 0;
}

/* The members of the top-level object; 0 when the text is not one the scanner follows. */
static int scan(carry *c) {
    const char *s = c->src;
    const size_t n = c->len;
    size_t i = skip_ws(s, 0, n);
    if (i >= n || s[i] != '{') return 0;
    size_t lead = ++i;
    i = skip_ws(s, i, n);
    if (i < n && s[i] == '}') return 0; /* an empty object: nothing to carry */
    for (;;) {
        if (c->n == MAX_MEMBERS || i >= n || s[i] != '"') return 0;
        member *m = &c->m[c->n++];
        m->lead = lead, m->key = i;
        const size_t ke = skip_string(s, i, n);
        if (!ke) return 0;
        snprintf(m->name, sizeof m->name, "%.*s", (int)(ke - i - 2), s + i + 1);
        i = skip_ws(s, ke, n);
        if (i >= n || s[i] != ':') return 0;
        m->vb = i = skip_ws(s, i + 1, n);
        if (!(m->ve = skip_value(s, i, n))) return 0;
        i = skip_ws(s, m->ve, n);
        if (i < n && s[i] == ',') {
            lead = i + 1;
            i = skip_ws(s, i + 1, n);
            continue;
        }
        if (i < n && s[i] == '}') {
            c->close = i;
            return 1;
        }
        return 0;
    }
}

static const member *find(const carry *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->m[i].name, name)) return &c->m[i];
    return NULL;
}

static void add_edit(carry *c, size_t pos, size_t del, const char *text) {
    char *t = strdup(text);
    if (!t || c->n_edits == MAX_EDITS) {
        free(t);
        c->ok = 0;
        return;
    }
    c->e[c->n_edits] = (edit){pos, del, t, c->n_edits};
    c->n_edits++;
}

/* The whitespace that leads the members ("\n  " in transformers' files; "" in a minified one). */
static void lead_of(const carry *c, char *out, size_t cap) {
    const member *m = &c->m[c->n > 1 ? 1 : 0];
    snprintf(out, cap, "%.*s", (int)(m->key - m->lead), c->src + m->lead);
}

/* Sets top-level `name` to the JSON text `value`: in place when the source has it, else inserted in
 * sorted position (when the source's keys are sorted) or at the end. */
static void set_value(carry *c, const char *name, const char *value) {
    const member *m = find(c, name);
    if (m) {
        add_edit(c, m->vb, m->ve - m->vb, value);
        return;
    }
    char lead[64], text[8192];
    lead_of(c, lead, sizeof lead);
    int sorted = 1;
    for (int i = 1; i < c->n && sorted; i++) sorted = strcmp(c->m[i - 1].name, c->m[i].name) < 0;
    for (int i = 0; sorted && i < c->n; i++)
        if (strcmp(name, c->m[i].name) < 0) {
            snprintf(text, sizeof text, "\"%s\": %s,%s", name, value, lead);
            add_edit(c, c->m[i].key, 0, text);
            return;
        }
    snprintf(text, sizeof text, ",%s\"%s\": %s", lead, name, value);
    add_edit(c, c->m[c->n - 1].ve, 0, text);
}

/* The source's value of `name`, parsed (NULL when absent or not JSON). */
static cJSON *value_of(const carry *c, const char *name) {
    const member *m = find(c, name);
    return m ? cJSON_ParseWithLength(c->src + m->vb, m->ve - m->vb) : NULL;
}

/* A nested value's lines indented one level below the members ("" between items when minified). */
static void nested(const carry *c, char *nl, size_t cap, char *close, size_t ccap) {
    char lead[64];
    lead_of(c, lead, sizeof lead);
    snprintf(nl, cap, "%s%s", lead, lead[0] ? "  " : "");
    snprintf(close, ccap, "%s", lead);
}

static void set_int_if_changed(carry *c, const char *name, long want) {
    cJSON *v = value_of(c, name);
    if (v && cJSON_IsNumber(v) && v->valuedouble != (double)want) {
        char text[32];
        snprintf(text, sizeof text, "%ld", want);
        set_value(c, name, text);
    }
    cJSON_Delete(v);
}

static void carry_classifier(carry *c, const ctrl_model_config *cfg) {
    cJSON *id2label = value_of(c, "id2label");
    const int same = cJSON_IsObject(id2label) && cJSON_GetArraySize(id2label) == cfg->num_labels;
    cJSON_Delete(id2label);
    if (!same) { /* transformers' default names, LABEL_i */
        char nl[80], close[64], a[4096], b[4096];
        nested(c, nl, sizeof nl, close, sizeof close);
        size_t la = (size_t)snprintf(a, sizeof a, "{"), lb = (size_t)snprintf(b, sizeof b, "{");
        for (int i = 0; i < cfg->num_labels && i < 64; i++) {
            la += (size_t)snprintf(a + la, sizeof a - la, "%s%s\"%d\": \"LABEL_%d\"", i ? "," : "", nl, i, i);
            lb += (size_t)snprintf(b + lb, sizeof b - lb, "%s%s\"LABEL_%d\": %d", i ? "," : "", nl, i, i);
        }
        snprintf(a + la, sizeof a - la, "%s}", close);
        snprintf(b + lb, sizeof b - lb, "%s}", close);
        set_value(c, "id2label", a);
        set_value(c, "label2id", b);
    }
    set_int_if_changed(c, "num_labels", cfg->num_labels);
    cJSON *pad = value_of(c, "pad_token_id");
    if (cfg->pad_token_id >= 0 && !(cJSON_IsNumber(pad) && pad->valuedouble == cfg->pad_token_id)) {
        char text[32];
        snprintf(text, sizeof text, "%d", cfg->pad_token_id);
        set_value(c, "pad_token_id", text);
    }
    cJSON_Delete(pad);
}

static int cmp_edit(const void *a, const void *b) {
    const edit *x = a, *y = b;
    if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
    return x->seq - y->seq;
}

char *model_config_carried(const char *source, const ctrl_model_config *cfg, const char *arch_class,
                           const char *dtype_name) {
    cJSON *check = cJSON_Parse(source);
    const int valid = cJSON_IsObject(check);
    cJSON_Delete(check);
    carry *c = calloc(1, sizeof *c);
    if (!valid || !c) {
        free(c);
        return NULL;
    }
    c->src = source, c->len = strlen(source), c->ok = 1;
    char *out = NULL;
    if (scan(c)) {
        char text[256], nl[80], close[64];
        snprintf(text, sizeof text, "\"%s\"", dtype_name);
        int had = 0;
        static const char *const dtype_keys[] = {"dtype", "torch_dtype"}; /* transformers 5 and 4 */
        for (int k = 0; k < 2; k++) {
            cJSON *v = value_of(c, dtype_keys[k]);
            if (find(c, dtype_keys[k])) had = 1;
            if (find(c, dtype_keys[k]) && !(cJSON_IsString(v) && !strcmp(v->valuestring, dtype_name)))
                set_value(c, dtype_keys[k], text);
            cJSON_Delete(v);
        }
        if (!had) set_value(c, "dtype", text);
        cJSON *archs = value_of(c, "architectures");
        const cJSON *first = cJSON_IsArray(archs) ? archs->child : NULL;
        if (!(first && !first->next && cJSON_IsString(first) && !strcmp(first->valuestring, arch_class))) {
            nested(c, nl, sizeof nl, close, sizeof close);
            snprintf(text, sizeof text, "[%s\"%s\"%s]", nl, arch_class, close);
            set_value(c, "architectures", text);
        }
        cJSON_Delete(archs);
        if (cfg->num_labels > 0) carry_classifier(c, cfg);
        static const char *const sizes[] = {"hidden_size",         "intermediate_size",   "num_hidden_layers",
                                            "num_attention_heads", "num_key_value_heads", "vocab_size"};
        const long want[] = {cfg->hidden_size, cfg->intermediate_size, cfg->n_layers,
                             cfg->n_heads,     cfg->n_kv_heads,        cfg->vocab_size};
        for (int k = 0; k < 6; k++) set_int_if_changed(c, sizes[k], want[k]);
        qsort(c->e, (size_t)c->n_edits, sizeof *c->e, cmp_edit);
        size_t cap = c->len + 1;
        for (int i = 0; i < c->n_edits; i++) cap += strlen(c->e[i].text);
        out = c->ok ? malloc(cap) : NULL;
        size_t at = 0, o = 0;
        for (int i = 0; out && i < c->n_edits; i++) {
            memcpy(out + o, source + at, c->e[i].pos - at), o += c->e[i].pos - at;
            const size_t tl = strlen(c->e[i].text);
            memcpy(out + o, c->e[i].text, tl), o += tl;
            at = c->e[i].pos + c->e[i].del;
        }
        if (out) {
            memcpy(out + o, source + at, c->len - at), o += c->len - at;
            out[o] = '\0';
        }
    }
    for (int i = 0; i < c->n_edits; i++) free(c->e[i].text);
    free(c);
    return out;
}
