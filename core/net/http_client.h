/* A minimal blocking HTTP/1.1 client for talking to `ctrl serve` (the online trainers' server
 * mode): one request per connection, a Content-Length body, the whole response read into memory
 * (a response body framed by Content-Length, by the connection's end, or chunked -- Transfer-Encoding:
 * chunked, decoded here).
 * Plain http:// only (the server binds to loopback by default). */
#ifndef CTRL_CORE_HTTP_CLIENT_H
#define CTRL_CORE_HTTP_CLIENT_H

#include <stddef.h>
#include <stdio.h>

#include <ctrl/status.h>

typedef struct ctrl_http_response {
    int status; /* HTTP status code */
    char *body; /* malloc'd, NUL-terminated */
    size_t len;
} ctrl_http_response;

/* POSTs `body` to base_url + path ("http://HOST:PORT" + "/generate"). `bearer` (may be NULL) is sent
 * as an Authorization header. Connection failures and malformed responses are errors naming the
 * URL; a non-2xx status is returned in *out for the caller to report. timeout_s bounds every wait. */
ctrl_status ctrl_http_post(const char *base_url, const char *path, const char *content_type, const void *body,
                           size_t len, const char *bearer, int timeout_s, ctrl_http_response *out);
/* The same with the body read from `body` (len bytes from its position), sent a block at a time: a
 * model's weights pushed to a server without a copy of them in memory. */
ctrl_status ctrl_http_post_file(const char *base_url, const char *path, const char *content_type, FILE *body,
                                size_t len, const char *bearer, int timeout_s, ctrl_http_response *out);
ctrl_status ctrl_http_get(const char *base_url, const char *path, int timeout_s, ctrl_http_response *out);
void ctrl_http_response_free(ctrl_http_response *r);
/* Decodes a chunked body (RFC 9112 7.1: hex size lines with optional extensions, the data, CRLF;
 * a zero-size chunk and trailers end it) in place: the data of buf[0, n) moved to the front and
 * NUL-terminated (buf has room for n + 1 bytes), its length in *out_len. -1 when malformed
 * (a size line without hex digits or unterminated, a chunk longer than what is left, data not
 * followed by CRLF, no last chunk). */
int ctrl_http_dechunk(char *buf, size_t n, size_t *out_len);

#endif
