/*
 * The HTTP/2 connection engine shared by the server (http2.c) and the client
 * (http2_client.c), on nghttp2. Private to src/net/http2*.c.
 *
 * What the engine owns
 *   - the nghttp2 session, built on the OSR allocator (STYLE 9) with
 *     automatic WINDOW_UPDATE turned off (STYLE 14);
 *   - the output path: nghttp2_session_send() is driven from one function,
 *     osr__h2_flush(). Control frames are copied into a per-flush "batch";
 *     DATA payloads are never copied: the data source answers with
 *     NGHTTP2_DATA_FLAG_NO_COPY and send_data_callback appends the 9-byte
 *     frame header plus iovecs pointing at the caller's buffers to the same
 *     batch, which goes to the socket as ONE scatter-gather write (STYLE 15,
 *     16). A stream's write callback fires when the batch holding its last
 *     bytes was written;
 *   - backpressure: frames are only pulled while the socket's write queue is
 *     below OSR_H2_OUT_HIGH, and a server's socket is not read while it is
 *     above (a peer that sends PINGs but never reads cannot grow our
 *     memory; a client keeps reading, or two of our ends could wait on each
 *     other forever, see update_reading);
 *   - the input path: the socket's input buffer goes through
 *     nghttp2_session_mem_recv(); body chunks are handed out in place. A
 *     chunk the consumer holds keeps the read buffer it lives in alive (a
 *     "pin"; the socket gets a fresh buffer) and is credited to the peer
 *     (nghttp2_session_consume) only on release. Body that arrives for a
 *     stream while it holds a chunk is copied into a per-stream backlog
 *     bounded by the stream window: the peer cannot send more than that
 *     without a WINDOW_UPDATE, which it does not get while we hold;
 *   - stream lifetime: a stream is finalised (hooks->on_stream_done) exactly
 *     once, after nghttp2 closed it AND no queued batch still points at its
 *     buffers AND its body was delivered to the end or aborted.
 *
 * Memory mode (fuzzing, unit tests): a connection without a socket. Output
 * batches are handed to a function and completed by osr__h2_mem_complete();
 * input is fed with osr__h2_mem_feed(); osr__h2_mem_destroy() simulates the
 * loss of the connection and frees everything.
 */
#ifndef OSR_NET_HTTP2_INT_H
#define OSR_NET_HTTP2_INT_H

#include <nghttp2/nghttp2.h>
#include <stdint.h>

#include "net/http.h"
#include "util/buf.h"

/* Pull no more frames and stop reading the socket once this many bytes are
 * queued for writing; read again below OSR_H2_OUT_LOW. */
#define OSR_H2_OUT_HIGH (256 * 1024)
#define OSR_H2_OUT_LOW  (64 * 1024)

typedef struct osr__h2_conn_s osr__h2_conn_t;
typedef struct osr__h2_stream_s osr__h2_stream_t;
typedef struct osr__h2_batch_s osr__h2_batch_t;
typedef struct osr__h2_pin_s osr__h2_pin_t;

/** What the server or client plugs into the engine. Every hook runs on the
 *  loop thread; the stream/connection stays valid for the whole call. */
typedef struct osr__h2_hooks_s {
  /* nghttp2 header callbacks, passed through (return 0 or an nghttp2 error). */
  int (*on_begin_headers)(osr__h2_conn_t *c, const nghttp2_frame *f);
  int (*on_header)(osr__h2_conn_t *c, const nghttp2_frame *f, const uint8_t *name, size_t namelen,
                   const uint8_t *value, size_t valuelen);
  /** A HEADERS frame (with its CONTINUATIONs) was received for `st`. */
  int (*on_headers)(osr__h2_conn_t *c, const nghttp2_frame *f, osr__h2_stream_t *st);
  /** Incoming body: a chunk (status 0, the hook may call osr__h2_hold()),
   *  the end (OSR_EOF) or an error. Exactly one end/error per stream unless
   *  the stream is finalised by a connection loss before anything. */
  void (*on_body)(osr__h2_stream_t *st, const osr_iovec_t *chunk, int status);
  /** The pending osr__h2_write() finished (0) or failed. */
  void (*on_write_done)(osr__h2_stream_t *st, int status);
  /** The stream is over; the owner frees the struct embedding `st`. */
  void (*on_stream_done)(osr__h2_stream_t *st, int status);
  /** Socket idle timer (server: GOAWAY idle connections). NULL: close. */
  void (*on_timeout)(osr__h2_conn_t *c);
  /** The socket is closed and every stream finalised; the owner may free
   *  the connection now (it is not referenced by the engine afterwards). */
  void (*on_closed)(osr__h2_conn_t *c);
} osr__h2_hooks_t;

enum {
  OSR_H2_ST_HAS_PRD = 1u << 0,     /* a data provider was submitted */
  OSR_H2_ST_W_ACTIVE = 1u << 1,    /* a write is pending (cb not fired) */
  OSR_H2_ST_W_FRAMED = 1u << 2,    /* all of it is in DATA frames */
  OSR_H2_ST_W_END = 1u << 3,       /* the pending write ends the body */
  OSR_H2_ST_W_ENDED = 1u << 4,     /* the final write reached the socket */
  OSR_H2_ST_DEFERRED = 1u << 5,    /* data source returned DEFERRED */
  OSR_H2_ST_NG_CLOSED = 1u << 6,   /* nghttp2 closed the stream */
  OSR_H2_ST_RX_END = 1u << 7,      /* END_STREAM received */
  OSR_H2_ST_RX_DONE = 1u << 8,     /* end/error delivered to on_body */
  OSR_H2_ST_HOLD_REQ = 1u << 9,    /* osr__h2_hold() during on_body */
  OSR_H2_ST_HELD = 1u << 10,       /* a chunk is held */
  OSR_H2_ST_DELIVERING = 1u << 11, /* inside on_body */
  OSR_H2_ST_FINALIZED = 1u << 12,
  OSR_H2_ST_LOST = 1u << 13,       /* the connection went away */
  OSR_H2_ST_EOF_AT_END = 1u << 14, /* client: EOF only at finalisation */
  OSR_H2_ST_RST_AFTER = 1u << 15,  /* answered early: RST_STREAM(NO_ERROR)
                                      once our END_STREAM is out */
  OSR_H2_ST_LOCAL_END = 1u << 16,  /* our END_STREAM was sent */
};

struct osr__h2_stream_s {
  osr__h2_conn_t *conn;
  osr__h2_stream_t *prev, *next; /* conn->streams */
  int32_t id;
  unsigned flags;
  int status;        /* why it ended, if known (OSR_E*), else 0 */
  uint32_t ng_error; /* nghttp2 close error code */
  int inflight;      /* batch segments pointing at this stream's buffers */

  /* outgoing body: the one pending write */
  osr_iovec_t *w_iov;
  osr_iovec_t w_small[4];
  size_t w_niov;
  size_t w_idx, w_off; /* send cursor into w_iov */
  uint64_t w_total, w_framed, w_sent;
  uint64_t out_bytes; /* total body bytes written so far */

  /* incoming body */
  osr__h2_pin_t *pin; /* read buffer of the held chunk (NULL: held_buf) */
  size_t held_len;    /* bytes to credit on release */
  osr_buf_t held_buf; /* held chunk that came from the backlog */
  osr_buf_t backlog;  /* body received while holding (copied) */
  uint64_t rx_bytes;
  int64_t rx_expect; /* content-length of the incoming body, -1 unknown */
  uint32_t rst_gen;  /* RST_AFTER: reset when this PING is acked */
};

struct osr__h2_batch_s;

struct osr__h2_conn_s {
  nghttp2_session *ng;
  osr_sock_t *sock; /* NULL in memory mode or once closed */
  const osr__h2_hooks_t *hooks;
  void *owner;
  int is_server;
  osr_http_limits_t limits;
  osr__h2_stream_t *streams; /* live (not finalised) streams */
  size_t nstreams;

  osr__h2_batch_t *cur;     /* frames collected by the running flush */
  osr__h2_batch_t *pending; /* memory mode / refused by the socket: FIFO */
  size_t batches_inflight;  /* submitted, completion not yet seen */
  size_t queued;            /* bytes of those batches */
  int flushing, want_flush, in_recv;
  int close_req;    /* close once the running recv/flush returns */
  int closing;      /* closing: nothing new is written */
  int closed;       /* socket gone, streams finalised, session deleted */
  int close_status; /* what open streams fail with */
  int draining, goaway_final;
  int peer_settings; /* the peer's first SETTINGS frame arrived */
  uint32_t rst_ping_gen;
  osr__h2_pin_t *rx_pin; /* pin for the read buffer being parsed */
  osr_buf_t mem_input;   /* memory mode input */
  void (*mem_write)(void *ud, const osr_iovec_t *iov, size_t n);
  void *mem_ud;
};

/**
 * Set up `c` on `sock`, or in memory mode when sock is NULL (set
 * c->mem_write/mem_ud afterwards to see the output). Creates the session
 * on the OSR allocator, applies the flood limits, queues our SETTINGS and
 * the connection window, and takes over the socket's events. Returns 0 or
 * OSR_ENOMEM (nothing to free; the socket is left untouched).
 */
int osr__h2_conn_init(osr__h2_conn_t *c, osr_sock_t *sock, int is_server,
                      const osr_http_limits_t *limits, const osr__h2_hooks_t *hooks, void *owner);

/** Start reading and send what is queued (the SETTINGS). */
void osr__h2_conn_start(osr__h2_conn_t *c);

/** Register a stream with nghttp2 id `id` (stream user data is set). */
void osr__h2_stream_attach(osr__h2_conn_t *c, osr__h2_stream_t *st, int32_t id);

/** Data provider to pass to nghttp2_submit_response/request for `st`. */
void osr__h2_data_provider(osr__h2_stream_t *st, nghttp2_data_provider *prd);

/** Queue body bytes for `st` (see http.h WRITES). hooks->on_write_done
 *  fires once unless an error is returned. */
int osr__h2_write(osr__h2_stream_t *st, const osr_iovec_t *bufs, size_t nbufs, int end);

/** Body flow control (see http.h BODY FLOW CONTROL). */
void osr__h2_hold(osr__h2_stream_t *st);
void osr__h2_release(osr__h2_stream_t *st);

/** RST_STREAM(code); the stream ends with `status`. */
void osr__h2_reset(osr__h2_stream_t *st, uint32_t code, int status);

/** Send pending frames (safe to call from anywhere; re-entrant calls are
 *  folded into the running one). */
void osr__h2_flush(osr__h2_conn_t *c);

/** Tear the connection down: GOAWAY with `h2err` if `goaway`, then close;
 *  open streams end with `status`. */
void osr__h2_conn_fail(osr__h2_conn_t *c, int status, uint32_t h2err, int goaway);

/** Graceful shutdown (server: GOAWAY notice, PING, final GOAWAY once the
 *  PING is answered; in-flight streams finish). Also the sock on_drain. */
void osr__h2_conn_drain(osr__h2_conn_t *c);

/** Re-check whether a stream can be finalised (after a flag change). */
void osr__h2_stream_check(osr__h2_stream_t *st);

/** Memory mode. feed returns 0, or <0 once the session is finished. */
int osr__h2_mem_feed(osr__h2_conn_t *c, const uint8_t *data, size_t len);
/** Complete every queued output batch (status 0); returns how many. */
size_t osr__h2_mem_complete(osr__h2_conn_t *c);
/** Lose the connection: streams are finalised with OSR_ECONNRESET and the
 *  session is freed; hooks->on_closed fires. */
void osr__h2_mem_destroy(osr__h2_conn_t *c);

/** Server in memory mode (fuzzing): a session for `srv`'s handler and
 *  limits without a socket; output goes to `write`. NULL on OOM. Free with
 *  osr__h2_mem_destroy(), which also frees the server connection. */
osr__h2_conn_t *osr__http2_server_new_mem(osr_http_server_t *srv,
                                          void (*write)(void *ud, const osr_iovec_t *iov, size_t n),
                                          void *ud);

/** The session allocator on osr_mem (shared by server and client). */
nghttp2_mem *osr__h2_mem(void);

/** Lower-case copy helper for outgoing header names: writes into `dst`
 *  (at least n bytes). */
void osr__h2_lower(uint8_t *dst, const char *src, size_t n);

/** Connection-specific fields that must not appear in HTTP/2 (RFC 9113
 *  8.2.2), plus the ones the layer writes itself. */
int osr__h2_forbidden_header(const char *name, size_t n);

#endif
