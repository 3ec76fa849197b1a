/*
 * A listening socket (TCP over IPv4/IPv6 or a unix socket) that accepts
 * connections as osr_sock_t, runs the TLS handshake when configured, limits
 * the number of live connections and drains them on shutdown.
 *
 * Connection limit: when `max_conns` connections are live, the listener
 * stops accepting; pending connections wait in the kernel backlog (real
 * backpressure, nothing is accepted and dropped) and accepting resumes when
 * one closes.
 *
 * Graceful shutdown: osr_listener_close() stops accepting at once, asks every
 * live connection to finish (sock ev->on_drain, e.g. HTTP/1.1 closes idle
 * keep-alive connections, HTTP/2 sends GOAWAY), force-closes whatever is
 * still open after `grace_ms`, and then calls the close callback.
 */
#ifndef OSR_NET_LISTENER_H
#define OSR_NET_LISTENER_H

#include <stdint.h>
#include <uv.h>

#include "net/addr.h"
#include "net/sock.h"

typedef struct osr_listener_opts_s {
  int backlog;                   /**< default 511 */
  size_t max_conns;              /**< 0 = unlimited */
  osr_tls_ctx_t *tls;            /**< NULL = cleartext; a reference is taken */
  uint64_t handshake_timeout_ms; /**< TLS handshake limit, default 10000 */
  int unix_mode;                 /**< chmod for unix sockets, default 0600 */
} osr_listener_opts_t;

/** A connection was accepted (and its TLS handshake finished). The callee
 *  owns `s` and must set its events; it may close it at once. */
typedef void (*osr_listener_accept_cb)(osr_listener_t *l, osr_sock_t *s);
typedef void (*osr_listener_close_cb)(osr_listener_t *l);

struct osr_listener_s {
  void *data;
  uv_loop_t *loop;
  /* private */
  union {
    uv_handle_t handle;
    uv_stream_t stream;
    uv_tcp_t tcp;
    uv_pipe_t pipe;
  } _h;
  uv_timer_t _grace;
  int _is_pipe;
  int _closing;
  int _accept_pending; /* a connection waits in the backlog (limit reached) */
  int _open_handles;
  size_t _nconns;
  size_t _max_conns;
  uint64_t _handshake_timeout_ms;
  osr_tls_ctx_t *_tls;
  osr_sock_t *_conns; /* doubly linked list of live connections */
  osr_listener_accept_cb _on_accept;
  osr_listener_close_cb _on_close;
  char _path[OSR_ADDR_PATH_MAX + 1];
  uint64_t accepted;  /**< statistics */
  uint64_t tls_failed;
};

/**
 * Bind and listen on `addr` (see net/addr.h; numeric IPs only, port 0 picks
 * a free port). A stale unix socket file is replaced. Returns 0 and the
 * listener, or an error (nothing allocated).
 */
int osr_listener_new(uv_loop_t *loop, const char *addr, const osr_listener_opts_t *opts,
                     osr_listener_accept_cb on_accept, void *data, osr_listener_t **out);

/** The bound TCP port (useful after port 0), or 0 for unix sockets. */
int osr_listener_port(const osr_listener_t *l);

/** Number of live connections. */
static inline size_t osr_listener_nconns(const osr_listener_t *l)
{
  return l->_nconns;
}

/** Stop accepting, drain connections (see above), then cb (may be NULL)
 *  and free. Idempotent: a second call does nothing. */
void osr_listener_close(osr_listener_t *l, uint64_t grace_ms, osr_listener_close_cb cb);

/* sock.c: a connection closed. */
void osr__listener_forget(osr_listener_t *l, osr_sock_t *s);

#endif
