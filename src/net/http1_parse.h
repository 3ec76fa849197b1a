/*
 * Bounded HTTP/1.1 message parser: llhttp plus the caps and checks llhttp
 * does not do itself (STYLE 22). Pure: no sockets, no logging, no timers, so
 * the server (http1.c), the client (http1_client.c), the fuzz target
 * (fuzz/fuzz_http1.c) and the unit test drive exactly the same code.
 *
 * What it adds on top of llhttp (which stays strict: no lenient flag is ever
 * set):
 *   - caps: request-target bytes (414), header name+value bytes and header
 *     count (431), request body bytes (413, up front for Content-Length and
 *     as it streams for chunked), chunk-extension bytes per chunk (400);
 *     trailers count against the same header caps and are discarded;
 *   - checks llhttp 8.1 in its non-strict build lets through: obs-fold
 *     (a header line continued on the next line), field names that are not
 *     tokens (e.g. a space before the colon), HTTP versions other than 1.0
 *     and 1.1 (505), Transfer-Encoding other than exactly "chunked" (501),
 *     Transfer-Encoding on HTTP/1.0 (400), missing or repeated Host on
 *     HTTP/1.1 (400);
 *   - a copy of the head: the target (or reason phrase) and the headers with
 *     lower-cased names and trimmed values are collected in `p->head`, a
 *     capped buffer reused from message to message, so nothing points into
 *     the caller's read buffer once a callback returned.
 *
 * Flow. osr__h1p_execute() parses from memory and reports where it stopped:
 *   OSR_H1P_DONE     all bytes were consumed (more are needed);
 *   OSR_H1P_HELD     the owner's on_body returned 1 (hold): the chunk just
 *                    delivered (`p->held_len` bytes right after *consumed)
 *                    must stay in place until the hold ends;
 *   OSR_H1P_MESSAGE  a message ended (on_complete ran); parsing stops at the
 *                    message boundary so the owner can finish the exchange
 *                    before the next pipelined message is parsed;
 *   < 0              the message is invalid: `p->status` is the HTTP status
 *                    a server should answer (400, 413, 414, 431, 501, 505)
 *                    and `p->err` an OSR_E* code. The parser stays failed
 *                    until osr__h1p_reset().
 * Calling execute again after HELD or MESSAGE resumes.
 */
#ifndef OSR_NET_HTTP1_PARSE_H
#define OSR_NET_HTTP1_PARSE_H

#include <llhttp.h>
#include <stdint.h>

#include "net/http.h"
#include "util/buf.h"

typedef struct osr_h1p_s osr_h1p_t;

enum {
  OSR_H1P_DONE = 0,
  OSR_H1P_HELD = 1,
  OSR_H1P_MESSAGE = 2,
};

/** Most chunk-extension bytes accepted per chunk (they carry nothing we use). */
#define OSR_H1P_MAX_CHUNK_EXT 1024

typedef struct osr_h1p_events_s {
  /** Optional: the first byte of a message arrived (the server starts its
   *  header timer here). Return 0, or <0 to fail with p->status/err set. */
  int (*on_begin)(osr_h1p_t *p);
  /** The head is complete and valid; p->headers/num_headers, p->target (or
   *  p->reason), p->version, p->content_length, ... are set and valid until
   *  the next message begins. Return 0, 1 to parse the message as having no
   *  body (client: response to HEAD), or <0 to fail (set p->status/err
   *  first, else 400/OSR_EHTTP). */
  int (*on_head)(osr_h1p_t *p);
  /** A body chunk, valid only during the call unless 1 is returned (hold):
   *  then execute returns OSR_H1P_HELD and the chunk stays where it is in
   *  the caller's buffer. Return 0, 1 or <0 (fail). */
  int (*on_body)(osr_h1p_t *p, const char *at, size_t len);
  /** The message is complete (after the last body byte). Return 0 or <0. */
  int (*on_complete)(osr_h1p_t *p);
} osr_h1p_events_t;

struct osr_h1p_s {
  /** The owner's pointer. */
  void *data;

  /* ---- results, valid from on_head until the next message begins ---- */
  int version;              /**< 10 or 11 */
  int method;               /**< llhttp_method_t (requests) */
  int status_code;          /**< responses */
  osr_iovec_t target;       /**< request-target (requests) */
  osr_iovec_t reason;       /**< reason phrase (responses) */
  osr_http_header_t *headers; /**< names lower case, values trimmed */
  size_t num_headers;
  const osr_iovec_t *host;  /**< requests: the first Host value in headers, or NULL */
  const osr_iovec_t *expect; /**< requests: the first Expect value, or NULL */
  int64_t content_length;   /**< -1 when absent */
  int chunked;
  int keep_alive;           /**< llhttp_should_keep_alive at head time */
  int upgrade;              /**< Upgrade/CONNECT: bytes after the message are not HTTP */
  uint64_t body_bytes;      /**< body bytes delivered so far */
  size_t held_len;          /**< OSR_H1P_HELD: length of the held chunk */

  /* ---- failure ---- */
  int status;               /**< HTTP status to answer, 0 if none */
  int err;                  /**< OSR_E* */

  /* private */
  llhttp_t _ll;
  const osr_h1p_events_t *_ev;
  osr_buf_t head;           /* target/reason, then name\0value pairs */
  struct osr_h1p_span_s {
    uint32_t name_off, name_len, value_off, value_len;
  } *_spans;
  size_t _nspans, _spans_cap;
  void *_index;             /* pooled block holding _spans and/or _hdrs */
  osr_http_header_t *_hdrs; /* built at head complete */
  size_t _hdrs_cap;
  size_t _max_url, _max_header_bytes, _max_headers;
  uint64_t _max_body;
  size_t _url_len, _header_bytes, _nfields, _field_bytes;
  size_t _ext_bytes;
  int _is_request;
  int _begun;               /* a message began and is not complete */
  int _head_done;           /* its head is complete */
  int _in_value;            /* last header callback was for a value */
  int _in_trailers;
  int _paused;              /* llhttp is paused (HELD or MESSAGE) */
  int _held;                /* set by the body callback wrapper */
  int _msg_done;
  int _failed;
  const char *_exec_start;  /* bytes of the current execute call */
  char _prev_byte;          /* last byte of the previous execute call */
};

/**
 * Initialise a parser for requests (is_request=1) or responses. The caps
 * come from `limits` (zero fields must already hold defaults); max_body 0
 * means unlimited (responses). Allocates nothing until the first bytes.
 */
void osr__h1p_init(osr_h1p_t *p, int is_request, const osr_http_limits_t *limits,
                   uint64_t max_body, const osr_h1p_events_t *ev, void *data);

/** Free the parser's memory. */
void osr__h1p_dispose(osr_h1p_t *p);

/** Clear a failure and start afresh at a message boundary. */
void osr__h1p_reset(osr_h1p_t *p);
/** Between messages (after on_complete, before the next bytes), give the
 *  head's memory back so an idle connection holds none; the previous
 *  message's results (headers, target, reason) are invalid afterwards.
 *  No-op while a message is in progress. */
void osr__h1p_trim(osr_h1p_t *p);

/**
 * Parse `len` bytes. Sets *consumed to the number of bytes the caller may
 * drop from the front of its buffer. For OSR_H1P_HELD the held chunk is the
 * `p->held_len` bytes right after *consumed (not counted as consumed): keep
 * them where they are until the hold ends, then drop them too and call
 * execute with what follows. Returns OSR_H1P_DONE, OSR_H1P_HELD,
 * OSR_H1P_MESSAGE or a negative OSR_E* (see the file comment).
 */
int osr__h1p_execute(osr_h1p_t *p, const char *data, size_t len, size_t *consumed);

/**
 * The peer ended its stream. Completes a read-until-close response body
 * (on_complete fires). Returns 0 if the stream ended at a message boundary
 * or completed a message, OSR_EPROTO for a truncated message.
 */
int osr__h1p_finish(osr_h1p_t *p);

/** True while a message is partly received (begun, not complete). */
int osr__h1p_in_message(const osr_h1p_t *p);

/** True when the head is complete and the body (if any) is not yet. */
int osr__h1p_in_body(const osr_h1p_t *p);

/** Bytes of a Content-Length body still to come after those delivered (and
 *  held); 0 for a chunked or read-until-close body, or outside a body. */
uint64_t osr__h1p_body_left(const osr_h1p_t *p);

/** The owner took `n` (< osr__h1p_body_left) body bytes off the wire
 *  itself (splice(2)) between two execute calls: they count as delivered
 *  and the parser expects only the rest, whose last byte completes the
 *  message as usual. */
void osr__h1p_skip_body(osr_h1p_t *p, uint64_t n);

#endif
