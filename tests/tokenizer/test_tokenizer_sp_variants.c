/* SentencePiece-style configurations beyond Llama-2's, bit-exact with the `tokenizers` library:
 * tiny_sp/tokenizer.json edited as tests/reference/make_tokenizer_fixtures.py edits it (Metaspace
 * pre-tokenizer and decoder in their current and legacy forms, unk with and without fuse_unk,
 * missing byte tokens with and without unk, ignore_merges, no decoder, a decoder without Fuse,
 * NFC + normalized / lstrip / rstrip / single_word added tokens). Each variant encodes a sample of
 * the corpus and tricky strings with and without special tokens, and decodes those ids and random
 * id sequences keeping and skipping special tokens, as the library does (tiny_sp_variants.jsonl). */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "tokenizer/tokenizer.h"

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = 0;
    fclose(f);
    return s;
}

static void set_all(cJSON *into, const cJSON *from) {
    for (const cJSON *e = from ? from->child : NULL; e; e = e->next) {
        if (cJSON_GetObjectItemCaseSensitive(into, e->string))
            cJSON_ReplaceItemInObjectCaseSensitive(into, e->string, cJSON_Duplicate(e, 1));
        else
            cJSON_AddItemToObject(into, e->string, cJSON_Duplicate(e, 1));
    }
}

/* tiny_sp's tokenizer.json with the variant's edits, written to dir/tokenizer.json */
static void write_variant(const cJSON *base, const cJSON *edit, const char *dir) {
    cJSON *spec = cJSON_Duplicate(base, 1);
    set_all(spec, cJSON_GetObjectItemCaseSensitive(edit, "set"));
    cJSON *model = cJSON_GetObjectItemCaseSensitive(spec, "model");
    set_all(model, cJSON_GetObjectItemCaseSensitive(edit, "model_set"));
    const cJSON *rm = cJSON_GetObjectItemCaseSensitive(edit, "vocab_remove");
    for (const cJSON *e = rm ? rm->child : NULL; e; e = e->next)
        cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(model, "vocab"),
                                                e->valuestring);
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(edit, "added_append");
    for (const cJSON *e = add ? add->child : NULL; e; e = e->next)
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(spec, "added_tokens"), cJSON_Duplicate(e, 1));
    char path[1100];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    char *text = cJSON_PrintUnformatted(spec);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    free(text);
    cJSON_Delete(spec);
}

static int same_ids(const int32_t *got, size_t n, const cJSON *want) {
    if ((int)n != cJSON_GetArraySize(want)) return 0;
    size_t k = 0;
    for (const cJSON *e = want->child; e; e = e->next, k++)
        if (got[k] != (int32_t)e->valuedouble) return 0;
    return 1;
}

static void check_variant(const char *name, ctrl_tokenizer *tok, const cJSON *cases) {
    int bad = 0, n = 0;
    for (const cJSON *c = cases->child; c; c = c->next, n++) {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(c, "text");
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "ids_special");
        if (cJSON_IsString(text)) {
            const char *keys[2] = {"ids", "ids_special"};
            for (int special = 0; special < 2; special++) {
                int32_t *ids = NULL;
                size_t k = 0;
                ctrl_status st = ctrl_tokenizer_encode(tok, text->valuestring, strlen(text->valuestring),
                                                       special, &ids, &k);
                if (st != CTRL_OK || !same_ids(ids, k, cJSON_GetObjectItemCaseSensitive(c, keys[special]))) {
                    if (!bad++)
                        printf("  %s: encode(special %d) of '%s' differs (%s)\n", name, special,
                               text->valuestring, st == CTRL_OK ? "ids" : ctrl_error_message());
                }
                free(ids);
            }
        }
        int nw = cJSON_GetArraySize(want);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)(nw + 1));
        int k = 0;
        for (const cJSON *e = want->child; e; e = e->next) ids[k++] = (int32_t)e->valuedouble;
        const char *keys[2] = {"keep", "skip"};
        for (int skip = 0; skip < 2; skip++) {
            char *out = NULL;
            size_t len = 0;
            ctrl_status st = ctrl_tokenizer_decode(tok, ids, (size_t)nw, skip, &out, &len);
            const char *w = cJSON_GetObjectItemCaseSensitive(c, keys[skip])->valuestring;
            if (st != CTRL_OK || strcmp(out, w) != 0) {
                if (!bad++)
                    printf("  %s: decode(skip %d) gave '%s', want '%s'\n", name, skip, out ? out : "", w);
            }
            free(out);
        }
        free(ids);
    }
    CHECK_MSG(bad == 0, "%s: %d of %d cases differ from tokenizers", name, bad, n);
    printf("  %-22s %3d cases: %d mismatches\n", name, n, bad);
}

TEST(sentencepiece_variants) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer/tiny_sp/tokenizer.json", CTRL_FIXTURE_DIR);
    char *base_text = read_all(path);
    CHECK_MSG(base_text != NULL, "missing %s", path);
    snprintf(path, sizeof path, "%s/tokenizer/tiny_sp_variants.jsonl", CTRL_FIXTURE_DIR);
    char *variants = read_all(path);
    CHECK_MSG(variants != NULL, "missing %s", path);
    if (!base_text || !variants) return;
    cJSON *base = cJSON_Parse(base_text);
    char dir[] = "/tmp/ctrl-sp-variants-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    int n_variants = 0;
    for (char *line = strtok(variants, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *v = cJSON_Parse(line);
        const char *name = cJSON_GetObjectItemCaseSensitive(v, "name")->valuestring;
        write_variant(base, cJSON_GetObjectItemCaseSensitive(v, "edit"), dir);
        ctrl_tokenizer *tok = NULL;
        ctrl_status st = ctrl_tokenizer_load(dir, &tok);
        CHECK_MSG(st == CTRL_OK, "%s: %s", name, ctrl_error_message());
        if (tok) check_variant(name, tok, cJSON_GetObjectItemCaseSensitive(v, "cases"));
        ctrl_tokenizer_free(tok);
        cJSON_Delete(v);
        n_variants++;
    }
    CHECK(n_variants >= 11);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    rmdir(dir);
    cJSON_Delete(base);
    free(base_text), free(variants);
}
