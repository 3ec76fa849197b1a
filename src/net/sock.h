/*
 * osr_sock_t: one byte stream (TCP or unix socket, optionally TLS) on libuv.
 * Every protocol in OSR (HTTP/1.1, HTTP/2, WebSocket, raw port forwarding)
 * runs on this type, so backpressure, timeouts and close discipline live here
 * once.
 *
 * Reading. Received plaintext is appended to `sock->input` (an osr_buf_t with
 * a cap) and ev->on_read(sock, 0) fires. The owner consumes what it used with
 * osr_buf_consume(&sock->input, n). Unconsumed bytes stay and new bytes are
 * appended after them. If the input buffer reaches its cap, reading stops and
 * on_read fires with OSR_ETOOLARGE. EOF and errors arrive as on_read(sock, <0)
 * (OSR_EOF for a clean end); after that no more data arrives.
 *
 * Zero-copy pass-through (STYLE 16): to forward bytes to another socket,
 * write iovecs that point into `sock->input`, call osr_sock_read_stop(), and
 * in the write callback consume them and osr_sock_read_start() again. The
 * input buffer is never moved while reading is stopped.
 *
 * Writing. osr_sock_write() queues scatter-gather buffers; they must stay
 * valid until the callback. Returns 0 and the callback fires exactly once
 * (status 0, an error, or OSR_ECANCELED if the socket closed first), or
 * returns an error and the callback never fires (STYLE 7).
 * osr_sock_write_queue_size() reports bytes queued but not yet written:
 * owners stop reading their source above a high watermark and resume from the
 * write callback (STYLE 14).
 *
 * Closing. osr_sock_close() is idempotent. Pending write callbacks fire with
 * OSR_ECANCELED, then ev->on_close fires once, then the memory is freed. The
 * owner must not touch the socket after on_close returns.
 *
 * TLS. A socket accepted by a listener with a TLS context, or connected with
 * one, runs the handshake before it is handed to its owner; afterwards reads
 * and writes carry plaintext and osr_sock_alpn() tells the negotiated
 * protocol.
 */
#ifndef OSR_NET_SOCK_H
#define OSR_NET_SOCK_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "net/loopctx.h"
#include "osr/common.h"
#include "util/buf.h"

typedef struct osr_sock_s osr_sock_t;
typedef struct osr_listener_s osr_listener_t;
typedef struct osr_tls_ctx_s osr_tls_ctx_t;
typedef struct osr_tls_conn_s osr_tls_conn_t;

typedef void (*osr_sock_write_cb)(osr_sock_t *s, int status, void *arg);

typedef struct osr_sock_events_s {
  /** New bytes in s->input (status 0), or the end of input (OSR_EOF, error,
   *  OSR_ETOOLARGE when the input cap was reached). */
  void (*on_read)(osr_sock_t *s, int status);
  /** The socket is closed; freed right after this returns. */
  void (*on_close)(osr_sock_t *s);
  /** Optional: the idle timer expired. NULL means close the socket. */
  void (*on_timeout)(osr_sock_t *s);
  /** Optional: the server is draining; finish in-flight work and close.
   *  NULL means close the socket now. */
  void (*on_drain)(osr_sock_t *s);
} osr_sock_events_t;

/* Default input cap; owners may change sock->input.max before reading. */
#define OSR_SOCK_INPUT_MAX_DEFAULT (1024 * 1024)

enum {
  OSR_SOCK_F_READING = 1u << 0,  /* owner wants data */
  OSR_SOCK_F_CLOSING = 1u << 1,
  OSR_SOCK_F_EOF = 1u << 2,      /* read side ended */
  OSR_SOCK_F_SHUT = 1u << 3,     /* write side shut down */
  OSR_SOCK_F_UV_READING = 1u << 4, /* uv_read_start is active */
  OSR_SOCK_F_IS_PIPE = 1u << 5,
  OSR_SOCK_F_HANDSHAKING = 1u << 6,
  OSR_SOCK_F_DRAINING = 1u << 7,
  OSR_SOCK_F_CLOSE_PENDING = 1u << 8, /* close requested during a callback */
  OSR_SOCK_F_KICK_FORCED = 1u << 9,   /* osr_sock_kick(): deliver even with no input */
  OSR_SOCK_F_WFLUSH = 1u << 10,       /* completed writes reported ahead of another event */
  OSR_SOCK_F_KICK = 1u << 11,         /* buffered input (or a held end) to deliver next turn */
  OSR_SOCK_F_KICK_QUEUED = 1u << 12,  /* a kick call is on the loop's deferred-call queue */
};

/* One queued write (private to sock.c). */
typedef struct osr__sock_wreq_s {
  uv_write_t req;
  osr_sock_t *sock;
  size_t bytes;
  osr_sock_write_cb cb;
  void *arg;
} osr__sock_wreq_t;

/* Laid out for the idle keep-alive connection, which is mostly this struct:
 * 408 bytes for TCP (a 416-byte malloc chunk), of which 248 are libuv's
 * uv_tcp_t. The handle comes last, so a TCP socket is allocated without the
 * 16 bytes by which a uv_pipe_t is larger (osr__sock_new); only unix
 * sockets may use _h.pipe. */
struct osr_sock_s {
  /** The owner's pointer. */
  void *data;
  const osr_sock_events_t *ev;
  /** Received plaintext not yet consumed by the owner. */
  osr_buf_t input;

  /* private */
  /* The idle (or TLS handshake) timeout is a node on the loop's shared
   * timer heap and the deferred delivery of buffered input ("kick",
   * OSR_SOCK_F_KICK) a call on its deferred-call queue (net/loopctx.h), not
   * libuv handles of their own: the stream is the socket's only handle. */
  osr_timer_t _timer;         /* holds the loop context reference */
  size_t _write_queue;        /* bytes queued and not yet written */
  osr_tls_conn_t *_tls;       /* NULL for cleartext */
  osr_listener_t *_listener;  /* accepted by; NULL for client sockets */
  struct osr_sock_s *_prev, *_next; /* the listener's connection list */
  void (*_handshake_cb)(osr_sock_t *s, int status);
  uint32_t _last_active;      /* low 32 bits of the loop time (ms) of the last read or write */
  uint32_t _idle_timeout_ms;  /* 0: none (clamped to 2^32-1 ms) */
  int16_t _pending_err;       /* EOF/error read while the owner paused reading */
  uint16_t _flags;
  uint16_t _in_cb;            /* >0 while an owner callback runs */
  /* Writes the kernel took whole at once (uv_try_write) whose callbacks
   * are still to run: they run from the loop context's deferred calls
   * (osr_call_defer) on the next loop turn, in order, never from inside
   * osr_sock_write. This skips libuv's write queue, whose drain costs an
   * epoll_ctl per write, without a per-socket slot array (which an idle
   * connection would carry for nothing). */
  uint16_t _wdone_n;
  union {
    /** The socket's loop: the handle's own `loop` field (uv_handle_t
     *  starts with data, loop), not a copy. Read-only. */
    struct {
      void *_hdata;
      uv_loop_t *loop;
    };
    union {
      uv_handle_t handle;
      uv_stream_t stream;
      uv_tcp_t tcp;
      uv_pipe_t pipe; /* unix sockets only: see above */
    } _h;             /* last: see above */
  };
};
_Static_assert(offsetof(uv_handle_t, loop) == sizeof(void *), "uv_handle_t starts with data, loop");

/* Bytes allocated for a TCP socket: all but the uv_pipe_t's extra tail. */
#define OSR__SOCK_TCP_SIZE (offsetof(osr_sock_t, _h) + sizeof(uv_tcp_t))

/**
 * Allocate a socket for `loop` with an initialised, not yet connected TCP
 * (is_pipe = 0) or unix (is_pipe = 1) handle. Used by the listener and the
 * connector; owners normally get sockets from them. Returns 0 or an error.
 */
int osr__sock_new(uv_loop_t *loop, int is_pipe, osr_sock_t **out);

/** Set the owner's events and pointer (also used to hand a socket over,
 *  e.g. HTTP/1.1 -> WebSocket). */
void osr_sock_set_events(osr_sock_t *s, const osr_sock_events_t *ev, void *data);

/** Start delivering on_read. Bytes already in s->input are delivered on the
 *  next loop iteration. Returns 0 or an error. */
int osr_sock_read_start(osr_sock_t *s);
/** Deliver on_read(s, 0) on the next loop iteration even if s->input holds
 *  nothing new (for owners whose parser has buffered state to resume, e.g.
 *  a paused HTTP/1.1 parser after a held body chunk was released). Only
 *  while reading. */
void osr_sock_kick(osr_sock_t *s);

/** Stop delivering on_read (backpressure). Idempotent. */
void osr_sock_read_stop(osr_sock_t *s);
int osr_sock_is_reading(const osr_sock_t *s);

/** Queue a scatter-gather write; see the file comment for the contract. */
int osr_sock_write(osr_sock_t *s, const osr_iovec_t *bufs, size_t nbufs, osr_sock_write_cb cb,
                   void *arg);

/** Hand bufs to the kernel now, as far as it takes them, with no callback:
 *  returns the bytes written (0 when it would block, on any error, on TLS
 *  sockets and while earlier writes are queued: the caller then writes the
 *  rest with osr_sock_write, which reports errors). A relay that forwards
 *  from inside its read callback thus skips the deferred completion. */
size_t osr_sock_try_write(osr_sock_t *s, const osr_iovec_t *bufs, size_t nbufs);

/** Bytes queued for writing and not yet handed to the kernel. */
static inline size_t osr_sock_write_queue_size(const osr_sock_t *s)
{
  return s->_write_queue;
}

/** Shut down the write side after queued writes (TLS: close_notify first).
 *  Callback contract as osr_sock_write. */
int osr_sock_shutdown(osr_sock_t *s, osr_sock_write_cb cb, void *arg);

/** Close; idempotent. See the file comment. */
void osr_sock_close(osr_sock_t *s);
int osr_sock_is_closing(const osr_sock_t *s);

/** Idle timeout: reset by every read and completed write; 0 disables. */
void osr_sock_set_idle_timeout(osr_sock_t *s, uint64_t ms);

/** TCP_NODELAY on TCP sockets (no-op for pipes). */
int osr_sock_set_nodelay(osr_sock_t *s, int enable);

/** Negotiated ALPN protocol ("h2", "http/1.1") or NULL. */
const char *osr_sock_alpn(const osr_sock_t *s);
/** SNI host name the client asked for (server side) or NULL. */
const char *osr_sock_sni(const osr_sock_t *s);
static inline int osr_sock_is_tls(const osr_sock_t *s)
{
  return s->_tls != NULL;
}

/** Peer and local address in printable form ("127.0.0.1:443", "[::1]:80",
 *  "unix"). Returns 0 or an error. */
int osr_sock_peername(const osr_sock_t *s, char *out, size_t outlen);

/** A peer address in binary (20 bytes, vs 64 for the printable form): what a
 *  long-lived connection keeps, formatted only when a request or a log line
 *  needs it. family 0 = unknown. */
typedef struct osr_sock_peer_s {
  uint8_t family; /**< AF_INET, AF_INET6, AF_UNIX or 0 */
  uint8_t pad_;
  uint16_t port;  /**< host order */
  uint8_t addr[16]; /**< IPv4 in the first 4 bytes */
} osr_sock_peer_t;

/** Fill `out` with the socket's peer (family 0 if it cannot be read).
 *  Returns 0 or an error. */
int osr_sock_peer(const osr_sock_t *s, osr_sock_peer_t *out);
/** Format `p` as osr_sock_peername does ("unknown" for family 0); `out` is
 *  always terminated (outlen > 0), truncated if short. */
void osr_sock_peer_format(const osr_sock_peer_t *p, char *out, size_t outlen);

/* ---- for the TLS layer (tls.c) and the listener/connector ---------------- */

/** Write bytes straight to the transport, bypassing TLS. */
int osr__sock_raw_write(osr_sock_t *s, const osr_iovec_t *bufs, size_t nbufs,
                        osr_sock_write_cb cb, void *arg);
/** Start reading from the transport regardless of the owner's wish (used
 *  during the TLS handshake). */
int osr__sock_raw_read_start(osr_sock_t *s);
/** Deliver on_read(s, status) to the owner under the callback guard. */
void osr__sock_deliver(osr_sock_t *s, int status);
/** Attach TLS and run the handshake (listener and connector). cb fires once
 *  with 0 or an error (OSR_ETIMEDOUT after timeout_ms); returns 0, or an
 *  error and cb never fires. The owner's events are not used meanwhile. */
int osr__sock_start_tls(osr_sock_t *s, osr_tls_ctx_t *ctx, int is_server, const char *sni,
                        uint64_t timeout_ms, void (*cb)(osr_sock_t *s, int status));
/** Give an empty buffer (base NULL) a block from the thread's pool, if its
 *  cap allows one; no-op otherwise or when out of memory (the caller's
 *  osr_buf_reserve then allocates). sock.c hands the block back once the
 *  buffer is empty again. */
void osr__sock_buf_adopt(osr_buf_t *b);
/** Give s->input's memory back when it holds no bytes (a pooled block
 *  returns to the pool, a grown buffer is freed), for owners that consume outside on_read, e.g. in a
 *  write callback (net/splice.c). No-op otherwise. */
void osr__sock_trim_input(osr_sock_t *s);
/** Called by tls.c when the handshake is done. */
void osr__sock_handshake_done(osr_sock_t *s, int status);

#endif
