/* PLACEHOLDER until the WebSocket module lands. */
#include "net/ws.h"
int osr_ws_accept(osr_http_req_t *r, const osr_ws_opts_t *o, const osr_ws_events_t *e, void *d, osr_ws_t **out) { (void)r; (void)o; (void)e; (void)d; (void)out; return OSR_EWS; }
int osr_ws_connect(uv_loop_t *l, const char *a, const char *p, const osr_ws_connect_opts_t *o, const osr_ws_events_t *e, void *d, osr_ws_t **out) { (void)l; (void)a; (void)p; (void)o; (void)e; (void)d; (void)out; return OSR_EWS; }
int osr_ws_send(osr_ws_t *w, int op, const void *d, size_t n) { (void)w; (void)op; (void)d; (void)n; return OSR_EWS; }
int osr_ws_ping(osr_ws_t *w, const void *d, size_t n) { (void)w; (void)d; (void)n; return OSR_EWS; }
void osr_ws_close(osr_ws_t *w, int c, const char *r) { (void)w; (void)c; (void)r; }
const char *osr_ws_subprotocol(const osr_ws_t *w) { (void)w; return NULL; }
void osr_ws_read_stop(osr_ws_t *w) { (void)w; }
void osr_ws_read_start(osr_ws_t *w) { (void)w; }
void *osr_ws_data(const osr_ws_t *w) { (void)w; return NULL; }
