/* PLACEHOLDER until the HTTP/2 client lands. */
#include "net/http.h"
int osr__http2_client_new(osr_sock_t *s, const osr_http_client_t *b, osr_http_client_t **out) { (void)b; (void)out; osr_sock_close(s); return OSR_EPROTO; }
