/* PLACEHOLDER until the TLS module lands: every TLS entry point fails. */
#include "net/tls.h"
int osr_tls_ctx_new_server(const osr_tls_server_opts_t *o, osr_tls_ctx_t **out) { (void)o; (void)out; return OSR_ETLS; }
int osr_tls_ctx_new_client(const osr_tls_client_opts_t *o, osr_tls_ctx_t **out) { (void)o; (void)out; return OSR_ETLS; }
int osr_tls_ctx_load_server(uv_loop_t *l, const osr_tls_server_opts_t *o, osr_tls_ctx_cb cb, void *d) { (void)l; (void)o; (void)cb; (void)d; return OSR_ETLS; }
int osr_tls_ctx_load_client(uv_loop_t *l, const osr_tls_client_opts_t *o, osr_tls_ctx_cb cb, void *d) { (void)l; (void)o; (void)cb; (void)d; return OSR_ETLS; }
void osr_tls_ctx_ref(osr_tls_ctx_t *c) { (void)c; }
void osr_tls_ctx_unref(osr_tls_ctx_t *c) { (void)c; }
int osr__tls_start(osr_sock_t *s, osr_tls_ctx_t *c, int is_server, const char *sni) { (void)s; (void)c; (void)is_server; (void)sni; return OSR_ETLS; }
int osr__tls_on_raw(osr_sock_t *s) { (void)s; return OSR_ETLS; }
int osr__tls_write(osr_sock_t *s, const osr_iovec_t *b, size_t n, osr_sock_write_cb cb, void *a) { (void)s; (void)b; (void)n; (void)cb; (void)a; return OSR_ETLS; }
int osr__tls_shutdown(osr_sock_t *s, osr_sock_write_cb cb, void *a) { (void)s; (void)cb; (void)a; return OSR_ETLS; }
void osr__tls_free(osr_tls_conn_t *c) { (void)c; }
const char *osr__tls_alpn(const osr_tls_conn_t *c) { (void)c; return NULL; }
const char *osr__tls_sni(const osr_tls_conn_t *c) { (void)c; return NULL; }
