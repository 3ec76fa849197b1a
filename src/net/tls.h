/*
 * TLS on osr_sock_t with BoringSSL (default) or OpenSSL 3 (-Dtls=openssl),
 * using only the API subset both share. The SSL object talks to the socket
 * through memory buffers: ciphertext read from the kernel lands in
 * the TLS connection's raw buffer and is decrypted into sock->input; plaintext written by the owner
 * is encrypted into a fresh buffer handed to osr__sock_raw_write().
 *
 * Contexts are reference counted because every connection made from one holds
 * a reference: osr_tls_ctx_unref() frees the context when the last connection
 * using it is gone.
 *
 * Server side: ALPN is chosen from the server's list in its order of
 * preference; SNI is recorded and, when several certificates are loaded,
 * selects one. Client side: certificate verification is ON by default
 * (system CA store, or opts->ca_file), with host name checking against the
 * SNI/host; it can only be disabled explicitly.
 */
#ifndef OSR_NET_TLS_H
#define OSR_NET_TLS_H

#include <stddef.h>
#include <uv.h>

#include "osr/common.h"
#include "net/sock.h"

typedef struct osr_tls_server_opts_s {
  const char *cert_file;   /**< PEM chain */
  const char *key_file;    /**< PEM private key */
  /** ALPN protocols the server accepts, in order of preference, e.g.
   *  {"h2", "http/1.1"}. NULL/0: no ALPN. Copied. */
  const char *const *alpn;
  size_t nalpn;
} osr_tls_server_opts_t;

typedef struct osr_tls_client_opts_s {
  const char *ca_file;     /**< PEM bundle; NULL = the system store */
  int insecure_skip_verify;/**< 0 (default) verifies chain and host name */
  const char *const *alpn; /**< offered protocols, e.g. {"h2", "http/1.1"} */
  size_t nalpn;
  const char *cert_file;   /**< optional client certificate */
  const char *key_file;
} osr_tls_client_opts_t;

/**
 * Build a server context, reading files synchronously. For start-up code and
 * tests only: on the loop thread use osr_tls_ctx_load_server().
 * Returns 0 and a context with one reference, or an error (OSR_ETLS, -ENOENT).
 */
int osr_tls_ctx_new_server(const osr_tls_server_opts_t *opts, osr_tls_ctx_t **out);
int osr_tls_ctx_new_client(const osr_tls_client_opts_t *opts, osr_tls_ctx_t **out);

typedef void (*osr_tls_ctx_cb)(osr_tls_ctx_t *ctx, int status, void *data);
/**
 * Build a server/client context on libuv's thread pool (certificate and key
 * files are read and parsed off the loop thread, STYLE 21). opts is copied.
 * Returns 0 and cb fires once on the loop thread with the context (owned by
 * the callee) or an error; or returns an error and cb never fires.
 */
int osr_tls_ctx_load_server(uv_loop_t *loop, const osr_tls_server_opts_t *opts, osr_tls_ctx_cb cb,
                            void *data);
int osr_tls_ctx_load_client(uv_loop_t *loop, const osr_tls_client_opts_t *opts, osr_tls_ctx_cb cb,
                            void *data);

void osr_tls_ctx_ref(osr_tls_ctx_t *ctx);
void osr_tls_ctx_unref(osr_tls_ctx_t *ctx);

/* ---- used by sock.c, the listener and the connector ---------------------- */

/**
 * Attach TLS to a connected socket and start the handshake. `sni` is the
 * server name to send and verify (client side; NULL on the server).
 * osr__sock_handshake_done(s, status) is called exactly once when the
 * handshake finishes or fails. Returns 0 or an error (nothing called).
 */
int osr__tls_start(osr_sock_t *s, osr_tls_ctx_t *ctx, int is_server, const char *sni);
/** The connection's ciphertext input buffer (filled and trimmed by sock.c;
 *  empty, its memory given back, before osr__tls_free). */
osr_buf_t *osr__tls_raw(osr_tls_conn_t *c);
/** Ciphertext arrived in osr__tls_raw(): run the handshake or decrypt into
 *  s->input (never beyond its cap). Returns 0, or an error that ends the
 *  connection. Calls osr__sock_deliver() when plaintext was added. */
int osr__tls_on_raw(osr_sock_t *s);
/** Encrypt and queue; same contract as osr_sock_write. */
int osr__tls_write(osr_sock_t *s, const osr_iovec_t *bufs, size_t nbufs, osr_sock_write_cb cb,
                   void *arg);
/** Queue a close_notify alert; cb after it is written. */
int osr__tls_shutdown(osr_sock_t *s, osr_sock_write_cb cb, void *arg);
void osr__tls_free(osr_tls_conn_t *c);
const char *osr__tls_alpn(const osr_tls_conn_t *c);
const char *osr__tls_sni(const osr_tls_conn_t *c);

#endif
