/* PLACEHOLDER until the HTTP/2 module lands: connections are closed. */
#include "net/http.h"
void osr__http2_server_start(osr_http_server_t *srv, osr_sock_t *s) { (void)srv; osr_sock_close(s); }
