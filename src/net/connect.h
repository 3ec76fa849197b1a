/*
 * Outgoing connections: resolve (uv_getaddrinfo on the thread pool, never on
 * the loop thread), connect to each address in turn until one answers, then
 * run the TLS handshake if asked. One timeout bounds the whole attempt.
 */
#ifndef OSR_NET_CONNECT_H
#define OSR_NET_CONNECT_H

#include <stdint.h>
#include <uv.h>

#include "net/sock.h"

typedef struct osr_connect_opts_s {
  uint64_t timeout_ms; /**< DNS + connect + handshake; default 10000 */
  osr_tls_ctx_t *tls;  /**< NULL = cleartext */
  const char *sni;     /**< server name for SNI and verification; default: the host */
} osr_connect_opts_t;

typedef struct osr_connect_s osr_connect_t;

/** Connected (status 0, `s` owned by the callee, no events set yet) or
 *  failed (`s` NULL; OSR_EDNS, OSR_ETIMEDOUT, -ECONNREFUSED, OSR_ECERT,
 *  OSR_ETLS, OSR_ECANCELED after osr_connect_cancel). */
typedef void (*osr_connect_cb)(osr_sock_t *s, int status, void *data);

/**
 * Connect to `addr` ("host:port", "[v6]:port", "unix:/path"). Returns 0 and
 * cb fires exactly once, or an error (OSR_EINVAL for a bad address) and cb
 * never fires. `*req` (optional) can be used to cancel until cb fired.
 */
int osr_connect(uv_loop_t *loop, const char *addr, const osr_connect_opts_t *opts,
                osr_connect_cb cb, void *data, osr_connect_t **req);

/** Abort a pending connect: cb fires with OSR_ECANCELED before this returns. */
void osr_connect_cancel(osr_connect_t *req);

#endif
