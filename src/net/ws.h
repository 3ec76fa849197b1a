/*
 * WebSocket (RFC 6455) server and client on wslay, over osr_sock_t.
 *
 * Server: from an HTTP/1.1 request handler, osr_ws_accept() validates the
 * upgrade request (GET, Upgrade: websocket, Connection: upgrade,
 * Sec-WebSocket-Version: 13, a 16-byte base64 Sec-WebSocket-Key), picks the
 * first subprotocol of the server's list that the client offered, answers 101
 * and takes the socket. An invalid upgrade request gets 400 (426 for a wrong
 * version) and osr_ws_accept returns OSR_EWS.
 *
 * Client: osr_ws_connect() connects (TLS optional), sends the handshake with
 * a random key, verifies Sec-WebSocket-Accept and the chosen subprotocol.
 *
 * Messages: on_message delivers whole messages (fragments reassembled, at
 * most opts.max_message bytes, else close 1009; more than opts.max_fragments
 * frames, close 1008). Text messages are checked for valid UTF-8 (close
 * 1007). Pings are answered automatically. Protocol errors close with 1002.
 * osr_ws_send() queues one message (wslay keeps a copy until it is written;
 * osr_ws_sendv() writes one by reference instead)
 * and the total queued bytes are capped (opts.max_queued): at or above it
 * osr_ws_send fails with OSR_EAGAIN and on_writable fires once the queue
 * drains below half, so a producer can stop and resume (backpressure). While
 * the queue is at the cap the session also stops reading the peer (resuming
 * below half), so a handler that answers each message once from on_message
 * never sees OSR_EAGAIN, and a peer that floods pings without reading cannot
 * grow our memory. A close never overtakes messages queued before it.
 *
 * Subprotocols: when the client offers none of the server's, the server
 * answers 101 without Sec-WebSocket-Protocol (RFC 6455 4.2.2); clients such
 * as browsers and npm ws then fail the connection themselves.
 *
 * Closing: osr_ws_close(code, reason) sends a close frame and waits for the
 * peer's (or a timeout), then closes the socket; on_close fires exactly once
 * with the peer's code (1006 if the connection dropped without one).
 */
#ifndef OSR_NET_WS_H
#define OSR_NET_WS_H

#include <stdint.h>
#include <uv.h>

#include "net/http.h"
#include "net/sock.h"

typedef struct osr_ws_s osr_ws_t;

enum {
  OSR_WS_TEXT = 1,
  OSR_WS_BINARY = 2,
};

typedef struct osr_ws_opts_s {
  const char *const *subprotocols; /**< server: supported, in preference order;
                                        client: offered */
  size_t nsubprotocols;
  size_t max_message;     /**< default 16 MiB */
  size_t max_fragments;   /**< fragments per message, default 1024 */
  size_t max_queued;      /**< outgoing bytes buffered, default 4 MiB */
  uint64_t ping_interval_ms; /**< 0 = no keepalive pings */
  uint64_t idle_timeout_ms;  /**< default 0 (none) */
  uint64_t close_timeout_ms; /**< wait for the peer's close frame, default 5000 */
} osr_ws_opts_t;

typedef struct osr_ws_events_s {
  /** The client handshake finished (client side only): status 0 or error;
   *  on error the osr_ws_t is freed after the callback. */
  void (*on_open)(osr_ws_t *ws, int status, void *data);
  /** A whole message. `op` is OSR_WS_TEXT or OSR_WS_BINARY. Valid during the call. */
  void (*on_message)(osr_ws_t *ws, int op, const osr_iovec_t *msg, void *data);
  /** Outgoing queue drained below half after osr_ws_send returned OSR_EAGAIN. */
  void (*on_writable)(osr_ws_t *ws, void *data);
  /** Closed: the peer's close code and reason (1006 = no close frame). The
   *  osr_ws_t is freed after this returns. */
  void (*on_close)(osr_ws_t *ws, int code, const osr_iovec_t *reason, void *data);
} osr_ws_events_t;

/** Server side, from an HTTP/1.1 on_request handler. ev/opts copied. */
int osr_ws_accept(osr_http_req_t *req, const osr_ws_opts_t *opts, const osr_ws_events_t *ev,
                  void *data, osr_ws_t **out);

typedef struct osr_ws_connect_opts_s {
  osr_ws_opts_t ws;
  osr_tls_ctx_t *tls;      /**< NULL = ws:// */
  const char *sni;
  const char *host;        /**< Host header; default from addr */
  const char *origin;      /**< optional Origin header */
  const osr_http_header_t *headers; /**< extra headers, e.g. authorization */
  size_t nheaders;
  uint64_t timeout_ms;     /**< connect + handshake, default 10000 */
} osr_ws_connect_opts_t;

/** Client side: connect to `addr` and GET `path`. ev->on_open fires once.
 *  Returns 0 (and *out) or an error and nothing fires. */
int osr_ws_connect(uv_loop_t *loop, const char *addr, const char *path,
                   const osr_ws_connect_opts_t *opts, const osr_ws_events_t *ev, void *data,
                   osr_ws_t **out);

/** Queue one message (op OSR_WS_TEXT/BINARY). Returns 0, OSR_EAGAIN above
 *  max_queued (see on_writable), OSR_ECLOSED after close started. */
int osr_ws_send(osr_ws_t *ws, int op, const void *data, size_t len);

/** Most payload pieces one osr_ws_sendv() takes. */
#define OSR_WS_SENDV_MAX 8

typedef void (*osr_ws_sendv_cb)(osr_ws_t *ws, int status, void *arg);

/**
 * Send one message as a single frame without copying it (server side): the
 * frame header is built here and the payload is written straight from
 * `bufs` (up to OSR_WS_SENDV_MAX pieces, concatenated), after every message
 * queued before it. Ownership: the payload memory stays the caller's and
 * must stay valid and unchanged until `cb`; the iovec array itself is
 * copied. cb fires exactly once, never from inside this call: status 0
 * when the frame was handed to the socket, or an error when the session
 * ended first (then always before on_close). One such frame at a time
 * (OSR_EBUSY while one is outstanding); while it waits, osr_ws_send()
 * answers OSR_EAGAIN and on_writable follows (the order holds). Counts
 * towards max_queued like osr_ws_send (OSR_EAGAIN at the cap; cb then does
 * not fire). OSR_EINVAL on the client side (frames are masked: use
 * osr_ws_send), for a text message in more than one piece or invalid
 * UTF-8; OSR_ECLOSED after close started.
 */
int osr_ws_sendv(osr_ws_t *ws, int op, const osr_iovec_t *bufs, size_t nbufs, osr_ws_sendv_cb cb,
                 void *arg);

/** Ping with an optional payload (<= 125 bytes). */
int osr_ws_ping(osr_ws_t *ws, const void *data, size_t len);

/** Start the close handshake. */
void osr_ws_close(osr_ws_t *ws, int code, const char *reason);

/** Negotiated subprotocol or NULL. */
const char *osr_ws_subprotocol(const osr_ws_t *ws);

/** Pause/resume reading (backpressure for a consumer that forwards messages). */
void osr_ws_read_stop(osr_ws_t *ws);
void osr_ws_read_start(osr_ws_t *ws);

void *osr_ws_data(const osr_ws_t *ws);

#endif
