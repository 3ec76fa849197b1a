/*
 * HTTP semantics shared by HTTP/1.1 (http1.c, on llhttp) and HTTP/2
 * (http2.c, on nghttp2): one request/response API for servers and one for
 * clients, so the gateway, the data plane and the agent never care which
 * protocol a peer speaks.
 *
 * SERVER
 *   osr_http_server_new() + osr_http_server_listen() accept HTTP/1.1,
 *   HTTP/2 with prior knowledge (h2c: the connection preface is sniffed on a
 *   cleartext connection) and HTTP/2 over TLS chosen by ALPN "h2".
 *   For every request, handler->on_request(req) fires once the header block
 *   is complete and valid. The handler then:
 *     - reads the body: set req->on_body before returning from on_request
 *       (or call osr_http_req_read_body() to collect a small body whole);
 *     - answers: osr_http_respond() then osr_http_write() as often as
 *       needed, the last with end=1; or osr_http_send() for a whole body.
 *   req->on_done fires once when the exchange is over (response sent and
 *   request body consumed, or the stream/connection was aborted); the
 *   request memory is freed right after it returns.
 *
 *   Invalid requests never reach the handler: the protocol layer answers
 *   400/413/414/431 (HTTP/1.1) or resets the stream (HTTP/2), per the caps
 *   in osr_http_limits_t.
 *
 * CLIENT
 *   osr_http_client_connect() opens a connection (HTTP/1.1, or HTTP/2 by
 *   ALPN or prior knowledge); osr_http_client_request() starts a request on
 *   it. HTTP/1.1 carries one request at a time (requests queue), HTTP/2
 *   multiplexes.
 *
 * BODY FLOW CONTROL (both directions)
 *   A body chunk passed to on_body is valid only during the callback, unless
 *   the callee calls osr_http_*_hold() inside the callback: then the chunk
 *   stays valid, no further body is delivered, and the peer is not given more
 *   credit (HTTP/1.1: the socket stops reading; HTTP/2: no WINDOW_UPDATE is
 *   sent) until osr_http_*_release(). This is how a proxy forwards a chunk
 *   without copying it and only lets more in once it was written downstream.
 *
 * WRITES
 *   osr_http_write(): bufs stay valid until cb. At most one write in flight
 *   per request. cb fires exactly once when the bytes were handed to the
 *   socket (status 0) or the exchange failed (status < 0); an error return
 *   means cb never fires.
 */
#ifndef OSR_NET_HTTP_H
#define OSR_NET_HTTP_H

#include <stdint.h>
#include <uv.h>

#include "osr/common.h"
#include "net/sock.h"

typedef struct osr_http_header_s {
  osr_iovec_t name;  /* lower case for requests received; as given when sent */
  osr_iovec_t value;
} osr_http_header_t;

/** Caps for everything a peer controls. Zero fields take the default. */
typedef struct osr_http_limits_s {
  size_t max_url;              /**< request-target bytes, default 8 KiB (414) */
  size_t max_header_bytes;     /**< names + values, default 64 KiB (431) */
  size_t max_headers;          /**< header count, default 100 (431) */
  uint64_t max_body;           /**< request body bytes, default 64 MiB (413) */
  uint64_t header_timeout_ms;  /**< whole header block, default 10000 (408) */
  uint64_t idle_timeout_ms;    /**< keep-alive idle, default 60000 */
  uint32_t h2_max_streams;     /**< concurrent streams, default 256 */
  uint32_t h2_window;          /**< per-stream receive window, default 256 KiB */
  /** Connection receive window; 0 = max(4 x h2_window, 1 MiB). A client
   *  that multiplexes many long streams whose readers may stall (the data
   *  plane's exec connections) sets it to h2_window x its streams, so held
   *  streams never use up the credit the others need. */
  uint32_t h2_conn_window;
  size_t max_conns;            /**< per listener, default 10000 */
} osr_http_limits_t;

/** Fill zero fields of `l` with the defaults. */
void osr_http_limits_defaults(osr_http_limits_t *l);

/* ========================================================================== */
/* Server                                                                      */

typedef struct osr_http_server_s osr_http_server_t;
typedef struct osr_http_req_s osr_http_req_t;
typedef struct osr_http_req_ops_s osr_http_req_ops_t;

typedef void (*osr_http_body_cb)(osr_http_req_t *req, const osr_iovec_t *chunk, int status);
typedef void (*osr_http_write_cb)(osr_http_req_t *req, int status, void *arg);

struct osr_http_req_s {
  /* ---- request, read-only, valid until on_done returns ---- */
  int version;              /**< 10, 11 or 20 */
  osr_iovec_t method;       /**< "GET" */
  osr_iovec_t target;       /**< raw request-target: "/v1/x?y=1" */
  osr_iovec_t path;         /**< target up to '?' */
  osr_iovec_t query;        /**< after '?', may be empty */
  osr_iovec_t authority;    /**< Host or :authority, may be empty */
  osr_iovec_t scheme;       /**< "http" or "https" */
  const osr_http_header_t *headers; /**< names lower case */
  size_t num_headers;
  int64_t content_length;   /**< -1 if not given (chunked, or h2 without it) */
  int expect_body;          /**< 0 if the request certainly has no body */
  int is_tls;
  char peer[64];            /**< "ip:port" of the client */
  osr_sock_t *sock;         /**< the connection (read-only; for upgrade) */
  osr_http_server_t *server;

  /* ---- set by the handler ---- */
  void *data;
  /** Body chunks (status 0), then status OSR_EOF at the end, or an error
   *  (the body is over either way). Set it in on_request; if left NULL the
   *  body is read and discarded. */
  osr_http_body_cb on_body;
  /** The exchange is over; `status` 0 if the response was fully sent,
   *  else why it was aborted. Optional. */
  void (*on_done)(osr_http_req_t *req, int status);

  /* private */
  const osr_http_req_ops_t *_ops;
  int _responded;
  void *_full_body; /* osr_http_req_read_body state */
  char _send_small[64]; /* osr_http_send body copy (HTTP/1.x, small bodies) */
};

typedef struct osr_http_handler_s {
  /** A request arrived (headers complete). `data` is osr_http_server_opts_t.data. */
  void (*on_request)(osr_http_req_t *req, void *data);
} osr_http_handler_t;

typedef struct osr_http_server_opts_s {
  osr_http_handler_t handler;
  void *data;
  osr_http_limits_t limits;
  const char *server_name;  /**< "Server" header; NULL = none */
} osr_http_server_opts_t;

/** Create a server (no sockets yet). opts is copied. */
osr_http_server_t *osr_http_server_new(uv_loop_t *loop, const osr_http_server_opts_t *opts);

/** Listen on `addr` (see net/addr.h). `tls` NULL = cleartext HTTP/1.1 and
 *  h2c prior knowledge; else TLS with ALPN h2/http1.1 (the context must have
 *  been created with those ALPN protocols). Returns 0 or an error. */
int osr_http_server_listen(osr_http_server_t *srv, const char *addr, osr_tls_ctx_t *tls);

/** Port of the n-th listener (for port 0 in tests). */
int osr_http_server_port(const osr_http_server_t *srv, size_t n);

/** Live connections over all listeners. */
size_t osr_http_server_nconns(const osr_http_server_t *srv);

/** Graceful shutdown: stop accepting, let in-flight requests finish (idle
 *  keep-alive connections close, HTTP/2 gets GOAWAY), force-close after
 *  grace_ms, then cb and free. */
void osr_http_server_close(osr_http_server_t *srv, uint64_t grace_ms,
                           void (*cb)(osr_http_server_t *srv, void *data), void *data);

/** Find a request header (case-insensitive name). Returns NULL if absent. */
const osr_iovec_t *osr_http_req_header(const osr_http_req_t *req, const char *name);

/**
 * Start the response. `headers` (copied) must not contain Content-Length,
 * Transfer-Encoding, Connection or HTTP/2 pseudo-headers: the protocol layer
 * writes those. content_length -1 means streamed (chunked on HTTP/1.1).
 * Returns 0, OSR_EINVAL if a response was already started.
 */
int osr_http_respond(osr_http_req_t *req, int status, const osr_http_header_t *headers,
                     size_t nheaders, int64_t content_length);

/** Send body bytes; end=1 finishes the response. See WRITES above. */
int osr_http_write(osr_http_req_t *req, const osr_iovec_t *bufs, size_t nbufs, int end,
                   osr_http_write_cb cb, void *arg);

/** Respond with a whole body (copied) and end. content_type may be NULL. */
int osr_http_send(osr_http_req_t *req, int status, const char *content_type, const void *body,
                  size_t len);

/** Keep the current body chunk and stop body delivery (see BODY FLOW CONTROL). */
void osr_http_req_hold(osr_http_req_t *req);
void osr_http_req_release(osr_http_req_t *req);

/** Collect the whole body (up to `max` bytes, else OSR_ETOOLARGE) and call
 *  cb once with it (valid until on_done). Replaces req->on_body; call it
 *  from on_request. On error (OSR_ETOOLARGE) the caller should answer 413. */
typedef void (*osr_http_full_body_cb)(osr_http_req_t *req, osr_iovec_t body, int status);
int osr_http_req_read_body(osr_http_req_t *req, size_t max, osr_http_full_body_cb cb);

/**
 * Response body pass-through (splice(2) in the data plane): on HTTP/1.1 over
 * cleartext, with a Content-Length response whose head is already written
 * and no write in flight, the next `len` body bytes may be written straight
 * to the connection's socket by the caller. Returns that socket (still
 * owned by the connection) and counts the bytes as written; the caller must
 * write exactly `len` bytes to it before its next osr_http_write() (which
 * ends the response as usual), or abort. NULL on HTTP/2, TLS, chunked
 * responses or anything else: nothing changed, use osr_http_write().
 */
osr_sock_t *osr_http_raw_body(osr_http_req_t *req, uint64_t len);

/** Abort: HTTP/1.1 closes the connection, HTTP/2 resets the stream.
 *  on_done fires with OSR_ECANCELED. */
void osr_http_abort(osr_http_req_t *req);

/**
 * HTTP/1.1 Upgrade (e.g. WebSocket): write a 101 response with `headers`
 * (copied), detach the socket from the HTTP/1.1 connection and hand it to
 * `cb` with status 0 (bytes the peer sent after the request are left in
 * sock->input). The request is then over (on_done fires with 0 before cb).
 * Fails with OSR_EINVAL on HTTP/2 or if the request has a body.
 */
typedef void (*osr_http_upgrade_cb)(osr_sock_t *sock, int status, void *arg);
int osr_http_upgrade(osr_http_req_t *req, const osr_http_header_t *headers, size_t nheaders,
                     osr_http_upgrade_cb cb, void *arg);

/** Standard reason phrase ("Not Found"); "Unknown" for others. */
const char *osr_http_reason(int status);

/* Per-protocol operations behind the request API (private). */
struct osr_http_req_ops_s {
  int (*respond)(osr_http_req_t *req, int status, const osr_http_header_t *h, size_t n,
                 int64_t content_length);
  int (*write)(osr_http_req_t *req, const osr_iovec_t *bufs, size_t nbufs, int end,
               osr_http_write_cb cb, void *arg);
  void (*hold)(osr_http_req_t *req);
  void (*release)(osr_http_req_t *req);
  void (*abort)(osr_http_req_t *req);
  int (*upgrade)(osr_http_req_t *req, const osr_http_header_t *h, size_t n,
                 osr_http_upgrade_cb cb, void *arg);
  osr_sock_t *(*raw_body)(osr_http_req_t *req, uint64_t len); /* NULL: not supported */
};

/* Entry points the server dispatcher (http_server.c) uses (private). */
/** Run an HTTP/1.1 connection on an accepted socket. */
void osr__http1_server_start(osr_http_server_t *srv, osr_sock_t *s);
/** Bytes allocated per HTTP/1.1 server connection (osr-testd --sizes). */
size_t osr__http1_conn_size(void);
/** Run an HTTP/2 server session on `s`. Bytes already in s->input (e.g. the
 *  sniffed client preface) are processed first. */
void osr__http2_server_start(osr_http_server_t *srv, osr_sock_t *s);
const osr_http_server_opts_t *osr__http_server_opts(const osr_http_server_t *srv);
/** The server whose options `opts` are (the inverse of osr__http_server_opts). */
osr_http_server_t *osr__http_server_of(const osr_http_server_opts_t *opts);
/** Protocol layers call this exactly once per request instead of calling
 *  req->on_done themselves; frees helper state after on_done. */
void osr__http_req_done(osr_http_req_t *req, int status);

/* ========================================================================== */
/* Client                                                                      */

typedef struct osr_http_client_s osr_http_client_t;
typedef struct osr_http_creq_s osr_http_creq_t;

typedef struct osr_http_client_opts_s {
  osr_tls_ctx_t *tls;         /**< NULL = cleartext */
  const char *sni;            /**< default: host of addr */
  int h2_prior_knowledge;     /**< cleartext only: speak h2c from the start */
  uint64_t connect_timeout_ms;/**< default 10000 */
  uint64_t idle_timeout_ms;   /**< no bytes for this long fails requests; default 60000 */
  osr_http_limits_t limits;   /**< caps on what the server sends */
} osr_http_client_opts_t;

typedef struct osr_http_client_events_s {
  /** Response head. headers valid during the call only; names lower case. */
  void (*on_response)(osr_http_creq_t *r, int status, const osr_http_header_t *headers,
                      size_t nheaders, void *data);
  /** Body chunk (status 0), OSR_EOF at the end, or an error (the exchange
   *  is over; the request is freed after the callback returns). An error
   *  before on_response means no response arrived. */
  void (*on_body)(osr_http_creq_t *r, const osr_iovec_t *chunk, int status, void *data);
} osr_http_client_events_t;

typedef struct osr_http_client_req_s {
  const char *method;
  const char *target;               /**< "/path?query" */
  const char *authority;            /**< Host / :authority; default: the connect address */
  const osr_http_header_t *headers; /**< copied */
  size_t nheaders;
  /** -1: streamed (chunked on HTTP/1.1), 0: no body, >0: exactly this many
   *  bytes follow via osr_http_creq_write(). */
  int64_t content_length;
} osr_http_client_req_t;

typedef void (*osr_http_client_connect_cb)(osr_http_client_t *c, int status, void *data);
typedef void (*osr_http_creq_write_cb)(osr_http_creq_t *r, int status, void *arg);

/** Connect to `addr`. cb fires once: status 0 with the client, or an error
 *  and c NULL. Returns 0, or an error and cb never fires. */
int osr_http_client_connect(uv_loop_t *loop, const char *addr, const osr_http_client_opts_t *opts,
                            osr_http_client_connect_cb cb, void *data);

/** 20 for HTTP/2, 11 for HTTP/1.1. */
int osr_http_client_version(const osr_http_client_t *c);

/** Requests the peer allows at once: HTTP/2 its SETTINGS_MAX_CONCURRENT_STREAMS
 *  (nghttp2 assumes 100 until the peer's first SETTINGS arrived), HTTP/1.1
 *  1; 0 once the connection is closing or gone (requests would fail with
 *  OSR_ECLOSED). */
uint32_t osr_http_client_max_streams(const osr_http_client_t *c);

/** HTTP/2: 1 once the peer's first SETTINGS frame arrived (it does speak
 *  HTTP/2), else 0. HTTP/1.1: always 1. A prior-knowledge connection that
 *  dies with 0 here went to a peer that does not speak h2c. */
int osr_http_client_peer_ready(const osr_http_client_t *c);

/** Start a request. ev/data are the request's events. Returns 0 and the
 *  request (owned by the client, valid until its final on_body), or an
 *  error (OSR_ECLOSED if the connection is gone). */
int osr_http_client_request(osr_http_client_t *c, const osr_http_client_req_t *req,
                            const osr_http_client_events_t *ev, void *data, osr_http_creq_t **out);

/** Send request body bytes; end=1 ends the body. One write in flight. */
int osr_http_creq_write(osr_http_creq_t *r, const osr_iovec_t *bufs, size_t nbufs, int end,
                        osr_http_creq_write_cb cb, void *arg);
void osr_http_creq_hold(osr_http_creq_t *r);
void osr_http_creq_release(osr_http_creq_t *r);
/**
 * Response body pass-through (the other end of osr_http_raw_body). With a
 * body chunk held: how many body bytes after it the caller may take off the
 * connection itself. Non-zero only on HTTP/1.1 over cleartext, for a
 * Content-Length body, with nothing else buffered; never the last byte,
 * which is parsed as usual and ends the response.
 */
uint64_t osr_http_creq_raw_avail(osr_http_creq_t *r);
/** Take n (1..raw_avail) body bytes: the held chunk is dropped, the parser
 *  counts the n bytes as delivered, and the connection's socket (still
 *  owned by the client) is returned with no reading: the caller moves
 *  exactly n bytes off it, then calls osr_http_creq_raw_done(); on failure
 *  it cancels the request instead. */
osr_sock_t *osr_http_creq_raw_take(osr_http_creq_t *r, uint64_t n);
/** The taken bytes are gone: body delivery resumes (the rest of the body,
 *  then OSR_EOF), as after osr_http_creq_release(). */
void osr_http_creq_raw_done(osr_http_creq_t *r);
/** Abort one request: on_body fires with OSR_ECANCELED. */
void osr_http_creq_cancel(osr_http_creq_t *r);

/** Close the connection: outstanding requests fail with OSR_ECANCELED, then
 *  the client is freed. */
void osr_http_client_close(osr_http_client_t *c);

/* Client internals shared by http_client.c, http1 and http2 (private). */
typedef struct osr_http_client_ops_s {
  int version;
  int (*request)(osr_http_client_t *c, const osr_http_client_req_t *req,
                 const osr_http_client_events_t *ev, void *data, osr_http_creq_t **out);
  int (*write)(osr_http_creq_t *r, const osr_iovec_t *bufs, size_t nbufs, int end,
               osr_http_creq_write_cb cb, void *arg);
  void (*hold)(osr_http_creq_t *r);
  void (*release)(osr_http_creq_t *r);
  void (*cancel)(osr_http_creq_t *r);
  void (*close)(osr_http_client_t *c);
  /* response body pass-through; NULL: not supported */
  uint64_t (*raw_avail)(osr_http_creq_t *r);
  osr_sock_t *(*raw_take)(osr_http_creq_t *r, uint64_t n);
  void (*raw_done)(osr_http_creq_t *r);
  uint32_t (*max_streams)(const osr_http_client_t *c); /* NULL: 1 (HTTP/1.1) */
  int (*peer_ready)(const osr_http_client_t *c);       /* NULL: 1 */
} osr_http_client_ops_t;

/** Base of the protocol-specific client structs (first member `super`). */
struct osr_http_client_s {
  const osr_http_client_ops_t *_ops;
  uv_loop_t *loop;
  char *authority;               /* default Host / :authority */
  osr_http_limits_t limits;
  uint64_t idle_timeout_ms;
};

/** Base of the protocol-specific request structs (first member `super`). */
struct osr_http_creq_s {
  osr_http_client_t *client;
  const osr_http_client_events_t *ev;
  void *data;
};

/** Take a connected socket and build the protocol client on it; the
 *  authority string and limits are copied from `base`. Returns 0 or an error
 *  (the socket is closed on error). */
int osr__http1_client_new(osr_sock_t *s, const osr_http_client_t *base, osr_http_client_t **out);
int osr__http2_client_new(osr_sock_t *s, const osr_http_client_t *base, osr_http_client_t **out);

#endif
