/* ctrl serve's JSON responses: a body and its status; errors in OpenAI's shape
 * {"error": {"message", "type", "param", "code"}} (the official clients show the message). */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"

enum MHD_Result serve_reply(struct MHD_Connection *c, unsigned code, cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s) { /* out of memory: an empty 500 still answers */
        code = 500;
        s = strdup("{}");
        if (!s) return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    if (!r) return free(s), MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

/* The field a message names: its leading identifier when a ':' or '[' follows it ("top_p: ...",
 * "messages[0].content: ..."), or the quoted name of "unknown field 'x'"; 0 when none. */
static size_t named_field(const char *msg, const char **start) {
    static const char unknown[] = "unknown field '";
    if (!strncmp(msg, unknown, sizeof unknown - 1)) {
        *start = msg + sizeof unknown - 1;
        const char *end = strchr(*start, '\'');
        return end ? (size_t)(end - *start) : 0;
    }
    size_t n = 0;
    while (isalnum((unsigned char)msg[n]) || msg[n] == '_' || msg[n] == '.') n++;
    *start = msg;
    return n > 0 && (msg[n] == ':' || msg[n] == '[') ? n : 0;
}

cJSON *serve_error_object(unsigned code, const char *msg) {
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type",
                            code == 401   ? "authentication_error"
                            : code == 404 ? "not_found_error"
                            : code == 501 ? "not_implemented_error"
                            : code < 500  ? "invalid_request_error"
                                          : "server_error");
    const char *f = NULL;
    const size_t n = named_field(msg, &f);
    if (n > 0) {
        char *p = strndup(f, n);
        cJSON_AddStringToObject(e, "param", p ? p : "");
        free(p);
    } else {
        cJSON_AddNullToObject(e, "param");
    }
    cJSON_AddNumberToObject(e, "code", code);
    return o;
}

enum MHD_Result serve_error(struct MHD_Connection *c, unsigned code, const char *msg) {
    return serve_reply(c, code, serve_error_object(code, msg));
}

uint64_t serve_random(ctrl_server *s) {
    pthread_mutex_lock(&s->lock);
    uint64_t z = (s->rng += 0x9E3779B97F4A7C15ull);
    pthread_mutex_unlock(&s->lock);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
