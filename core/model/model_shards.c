/* The weights of a saved model as transformers' save_pretrained writes them for a model
 * from_pretrained loaded (what a trainer saves): the tensors in the order of its state_dict, cut into shards
 * of at most max_shard_size bytes the way huggingface_hub's split_state_dict_into_shards cuts them (in that
 * order, a new shard when the next tensor would overflow the current one, a tensor larger than the limit
 * alone in its own), written as model.safetensors when one shard holds everything, else as
 * model-0000K-of-0000N.safetensors with model.safetensors.index.json ({"metadata": {"total_parameters",
 * "total_size"}, "weight_map"}, two-space indented, keys sorted, as transformers writes it). Weight
 * files of an earlier save in the directory that this one does not replace are removed (as
 * save_pretrained cleans them), so that the loader never mixes two saves. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "model/model_internal.h"
#include "model/safetensors.h"

ctrl_status ctrl_parse_shard_size(const char *text, int64_t *bytes) {
    static const struct {
        const char *unit;
        double scale;
    } units[] = {{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}}; /* huggingface_hub's SIZE_UNITS */
    const size_t n = text ? strlen(text) : 0;
    char *end;
    if (n && strspn(text, "0123456789") == n) { /* a plain integer: bytes, as an int max_shard_size */
        errno = 0;
        const long long v = strtoll(text, &end, 10);
        if (errno || v <= 0) return ctrl_error_set(CTRL_ERR_CONFIG, "'%s': expected a positive size", text);
        *bytes = v;
        return CTRL_OK;
    }
    for (size_t u = 0; n > 2 && u < sizeof units / sizeof units[0]; u++) {
        if (toupper((unsigned char)text[n - 2]) != units[u].unit[0] ||
            toupper((unsigned char)text[n - 1]) != units[u].unit[1])
            continue;
        char num[64];
        if (n - 2 >= sizeof num) break;
        memcpy(num, text, n - 2), num[n - 2] = '\0';
        const double v = strtod(num, &end);
        while (*end == ' ') end++;
        if (end == num || *end || !(v > 0) || v * units[u].scale >= 9.2e18) break;
        *bytes = (int64_t)(v * units[u].scale); /* int(value * multiplier): truncated, as Python's */
        if (*bytes > 0) return CTRL_OK;
        break;
    }
    return ctrl_error_set(CTRL_ERR_CONFIG,
                          "'%s': expected a size such as 5GB, 500MB or 200KB (units TB, GB, MB, KB of "
                          "10^12 .. 10^3 bytes, as transformers' max_shard_size), or a number of bytes",
                          text ? text : "");
}

/* One dot-separated part of a tensor name as transformers' dot_natural_key reads it: all digits,
 * a number (before any word); else a word, with its trailing digits as a number after it. */
typedef struct name_part {
    int word;               /* 0: a number */
    const char *text;       /* the word without its trailing digits */
    size_t len;             /* of text */
    unsigned long long num; /* the number, or the word's trailing digits */
    int has_num;            /* a word with trailing digits */
} name_part;

static const char *next_part(const char *s, name_part *p) {
    const size_t n = strcspn(s, ".");
    size_t digits = 0;
    while (digits < n && s[n - 1 - digits] >= '0' && s[n - 1 - digits] <= '9') digits++;
    p->word = digits<n, p->text = s, p->len = n - digits, p->has_num = digits> 0;
    p->num = digits ? strtoull(s + n - digits, NULL, 10) : 0;
    return s[n] ? s + n + 1 : NULL;
}

/* The order of transformers' state_dict when it saves a model from_pretrained loaded (the model a
 * trainer saves): revert_weight_conversion sorts the names by dot_natural_key -- the parts compared
 * in turn, numbers numerically and before words, words as strings then by their trailing digits
 * (a word without them first), a name that is a prefix of another first. */
static int cmp_natural(const char *a, const char *b) {
    while (a && b) {
        name_part x, y;
        a = next_part(a, &x), b = next_part(b, &y);
        if (x.word != y.word) return x.word - y.word;
        if (!x.word) {
            if (x.num != y.num) return x.num < y.num ? -1 : 1;
            continue;
        }
        const size_t m = x.len < y.len ? x.len : y.len;
        const int c = memcmp(x.text, y.text, m);
        if (c) return c;
        if (x.len != y.len) return x.len < y.len ? -1 : 1;
        if (x.has_num != y.has_num) return x.has_num - y.has_num;
        if (x.num != y.num) return x.num < y.num ? -1 : 1;
    }
    return a ? 1 : b ? -1 : 0;
}

/* A tensor's place: its name as transformers 5 holds it while the model is loaded (the key sorted),
 * then, for an expert's tensor, its projection (gate, up) and expert. transformers 5 keeps each MoE
 * layer's experts fused under mlp.experts.{gate_up_proj, down_proj} and the router as mlp.gate
 * (Mixtral's block_sparse_moe too), and splits the experts back per expert when it saves: all the
 * experts' down_proj (w2), then their gate_proj (w1), then their up_proj (w3), then the router. */
typedef struct ordered {
    char key[96];
    int part, expert;
    int index; /* the view */
} ordered;

static void order_key(ordered *o, const char *name) {
    static const char *const projs[][2] = {{"gate_proj", "w1"}, {"up_proj", "w3"}, {"down_proj", "w2"}};
    int layer, expert, used = 0;
    char block[32], proj[32];
    o->part = o->expert = 0;
    if (sscanf(name, "model.layers.%d.%31[a-z_].experts.%d.%31[a-z0-9_].weight%n", &layer, block, &expert,
               proj, &used) == 4 &&
        !name[used])
        for (int p = 0; p < 3; p++)
            if (!strcmp(proj, projs[p][0]) || !strcmp(proj, projs[p][1])) {
                snprintf(o->key, sizeof o->key, "model.layers.%d.mlp.experts.%s", layer,
                         p == 2 ? "down_proj" : "gate_up_proj");
                o->part = p == 1, o->expert = expert;
                return;
            }
    const char *moe = strstr(name, ".block_sparse_moe.");
    if (moe)
        snprintf(o->key, sizeof o->key, "%.*s.mlp.%s", (int)(moe - name), name, moe + 18);
    else
        snprintf(o->key, sizeof o->key, "%s", name);
}

static int cmp_ordered(const void *a, const void *b) {
    const ordered *x = a, *y = b;
    const int c = cmp_natural(x->key, y->key);
    if (c) return c;
    if (x->part != y->part) return x->part - y->part;
    return x->expert - y->expert;
}

/* Removes DIR's weight files of an earlier save that this one (its files in `keep`) does not
 * replace: shards of another count or a model.safetensors when sharding, the index and the shards
 * when not. The index is left alone when `keep_index` (it is rewritten after). */
static ctrl_status remove_stale(const char *dir, char (*keep)[48], int n_keep, int keep_index) {
    DIR *d = opendir(dir);
    if (!d) return ctrl_error_set(CTRL_ERR_IO, "%s: %s", dir, strerror(errno));
    ctrl_status st = CTRL_OK;
    for (struct dirent *e; (e = readdir(d)) && st == CTRL_OK;) {
        unsigned a, b;
        int used = 0;
        const int shard = sscanf(e->d_name, "model-%5u-of-%5u.safetensors%n", &a, &b, &used) == 2 &&
                          used == (int)strlen(e->d_name);
        const int stale = shard || !strcmp(e->d_name, "model.safetensors") ||
                          (!keep_index && !strcmp(e->d_name, "model.safetensors.index.json"));
        int kept = 0;
        for (int i = 0; i < n_keep && !kept; i++) kept = !strcmp(keep[i], e->d_name);
        if (!stale || kept) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0 && errno != ENOENT)
            st = ctrl_error_set(CTRL_ERR_IO, "%s: cannot remove a weight file of an earlier save: %s", path,
                                strerror(errno));
    }
    closedir(d);
    return st;
}

typedef struct named {
    const char *name;
    const char *file;
} named;

static int cmp_named(const void *a, const void *b) {
    return strcmp(((const named *)a)->name, ((const named *)b)->name);
}

/* model.safetensors.index.json as transformers writes it: json.dumps(index, indent=2,
 * sort_keys=True) and a newline. Tensor names are plain identifiers (no escaping needed). */
static char *index_json(ctrl_model *m, const ordered *ord, const int *shard_of, int k, char (*files)[48],
                        int64_t total_params, int64_t total_bytes) {
    named *by_name = malloc(sizeof *by_name * (size_t)(k ? k : 1));
    const size_t cap = 256 + (size_t)k * (sizeof(((ctrl_param_view *)0)->name) + 48 + 16);
    char *text = malloc(cap);
    if (!by_name || !text) {
        free(by_name), free(text);
        return NULL;
    }
    for (int i = 0; i < k; i++)
        by_name[i] = (named){ctrl_model_view(m, ord[i].index)->name, files[shard_of[i]]};
    qsort(by_name, (size_t)k, sizeof *by_name, cmp_named);
    size_t len =
        (size_t)snprintf(text, cap,
                         "{\n  \"metadata\": {\n    \"total_parameters\": %lld,\n    \"total_size\": "
                         "%lld\n  },\n  \"weight_map\": {\n",
                         (long long)total_params, (long long)total_bytes);
    for (int i = 0; i < k; i++)
        len += (size_t)snprintf(text + len, cap - len, "    \"%s\": \"%s\"%s\n", by_name[i].name,
                                by_name[i].file, i + 1 < k ? "," : "");
    snprintf(text + len, cap - len, "  }\n}\n");
    free(by_name);
    return text;
}

void ctrl_model_set_save_fetch(ctrl_model *m,
                               ctrl_status (*fetch)(void *user, const float *data, int64_t numel),
                               void *user) {
    m->save_fetch = fetch, m->save_fetch_user = user;
}

ctrl_status model_save_fetch(void *user, const ctrl_st_write *t) {
    const ctrl_model *m = user;
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
    return m->save_fetch(m->save_fetch_user, t->data, numel);
}

ctrl_status model_save_shards(ctrl_model *m, const char *dir, ctrl_dtype dtype, int64_t max_shard) {
    if (m->nf4_w)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "model: the base is held in NF4 (QLoRA): only its adapter is saved");
    if (max_shard <= 0) return ctrl_error_set(CTRL_ERR_CONFIG, "model: max_shard_size must be positive");
    const int n = ctrl_model_view_count(m);
    const int64_t esz = (int64_t)ctrl_dtype_size(dtype);
    ordered *ord = calloc((size_t)n + 1, sizeof *ord);
    ctrl_st_write *w = calloc((size_t)n + 1, sizeof *w);
    int *shard_of = calloc((size_t)n + 1, sizeof *shard_of);
    char(*files)[48] = calloc((size_t)n + 1, sizeof *files);
    if (!ord || !w || !shard_of || !files) {
        free(ord), free(w), free(shard_of), free(files);
        return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", dir);
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        const ctrl_param_view *v = ctrl_model_view(m, i);
        if (v->lora) continue; /* the adapters are the adapter's (peft_save.c) */
        order_key(&ord[k], v->name);
        ord[k++].index = i;
    }
    qsort(ord, (size_t)k, sizeof *ord, cmp_ordered);
    /* huggingface_hub's split, in state_dict order: a block over the limit becomes a shard of its
     * own at once; the others fill the open shard, which is closed (numbered) when the next would
     * overflow it, and at the end. A block is a tensor, or one MoE layer's experts of one projection:
     * transformers saves those as views of one fused tensor, and the split keeps tensors that share
     * storage together, counting the storage once, where the first of them falls. */
    int n_shards = 0, first_open = 0, open = 0;
    int64_t cur = 0, total_bytes = 0, total_params = 0;
    for (int i = 0; i < k;) {
        int end = i + 1;
        while (end < k && ord[end].expert > ord[i].expert && ord[end].part == ord[i].part &&
               !strcmp(ord[end].key, ord[i].key))
            end++;
        int64_t bytes = 0;
        for (int j = i; j < end; j++) {
            const ctrl_param_view *v = ctrl_model_view(m, ord[j].index);
            bytes += v->numel * esz, total_params += v->numel;
        }
        total_bytes += bytes;
        if (bytes > max_shard) {
            for (int j = i; j < end; j++) shard_of[j] = n_shards;
            n_shards++, i = end;
            continue;
        }
        if (open && cur + bytes > max_shard) {
            for (int j = first_open; j < i; j++)
                if (shard_of[j] < 0) shard_of[j] = n_shards;
            n_shards++, cur = 0, open = 0;
        }
        if (!open) first_open = i, open = 1;
        for (int j = i; j < end; j++) shard_of[j] = -1;
        cur += bytes, i = end;
    }
    if (open) {
        for (int j = first_open; j < k; j++)
            if (shard_of[j] < 0) shard_of[j] = n_shards;
        n_shards++;
    }
    if (n_shards == 0) n_shards = 1; /* a model with no tensors: one empty file */
    for (int s = 0; s < n_shards; s++)
        if (n_shards == 1)
            snprintf(files[s], sizeof files[s], "model.safetensors");
        else
            snprintf(files[s], sizeof files[s], "model-%05d-of-%05d.safetensors", s + 1, n_shards);
    const float *params = ctrl_model_params(m, NULL);
    ctrl_status st = CTRL_OK;
    char path[4400];
    for (int s = 0; s < n_shards && st == CTRL_OK; s++) {
        int c = 0;
        for (int i = 0; i < k; i++) {
            if (shard_of[i] != s && !(n_shards == 1)) continue;
            const ctrl_param_view *v = ctrl_model_view(m, ord[i].index);
            w[c++] = (ctrl_st_write){.name = v->name,
                                     .data = params + v->offset,
                                     .ndim = v->ndim,
                                     .shape = {v->shape[0], v->shape[1]}};
        }
        snprintf(path, sizeof path, "%s/%s", dir, files[s]);
        st = ctrl_safetensors_write_fetched(path, w, c, dtype, m->save_fetch ? model_save_fetch : NULL, m);
    }
    /* an earlier save's files go before the index is written: the loader takes model.safetensors
     * first, and must never find one beside a newer index */
    if (st == CTRL_OK) st = remove_stale(dir, files, n_shards, n_shards > 1);
    if (st == CTRL_OK && n_shards > 1) {
        char *text = index_json(m, ord, shard_of, k, files, total_params, total_bytes);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        st = text ? model_write_text_atomic(path, text)
                  : ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory for the index", dir);
        free(text);
    }
    free(ord), free(w), free(shard_of), free(files);
    return st;
}
