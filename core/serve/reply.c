/* ctrl serve's JSON responses: a body and its status; errors as {"error": MESSAGE}. */
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

enum MHD_Result serve_error(struct MHD_Connection *c, unsigned code, const char *msg) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", msg);
    return serve_reply(c, code, o);
}
