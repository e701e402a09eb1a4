/* What ctrl serve and its clients read from the network besides request bodies: the first byte
 * picks (even) a chunked HTTP response body decoded by the HTTP client (ctrl_http_dechunk: the
 * decoded length never exceeds the input, the result is NUL-terminated) or (odd) the pickled NCCL
 * unique id a trainer publishes in its TCPStore for vLLM's weight-transfer engine
 * (serve_unpickle_nccl_id); the rest is the bytes (docs/fuzzing.md). */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "net/http_client.h"
#include "serve/weight_transfer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t *p = data + 1;
    const size_t n = size - 1;
    if (data[0] % 2 == 0) {
        char *buf = malloc(n + 1); /* exactly what the client hands it: the body and room for a NUL */
        if (!buf) return 0;
        memcpy(buf, p, n);
        size_t out = 0;
        if (ctrl_http_dechunk(buf, n, &out) == 0 && (out > n || buf[out] != '\0')) abort();
        free(buf);
    } else {
        uint8_t id[128];
        (void)serve_unpickle_nccl_id(p, n, id);
    }
    return 0;
}
