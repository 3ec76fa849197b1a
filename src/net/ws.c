/*
 * WebSocket (RFC 6455) on wslay's event API, over osr_sock_t. See ws.h for
 * the contract; this file explains the mechanics.
 *
 * Receiving. wslay pulls bytes through recv_cb, which copies them out of
 * sock->input and consumes what it handed over. Two things are layered on
 * top of wslay here:
 *
 *  - A tiny frame-header scanner (scan_t) sees every byte before wslay does.
 *    It hands wslay at most one frame at a time, so wslay's 4 KiB input
 *    buffer never holds bytes of the *next* frame; that makes pausing exact:
 *    when the owner calls osr_ws_read_stop() from on_message, or our output
 *    queue is over its cap, recv_cb says WOULDBLOCK at the next frame and
 *    nothing more is parsed. The scanner also catches the framing errors that
 *    wslay's frame layer would answer with an empty close frame (control
 *    frame > 125 bytes or fragmented, non-minimal or 2^63 lengths), so those
 *    get a proper 1002 instead.
 *  - Messages are reassembled by us (wslay's no_buffering mode) into an
 *    osr_buf_t capped at max_message, allocated with osr_try_* (STYLE 9), with
 *    the fragment count and running size checked when each frame starts
 *    (1008 past max_fragments, 1009 past max_message). wslay still checks
 *    UTF-8 of text (1007), reserved bits, opcodes and masking (1002), answers
 *    pings and echoes the peer's close.
 *
 * Sending. wslay's send_cb must accept bytes synchronously, so it copies
 * them into `out` (capped at OUT_CHUNK); `out` is swapped into `inflight` and
 * written with osr_sock_write, one write in flight (STYLE 15). While that
 * write runs wslay_event_send refills `out`; the rest of the queued messages
 * wait inside wslay. queued_bytes() = wslay's queue + out + inflight is what
 * max_queued caps: osr_ws_send answers OSR_EAGAIN at or above it, and reading
 * pauses above it (a peer that floods pings and never reads gets its pongs
 * queued only up to the cap, then we stop reading it). Both resume when the
 * queue drained below half.
 *
 * Closing. A close frame is queued (by osr_ws_close, by wslay echoing the
 * peer's, or by us on a protocol error); once it has been written and no
 * more frames will be read, we shut the write side down and "linger":
 * discard input until the peer's EOF, so the kernel does not answer unread
 * bytes with a RST that could destroy our close frame in flight. One timer
 * bounds the whole closing phase (close_timeout_ms). Then the socket and the
 * timer are closed, and when both close callbacks have run, on_close fires
 * and the struct is freed (STYLE 20). Nothing is freed inside a wslay
 * callback or an owner callback (STYLE 19): the only free happens in
 * final(), which runs from a libuv close callback.
 *
 * The same session code runs over a memory transport (no socket, no timer)
 * for the fuzzer and unit tests; `mem` marks it.
 */
#include "net/ws.h"

#include <string.h>
#include <strings.h>
#include <wslay/wslay.h>

#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#if defined(OSR_TLS_BORINGSSL)
#include <openssl/base64.h>
#endif

#include "net/connect.h"
#include "net/tls.h"
#include "net/ws_internal.h"
#include "util/log.h"
#include "util/mem.h"

#define WS_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
/* Frames copied out of wslay per write; two of these per connection at most. */
#define OUT_CHUNK (256 * 1024)
/* A reassembly buffer larger than this is released after each message so an
 * idle connection does not keep a large message's memory. */
#define MSG_KEEP (64 * 1024)
#define MAX_RESPONSE_HEADERS 100
#define MAX_REASON 123

typedef enum ws_state_e {
  WS_CONNECTING, /* client: osr_connect pending */
  WS_HANDSHAKE,  /* client: request sent, waiting for the 101 */
  WS_UPGRADING,  /* server: waiting for osr_http_upgrade's callback */
  WS_OPEN,
  WS_CLOSING,    /* a close frame is queued or sent */
  WS_LINGER,     /* close done, write side shut, waiting for the peer's EOF */
  WS_FINISHING,  /* handles closing; final() follows */
} ws_state_t;

/* Frame-header scanner states. */
enum { SCAN_B0, SCAN_B1, SCAN_EXT, SCAN_MASK, SCAN_PAYLOAD };

typedef struct scan_s {
  uint8_t st;
  uint8_t need;   /* bytes left in the extended length or mask key */
  uint8_t extlen; /* 2 or 8 */
  uint8_t masked;
  uint8_t ctrl;
  uint8_t fin;
  uint64_t len;       /* extended length being assembled */
  uint64_t remaining; /* payload bytes left in the current frame */
} scan_t;

struct osr_ws_s {
  void *data;
  osr_ws_events_t ev;
  osr_ws_opts_t opts;  /* subprotocols point into protos */
  char **protos;       /* our copy of the subprotocol list */
  const char *proto;   /* negotiated, points into protos; NULL = none */
  int is_server;
  int mem;             /* memory transport (fuzz/unit) */
  ws_state_t state;

  uv_loop_t *loop;
  osr_sock_t *sock;    /* NULL before attach and after its on_close */
  osr_buf_t *in;       /* &sock->input, or &mem_in */
  uv_timer_t timer;
  int timer_inited;
  int handles_open;    /* sock + timer still to close before final() */

  wslay_event_context_ptr ctx;
  scan_t scan;
  int scan_err;        /* framing error seen by the scanner: close 1002 */
  int failing;         /* we queued an error close; ignore further data */
  int in_recv;         /* inside wslay_event_recv */
  int in_final;

  /* reassembly of the current message */
  osr_buf_t msg;
  int cur_ctrl;        /* the frame being received is a control frame */
  size_t nfrags;
  uint64_t msg_total;

  /* output */
  osr_buf_t out;       /* filled by wslay's send_cb */
  osr_buf_t inflight;  /* being written */
  int writing;
  /* osr_ws_sendv: one frame written by reference (header ours, payload the
   * caller's until dcb), after everything wslay holds */
  int dpending; /* queued, not yet handed to the socket */
  int dwriting; /* its write is in flight (writing is set too) */
  size_t dlen;  /* header + payload bytes */
  size_t dn;    /* iovecs in diov */
  osr_iovec_t diov[OSR_WS_SENDV_MAX + 1];
  uint8_t dhdr[10];
  osr_ws_sendv_cb dcb;
  void *darg;
  int want_writable;   /* osr_ws_send returned OSR_EAGAIN */
  int user_paused;     /* osr_ws_read_stop */
  int queue_paused;    /* reading paused because output is over the cap */
  int peer_eof;
  int pong_outstanding;

  /* close bookkeeping */
  int close_received;
  int peer_code;
  char peer_reason[MAX_REASON + 1];
  size_t peer_reason_len;
  int open_failed;     /* client: on_open reported an error; no on_close */
  int closed_reported;
  int close_pending;   /* server: osr_ws_close before the upgrade finished */
  /* Our close frame waits until the messages queued before it are out:
   * wslay sends control frames ahead of queued data, and nothing after a
   * close, so queueing it at once would drop them. */
  int close_wanted;
  uint16_t close_code;
  char close_reason[MAX_REASON];
  size_t close_reason_len;
  /* The peer's close frame is next but our output queue is not empty: hold
   * it back so wslay's automatic echo does not overtake (and drop) replies
   * to the messages before it. */
  int close_hold;

  /* client */
  osr_connect_t *creq;
  int timed_out;
  uint64_t timeout_ms;
  char accept[OSR_WS_ACCEPT_LEN];

  /* memory transport */
  osr_buf_t mem_in;
  osr_buf_t mem_out;
};

static void process(osr_ws_t *ws);
static void flush(osr_ws_t *ws);
static void finish(osr_ws_t *ws);
static void update_reading(osr_ws_t *ws);
static void check_closing(osr_ws_t *ws);
static void on_timer(uv_timer_t *t);

/* ========================================================================== */
/* Handshake helpers                                                           */

int osr__ws_accept_key(const char *key, size_t keylen, char out[OSR_WS_ACCEPT_LEN])
{
  unsigned char cat[128];
  unsigned char md[SHA_DIGEST_LENGTH];

  if (keylen > sizeof(cat) - (sizeof(WS_GUID) - 1))
    return OSR_EINVAL;
  memcpy(cat, key, keylen);
  memcpy(cat + keylen, WS_GUID, sizeof(WS_GUID) - 1);
  SHA1(cat, keylen + sizeof(WS_GUID) - 1, md);
  /* 20 bytes encode to 28 characters plus the NUL EVP_EncodeBlock writes. */
  EVP_EncodeBlock((unsigned char *)out, md, sizeof(md));
  return 0;
}

static int is_b64(char c)
{
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
         c == '/';
}

int osr__ws_key_is_valid(const osr_iovec_t *v)
{
  /* 16 bytes of base64: 22 symbols and "==" (the same check as npm ws). */
  if (v->len != 24 || v->base[22] != '=' || v->base[23] != '=')
    return 0;
  for (size_t i = 0; i < 22; i++)
    if (!is_b64(v->base[i]))
      return 0;
  return 1;
}

static int is_ows(char c)
{
  return c == ' ' || c == '\t';
}

/* Trim optional white space around s[0..len). */
static osr_iovec_t trim(const char *s, size_t len)
{
  while (len > 0 && is_ows(s[0])) {
    s++;
    len--;
  }
  while (len > 0 && is_ows(s[len - 1]))
    len--;
  return osr_iov(s, len);
}

/* Calls fn for each element of a comma-separated list; stops when fn returns
 * non-zero and returns that. */
static int for_each_token(const osr_iovec_t *v, int (*fn)(osr_iovec_t tok, void *arg), void *arg)
{
  size_t i = 0;
  while (i <= v->len) {
    size_t j = i;
    while (j < v->len && v->base[j] != ',')
      j++;
    osr_iovec_t t = trim(v->base + i, j - i);
    if (t.len != 0) {
      int rv = fn(t, arg);
      if (rv != 0)
        return rv;
    }
    i = j + 1;
  }
  return 0;
}

static int tok_eq_ci(osr_iovec_t tok, void *arg)
{
  const char *want = arg;
  return strlen(want) == tok.len && strncasecmp(tok.base, want, tok.len) == 0;
}

int osr__ws_has_token(const osr_iovec_t *v, const char *token)
{
  return for_each_token(v, tok_eq_ci, (void *)token);
}

static int iov_eq_ci(const osr_iovec_t *v, const char *s)
{
  return v->len == strlen(s) && strncasecmp(v->base, s, v->len) == 0;
}

/* Does any Sec-WebSocket-Protocol header of the request list `proto`?
 * Subprotocol names are compared exactly (RFC 6455 treats them as tokens
 * whose case matters). */
typedef struct proto_find_s {
  const char *name;
} proto_find_t;

static int tok_eq(osr_iovec_t tok, void *arg)
{
  proto_find_t *f = arg;
  return strlen(f->name) == tok.len && memcmp(tok.base, f->name, tok.len) == 0;
}

static int req_offers(const osr_http_req_t *req, const char *proto)
{
  proto_find_t f = {proto};
  for (size_t i = 0; i < req->num_headers; i++) {
    const osr_http_header_t *h = &req->headers[i];
    if (iov_eq_ci(&h->name, "sec-websocket-protocol") && for_each_token(&h->value, tok_eq, &f))
      return 1;
  }
  return 0;
}

int osr__ws_check_request(const osr_http_req_t *req, const char *const *protos, size_t nprotos,
                          char accept[OSR_WS_ACCEPT_LEN], int *proto, const char **why)
{
  const osr_iovec_t *v;

  *proto = -1;
  if (req->version != 11) {
    /* HTTP/1.0 has no Upgrade; HTTP/2 would need RFC 8441 (not done). */
    *why = "websocket upgrade needs HTTP/1.1";
    return 400;
  }
  if (!iov_eq_ci(&req->method, "GET")) {
    *why = "websocket upgrade must be GET";
    return 400;
  }
  if (req->expect_body) {
    *why = "websocket upgrade must not have a body";
    return 400;
  }
  v = osr_http_req_header(req, "upgrade");
  if (v == NULL || !osr__ws_has_token(v, "websocket")) {
    *why = "missing Upgrade: websocket";
    return 400;
  }
  v = osr_http_req_header(req, "connection");
  if (v == NULL || !osr__ws_has_token(v, "upgrade")) {
    *why = "missing Connection: upgrade";
    return 400;
  }
  /* Version before key: a client speaking another version gets 426 and
   * the version we support even if its key format differs. */
  v = osr_http_req_header(req, "sec-websocket-version");
  if (v == NULL) {
    *why = "missing Sec-WebSocket-Version";
    return 426;
  }
  osr_iovec_t ver = trim(v->base, v->len);
  if (ver.len != 2 || memcmp(ver.base, "13", 2) != 0) {
    *why = "unsupported Sec-WebSocket-Version";
    return 426;
  }
  v = osr_http_req_header(req, "sec-websocket-key");
  if (v == NULL) {
    *why = "missing Sec-WebSocket-Key";
    return 400;
  }
  osr_iovec_t key = trim(v->base, v->len);
  if (!osr__ws_key_is_valid(&key)) {
    *why = "invalid Sec-WebSocket-Key";
    return 400;
  }
  /* Exactly one key: two could be a confused or smuggling intermediary. */
  size_t nkeys = 0;
  for (size_t i = 0; i < req->num_headers; i++)
    if (iov_eq_ci(&req->headers[i].name, "sec-websocket-key"))
      nkeys++;
  if (nkeys != 1) {
    *why = "duplicate Sec-WebSocket-Key";
    return 400;
  }
  osr__ws_accept_key(key.base, key.len, accept);
  /* The server's order of preference decides (RFC 6455 4.2.2 leaves the
   * choice to the server). No common protocol: answer without the header,
   * as the RFC says; a client that insists on one fails the connection. */
  for (size_t i = 0; i < nprotos; i++) {
    if (req_offers(req, protos[i])) {
      *proto = (int)i;
      break;
    }
  }
  return 0;
}

int osr__ws_utf8_valid(const void *p, size_t len)
{
  const unsigned char *s = p;
  size_t i = 0;

  while (i < len) {
    unsigned c = s[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t n;
    unsigned min, cp;
    if ((c & 0xe0) == 0xc0) {
      n = 1;
      cp = c & 0x1f;
      min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
      cp = c & 0x0f;
      min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3;
      cp = c & 0x07;
      min = 0x10000;
    } else {
      return 0;
    }
    if (len - i - 1 < n)
      return 0;
    for (size_t k = 1; k <= n; k++) {
      if ((s[i + k] & 0xc0) != 0x80)
        return 0;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return 0;
    i += n + 1;
  }
  return 1;
}

/* ---- client: the response head -------------------------------------------- */

static const char *find_crlfcrlf(const char *p, size_t len)
{
  for (size_t i = 0; i + 3 < len; i++)
    if (p[i] == '\r' && p[i + 1] == '\n' && p[i + 2] == '\r' && p[i + 3] == '\n')
      return p + i;
  return NULL;
}

static int is_tchar(char c)
{
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

int osr__ws_parse_response(const char *p, size_t len, const char *expect_accept,
                           const char *const *offered, size_t noffered, size_t *head_len,
                           int *proto, int *status)
{
  size_t scan = len < OSR_WS_MAX_RESPONSE_HEAD ? len : OSR_WS_MAX_RESPONSE_HEAD;
  const char *end = find_crlfcrlf(p, scan);
  int has_upgrade = 0, has_connection = 0, has_accept = 0, nproto = 0;
  size_t nheaders = 0;

  *proto = -1;
  *status = 0;
  if (end == NULL)
    return len >= OSR_WS_MAX_RESPONSE_HEAD ? OSR_ETOOLARGE : OSR_EAGAIN;
  *head_len = (size_t)(end - p) + 4;

  /* Status line: HTTP/1.1 SP 3DIGIT [SP reason] CRLF. */
  const char *line = p;
  const char *eol = memchr(line, '\r', (size_t)(end + 2 - line));
  if (eol == NULL || eol[1] != '\n')
    return OSR_EHTTP;
  size_t ll = (size_t)(eol - line);
  if (ll < 12 || memcmp(line, "HTTP/1.1 ", 9) != 0)
    return OSR_EHTTP;
  for (int i = 9; i < 12; i++)
    if (line[i] < '0' || line[i] > '9')
      return OSR_EHTTP;
  if (ll > 12 && line[12] != ' ')
    return OSR_EHTTP;
  *status = (line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0');
  if (*status != 101)
    return OSR_EHTTP;

  line = eol + 2;
  while (line < end + 2) {
    eol = memchr(line, '\r', (size_t)(end + 2 - line));
    if (eol == NULL || eol[1] != '\n')
      return OSR_EHTTP;
    if (eol == line)
      break; /* the empty line */
    if (++nheaders > MAX_RESPONSE_HEADERS)
      return OSR_EHTTP;
    const char *colon = memchr(line, ':', (size_t)(eol - line));
    if (colon == NULL || colon == line)
      return OSR_EHTTP;
    for (const char *c = line; c < colon; c++)
      if (!is_tchar(*c)) /* also rejects obs-fold and space before ':' */
        return OSR_EHTTP;
    for (const char *c = colon + 1; c < eol; c++)
      if (*c == '\n' || *c == '\0')
        return OSR_EHTTP;
    osr_iovec_t name = osr_iov(line, (size_t)(colon - line));
    osr_iovec_t value = trim(colon + 1, (size_t)(eol - colon - 1));

    if (iov_eq_ci(&name, "upgrade")) {
      has_upgrade |= osr__ws_has_token(&value, "websocket");
    } else if (iov_eq_ci(&name, "connection")) {
      has_connection |= osr__ws_has_token(&value, "upgrade");
    } else if (iov_eq_ci(&name, "sec-websocket-accept")) {
      if (has_accept++ || value.len != strlen(expect_accept) ||
          memcmp(value.base, expect_accept, value.len) != 0)
        return OSR_EWS;
    } else if (iov_eq_ci(&name, "sec-websocket-protocol")) {
      /* One protocol, one of ours (RFC 6455 4.1, client step 6). */
      if (nproto++ != 0)
        return OSR_EWS;
      for (size_t i = 0; i < noffered; i++) {
        if (strlen(offered[i]) == value.len && memcmp(offered[i], value.base, value.len) == 0) {
          *proto = (int)i;
          break;
        }
      }
      if (*proto < 0)
        return OSR_EWS;
    } else if (iov_eq_ci(&name, "sec-websocket-extensions")) {
      if (value.len != 0)
        return OSR_EWS; /* we offer none */
    }
    line = eol + 2;
  }
  if (!has_upgrade || !has_connection || !has_accept)
    return OSR_EWS;
  return 0;
}

/* ========================================================================== */
/* Frame scanner                                                               */

/* Hand at most up to the end of the current frame; stop before a framing
 * error (and set *err). Returns the number of bytes that may go to wslay. */
static size_t scan_frames(scan_t *sc, const uint8_t *p, size_t n, int *err)
{
  size_t i = 0;

  while (i < n) {
    switch (sc->st) {
    case SCAN_B0:
      sc->fin = (p[i] >> 7) & 1;
      sc->ctrl = (p[i] >> 3) & 1;
      sc->st = SCAN_B1;
      i++;
      break;
    case SCAN_B1: {
      uint8_t len7 = p[i] & 0x7f;
      if (sc->ctrl && (len7 > 125 || !sc->fin)) {
        *err = 1;
        return i;
      }
      sc->masked = (p[i] >> 7) & 1;
      i++;
      if (len7 >= 126) {
        sc->st = SCAN_EXT;
        sc->extlen = sc->need = len7 == 126 ? 2 : 8;
        sc->len = 0;
        break;
      }
      sc->remaining = len7;
      goto header_done;
    }
    case SCAN_EXT:
      sc->len = (sc->len << 8) | p[i];
      if (--sc->need != 0) {
        i++;
        break;
      }
      /* RFC 6455 5.2: the minimal number of bytes must be used, and the
       * most significant bit of a 64-bit length must be 0. */
      if ((sc->extlen == 2 && sc->len < 126) ||
          (sc->extlen == 8 && (sc->len < 65536 || (sc->len >> 63) != 0))) {
        *err = 1;
        return i;
      }
      i++;
      sc->remaining = sc->len;
      goto header_done;
    case SCAN_MASK:
      i++;
      if (--sc->need == 0)
        goto mask_done;
      break;
    case SCAN_PAYLOAD: {
      uint64_t take = n - i < sc->remaining ? n - i : sc->remaining;
      i += (size_t)take;
      sc->remaining -= take;
      if (sc->remaining == 0) {
        sc->st = SCAN_B0;
        return i;
      }
      break;
    }
    }
    continue;
  header_done:
    if (sc->masked) {
      sc->st = SCAN_MASK;
      sc->need = 4;
      continue;
    }
  mask_done:
    if (sc->remaining == 0) {
      sc->st = SCAN_B0;
      return i; /* an empty frame ends here */
    }
    sc->st = SCAN_PAYLOAD;
  }
  return i;
}

/* ========================================================================== */
/* Session                                                                     */

static size_t queued_bytes(osr_ws_t *ws)
{
  return wslay_event_get_queued_msg_length(ws->ctx) + ws->out.len + ws->inflight.len +
         (ws->dpending ? ws->dlen : 0);
}

/* Messages queued in wslay, or an osr_ws_sendv frame pending or being
 * written: what a close (ours, or wslay's echo of the peer's) waits for.
 * The frame in flight counts too: its callback is where a producer that
 * sends one frame at a time queues the next one, which must not be
 * overtaken either. */
static int output_queued(osr_ws_t *ws)
{
  return wslay_event_get_queued_msg_count(ws->ctx) != 0 || ws->dpending || ws->dwriting;
}

static int can_read(const osr_ws_t *ws)
{
  return !ws->user_paused && !ws->queue_paused && !ws->scan_err;
}

/* Queue an error close from inside or outside wslay and stop parsing. */
static void fail_proto(osr_ws_t *ws, int code, const char *reason)
{
  if (ws->failing)
    return;
  ws->failing = 1;
  OSR_LOG_DEBUG("ws", "%p failing with %d (%s)", (void *)ws, code, reason);
  /* NO_MORE_MSG: a close is already queued; that one stands. */
  (void)wslay_event_queue_close(ws->ctx, (uint16_t)code, (const uint8_t *)reason, strlen(reason));
  wslay_event_shutdown_read(ws->ctx);
}

static ssize_t recv_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags,
                       void *user)
{
  osr_ws_t *ws = user;
  (void)flags;

  if (ws->in != NULL && ws->in->len != 0 && can_read(ws)) {
    /* Over the output cap: stop here until the peer reads (STYLE 14). */
    ws->close_hold =
        ws->scan.st == SCAN_B0 && (ws->in->base[ws->in->off] & 0x0f) == 0x8 && output_queued(ws);
    if (queued_bytes(ws) >= ws->opts.max_queued) {
      ws->queue_paused = 1;
    } else if (!ws->close_hold) {
      size_t n = ws->in->len < len ? ws->in->len : len;
      int err = 0;
      n = scan_frames(&ws->scan, (const uint8_t *)osr_buf_data(ws->in), n, &err);
      if (err)
        ws->scan_err = 1;
      if (n != 0) {
        memcpy(buf, osr_buf_data(ws->in), n);
        osr_buf_consume(ws->in, n);
        return (ssize_t)n;
      }
    }
  }
  wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
  return -1;
}

static ssize_t send_cb(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags,
                       void *user)
{
  osr_ws_t *ws = user;
  size_t room = ws->out.max - ws->out.len;
  (void)flags;

  if (room == 0 || ws->state >= WS_LINGER) {
    wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
    return -1;
  }
  if (len > room)
    len = room;
  if (osr_buf_append(&ws->out, data, len) != 0) {
    wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
    return -1;
  }
  return (ssize_t)len;
}

static int genmask_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, void *user)
{
  (void)ctx;
  (void)user;
  return RAND_bytes(buf, (int)len) == 1 ? 0 : -1;
}

static void on_frame_start(wslay_event_context_ptr ctx,
                           const struct wslay_event_on_frame_recv_start_arg *arg, void *user)
{
  osr_ws_t *ws = user;
  (void)ctx;

  ws->cur_ctrl = wslay_is_ctrl_frame(arg->opcode);
  if (ws->cur_ctrl || ws->failing)
    return;
  if (arg->opcode != WSLAY_CONTINUATION_FRAME) {
    osr_buf_consume(&ws->msg, ws->msg.len);
    ws->nfrags = 0;
    ws->msg_total = 0;
  }
  if (++ws->nfrags > ws->opts.max_fragments) {
    fail_proto(ws, WSLAY_CODE_POLICY_VIOLATION, "too many fragments");
    return;
  }
  if (arg->payload_length > ws->opts.max_message - ws->msg_total) {
    fail_proto(ws, WSLAY_CODE_MESSAGE_TOO_BIG, "message too big");
    return;
  }
  ws->msg_total += arg->payload_length;
}

static void on_frame_chunk(wslay_event_context_ptr ctx,
                           const struct wslay_event_on_frame_recv_chunk_arg *arg, void *user)
{
  osr_ws_t *ws = user;
  (void)ctx;

  if (ws->cur_ctrl || ws->failing || arg->data_length == 0)
    return;
  int rv = osr_buf_append(&ws->msg, arg->data, arg->data_length);
  if (rv == OSR_ETOOLARGE)
    fail_proto(ws, WSLAY_CODE_MESSAGE_TOO_BIG, "message too big");
  else if (rv != 0)
    fail_proto(ws, WSLAY_CODE_INTERNAL_SERVER_ERROR, "out of memory");
}

static void on_msg(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg,
                   void *user)
{
  osr_ws_t *ws = user;
  (void)ctx;

  switch (arg->opcode) {
  case WSLAY_TEXT_FRAME:
  case WSLAY_BINARY_FRAME:
    if (!ws->failing && ws->ev.on_message != NULL) {
      osr_iovec_t m = osr_iov(osr_buf_data(&ws->msg), ws->msg.len);
      ws->ev.on_message(ws, arg->opcode == WSLAY_TEXT_FRAME ? OSR_WS_TEXT : OSR_WS_BINARY, &m,
                        ws->data);
    }
    osr_buf_consume(&ws->msg, ws->msg.len);
    if (ws->msg.cap > MSG_KEEP)
      osr_buf_dispose(&ws->msg);
    ws->nfrags = 0;
    ws->msg_total = 0;
    break;
  case WSLAY_CONNECTION_CLOSE:
    /* wslay has validated the code and the reason's UTF-8 and queued the
     * echo; keep what the peer said for on_close. */
    ws->close_received = 1;
    ws->peer_code = arg->status_code != 0 ? arg->status_code : WSLAY_CODE_NO_STATUS_RCVD;
    if (arg->msg_length > 2) {
      size_t n = arg->msg_length - 2;
      if (n > MAX_REASON)
        n = MAX_REASON;
      memcpy(ws->peer_reason, arg->msg + 2, n);
      ws->peer_reason_len = n;
    }
    break;
  case WSLAY_PONG:
    ws->pong_outstanding = 0;
    break;
  default:
    break; /* pings are answered by wslay */
  }
}

static const struct wslay_event_callbacks wslay_cbs = {
    recv_cb, send_cb, genmask_cb, on_frame_start, on_frame_chunk, NULL, on_msg,
};

static void opts_defaults(osr_ws_opts_t *o)
{
  if (o->max_message == 0)
    o->max_message = 16 * 1024 * 1024;
  if (o->max_fragments == 0)
    o->max_fragments = 1024;
  if (o->max_queued == 0)
    o->max_queued = 4 * 1024 * 1024;
  if (o->close_timeout_ms == 0)
    o->close_timeout_ms = 5000;
}

static osr_ws_t *ws_new(int is_server, const osr_ws_opts_t *opts, const osr_ws_events_t *ev,
                        void *data)
{
  osr_ws_t *ws = osr_xcalloc(1, sizeof(*ws));

  ws->is_server = is_server;
  ws->data = data;
  if (ev != NULL)
    ws->ev = *ev;
  if (opts != NULL)
    ws->opts = *opts;
  opts_defaults(&ws->opts);
  if (ws->opts.nsubprotocols != 0) {
    ws->protos = osr_xcalloc(ws->opts.nsubprotocols, sizeof(char *));
    for (size_t i = 0; i < ws->opts.nsubprotocols; i++)
      ws->protos[i] = osr_xstrdup(ws->opts.subprotocols[i]);
  }
  ws->opts.subprotocols = (const char *const *)ws->protos;
  osr_buf_init(&ws->msg, ws->opts.max_message);
  osr_buf_init(&ws->out, OUT_CHUNK);
  osr_buf_init(&ws->inflight, OUT_CHUNK);
  osr_buf_init(&ws->mem_in, 0);
  osr_buf_init(&ws->mem_out, 0);

  int rv = is_server ? wslay_event_context_server_init(&ws->ctx, &wslay_cbs, ws)
                     : wslay_event_context_client_init(&ws->ctx, &wslay_cbs, ws);
  if (rv != 0) {
    /* wslay allocates with malloc; only a small struct. Treat like xmalloc. */
    OSR_LOG_ERROR("ws", "wslay context: out of memory");
    abort();
  }
  /* We reassemble messages ourselves (capped, osr_try_*) and check the
   * running size per frame; wslay still rejects a single frame over the cap
   * before reading its payload. */
  wslay_event_config_set_no_buffering(ws->ctx, 1);
  wslay_event_config_set_max_recv_msg_length(ws->ctx, ws->opts.max_message);
  return ws;
}

/* The last step: every handle is closed. Fires on_close and frees. */
static void final(osr_ws_t *ws)
{
  if (ws->in_final)
    return;
  ws->in_final = 1;
  if (ws->dpending) {
    /* Never handed to the socket (the session ended first); before
     * on_close, after which the owner may be gone. */
    ws->dpending = 0;
    ws->dcb(ws, OSR_ECLOSED, ws->darg);
  }
  if (!ws->open_failed && !ws->closed_reported) {
    ws->closed_reported = 1;
    if (ws->ev.on_close != NULL) {
      osr_iovec_t r = osr_iov(ws->peer_reason, ws->peer_reason_len);
      ws->ev.on_close(ws, ws->close_received ? ws->peer_code : WSLAY_CODE_ABNORMAL_CLOSURE, &r,
                      ws->data);
    }
  }
  if (ws->mem) {
    ws->in_final = 0;
    return; /* freed by osr__ws_mem_free */
  }
  wslay_event_context_free(ws->ctx);
  for (size_t i = 0; i < ws->opts.nsubprotocols; i++)
    osr_free(ws->protos[i]);
  osr_free(ws->protos);
  osr_buf_dispose(&ws->msg);
  osr_buf_dispose(&ws->out);
  osr_buf_dispose(&ws->inflight);
  osr_free(ws);
}

static void on_timer_closed(uv_handle_t *h)
{
  osr_ws_t *ws = h->data;
  if (--ws->handles_open == 0)
    final(ws);
}

/* End the session: close the socket and the timer; final() runs when both
 * close callbacks have fired. */
static void finish(osr_ws_t *ws)
{
  if (ws->state == WS_FINISHING)
    return;
  ws->state = WS_FINISHING;
  if (ws->mem) {
    final(ws);
    return;
  }
  if (ws->timer_inited) {
    uv_timer_stop(&ws->timer);
    uv_close((uv_handle_t *)&ws->timer, on_timer_closed);
  }
  if (ws->sock != NULL)
    osr_sock_close(ws->sock);
  if (ws->handles_open == 0)
    final(ws);
}

static void fail_open(osr_ws_t *ws, int status)
{
  if (ws->open_failed || ws->state >= WS_OPEN)
    return;
  ws->open_failed = 1;
  OSR_LOG_DEBUG("ws", "%p connect failed: %s", (void *)ws, osr_strerror(status));
  if (ws->ev.on_open != NULL)
    ws->ev.on_open(ws, status, ws->data);
  finish(ws);
}

/* Memory transport: keep what fits under the cap for the caller to
 * inspect and drop the rest, as if written at once. */
static void mem_drain(osr_ws_t *ws)
{
  size_t room = ws->mem_out.max - ws->mem_out.len;
  size_t n = ws->out.len < room ? ws->out.len : room;
  if (n != 0 && osr_buf_append(&ws->mem_out, osr_buf_data(&ws->out), n) != 0)
    n = 0; /* out of memory: dropped like the excess */
  osr_buf_consume(&ws->out, ws->out.len);
}

static void on_write(osr_sock_t *s, int status, void *arg);

static void queue_close_if_drained(osr_ws_t *ws)
{
  if (!ws->close_wanted || output_queued(ws))
    return;
  ws->close_wanted = 0;
  /* NO_MORE_MSG: the peer's close came first and wslay echoed that one. */
  (void)wslay_event_queue_close(ws->ctx, ws->close_code, (const uint8_t *)ws->close_reason,
                                ws->close_reason_len);
}

/* Hand the osr_ws_sendv frame to the socket: wslay holds nothing (no
 * frame half sent, no message queued before it), so it goes out whole and
 * in order. Returns 0, or an error after the session was ended. */
static int direct_write(osr_ws_t *ws)
{
  if (!wslay_event_get_write_enabled(ws->ctx))
    return 0; /* our close went out first: dropped, dcb fires from final() */
  int rv =
      ws->sock != NULL ? osr_sock_write(ws->sock, ws->diov, ws->dn, on_write, ws) : OSR_ECLOSED;
  if (rv != 0) {
    finish(ws);
    return rv;
  }
  ws->dpending = 0;
  ws->dwriting = 1;
  ws->writing = 1;
  return 0;
}

/* Move frames from wslay through `out` to the socket. */
static void flush(osr_ws_t *ws)
{
  if (ws->in_recv || ws->state < WS_HANDSHAKE || ws->state >= WS_FINISHING)
    return;
  for (int round = 0; round < 64; round++) {
    if (ws->state == WS_OPEN || ws->state == WS_CLOSING) {
      if (wslay_event_want_write(ws->ctx) && wslay_event_send(ws->ctx) != 0) {
        OSR_LOG_DEBUG("ws", "%p wslay_event_send failed", (void *)ws);
        finish(ws);
        return;
      }
      if (ws->close_wanted) {
        queue_close_if_drained(ws);
        if (!ws->close_wanted && wslay_event_send(ws->ctx) != 0) {
          finish(ws);
          return;
        }
      }
    }
    if (ws->writing)
      break;
    if (ws->out.len == 0) {
      if (ws->dpending && !wslay_event_want_write(ws->ctx) && direct_write(ws) != 0)
        return; /* the session ended */
      break;
    }
    if (ws->mem) {
      mem_drain(ws);
      continue; /* memory "writes" complete at once: refill */
    }
    osr_buf_swap(&ws->out, &ws->inflight);
    osr_iovec_t iov = osr_iov(osr_buf_data(&ws->inflight), ws->inflight.len);
    int rv = ws->sock != NULL ? osr_sock_write(ws->sock, &iov, 1, on_write, ws) : OSR_ECLOSED;
    if (rv != 0) {
      osr_buf_consume(&ws->inflight, ws->inflight.len);
      if (ws->state < WS_OPEN)
        fail_open(ws, rv);
      else
        finish(ws);
      return;
    }
    ws->writing = 1;
    /* Fill `out` again while this write is in flight. */
  }
  check_closing(ws);
}

static void maybe_writable(osr_ws_t *ws)
{
  size_t low = ws->opts.max_queued / 2;
  if (queued_bytes(ws) > low)
    return;
  if (ws->queue_paused) {
    ws->queue_paused = 0;
    update_reading(ws);
  }
  if (ws->want_writable && ws->state == WS_OPEN) {
    ws->want_writable = 0;
    if (ws->ev.on_writable != NULL)
      ws->ev.on_writable(ws, ws->data);
  }
}

static void on_write(osr_sock_t *s, int status, void *arg)
{
  osr_ws_t *ws = arg;
  (void)s;

  ws->writing = 0;
  osr_buf_consume(&ws->inflight, ws->inflight.len);
  if (ws->dwriting) {
    /* The caller's payload is ours no longer (ws.h osr_ws_sendv). */
    ws->dwriting = 0;
    ws->dcb(ws, status, ws->darg);
  }
  if (ws->state == WS_FINISHING)
    return;
  if (status != 0) {
    if (ws->state < WS_OPEN)
      fail_open(ws, status);
    else
      finish(ws);
    return;
  }
  flush(ws);
  if (ws->close_hold && !output_queued(ws)) {
    ws->close_hold = 0;
    process(ws);
  }
  if (ws->state == WS_FINISHING)
    return;
  if (!ws->writing && ws->out.len == 0) {
    /* Idle: give the buffers back rather than keep 2 x OUT_CHUNK per
     * quiet connection. */
    osr_buf_dispose(&ws->inflight);
    osr_buf_dispose(&ws->out);
  }
  if (ws->state == WS_OPEN || ws->state == WS_CLOSING)
    maybe_writable(ws);
}

static void start_closing(osr_ws_t *ws)
{
  if (ws->state != WS_OPEN)
    return;
  ws->state = WS_CLOSING;
  if (ws->timer_inited) {
    /* Replaces the keepalive ping timer: the whole close is bounded. */
    uv_timer_stop(&ws->timer);
    uv_timer_start(&ws->timer, on_timer, ws->opts.close_timeout_ms, 0);
  }
}

static void on_shutdown(osr_sock_t *s, int status, void *arg)
{
  (void)s;
  (void)status;
  (void)arg;
}

/* Called whenever the close state may have advanced. */
static void check_closing(osr_ws_t *ws)
{
  if (ws->state == WS_OPEN &&
      (!wslay_event_get_read_enabled(ws->ctx) || wslay_event_get_close_sent(ws->ctx) ||
       !wslay_event_get_write_enabled(ws->ctx)))
    start_closing(ws);
  if (ws->state != WS_CLOSING)
    return;
  if (!wslay_event_get_write_enabled(ws->ctx) && !wslay_event_get_close_sent(ws->ctx)) {
    finish(ws); /* sending failed */
    return;
  }
  if (!wslay_event_get_close_sent(ws->ctx) || ws->writing || ws->out.len != 0 ||
      wslay_event_get_read_enabled(ws->ctx))
    return;
  /* Our close frame is in the kernel and no more frames will be read. */
  if (ws->mem || ws->sock == NULL || ws->peer_eof) {
    finish(ws);
    return;
  }
  ws->state = WS_LINGER;
  if (osr_sock_shutdown(ws->sock, on_shutdown, NULL) != 0) {
    finish(ws);
    return;
  }
  /* Discard whatever is already buffered; on_sock_read keeps discarding. */
  osr_buf_consume(ws->in, ws->in->len);
  update_reading(ws);
}

/* Run wslay over the buffered input, then send what it queued. */
static void process(osr_ws_t *ws)
{
  if (ws->state != WS_OPEN && ws->state != WS_CLOSING)
    return;
  if (ws->in == NULL)
    return;
  if (!wslay_event_get_read_enabled(ws->ctx)) {
    /* Waiting for our close to go out: nothing more will be parsed. */
    osr_buf_consume(ws->in, ws->in->len);
  }
  for (int pass = 0; pass < 4; pass++) {
    ws->in_recv++;
    while (ws->in != NULL && ws->in->len != 0 && can_read(ws) &&
           wslay_event_get_read_enabled(ws->ctx)) {
      size_t before = ws->in->len;
      int rv = wslay_event_recv(ws->ctx);
      if (rv != 0 && rv != WSLAY_ERR_CALLBACK_FAILURE) {
        ws->in_recv--;
        finish(ws); /* WSLAY_ERR_NOMEM */
        return;
      }
      if (ws->in->len == before)
        break;
    }
    ws->in_recv--;
    if (ws->scan_err)
      fail_proto(ws, WSLAY_CODE_PROTOCOL_ERROR, "framing error");
    flush(ws);
    if (ws->state >= WS_LINGER || ws->in == NULL)
      return;
    /* A held close can go once our queue was handed to the socket. */
    if (!ws->close_hold || output_queued(ws))
      break;
    ws->close_hold = 0;
  }
  update_reading(ws);
}

static void update_reading(osr_ws_t *ws)
{
  osr_sock_t *s = ws->sock;
  int want;

  if (s == NULL || ws->mem || ws->state == WS_FINISHING || ws->state < WS_HANDSHAKE)
    return;
  if (ws->state == WS_LINGER || ws->state == WS_HANDSHAKE)
    want = 1;
  else if (!wslay_event_get_read_enabled(ws->ctx))
    want = 1; /* discard, and notice the peer's EOF */
  else
    want = can_read(ws);
  if (want && !osr_sock_is_reading(s))
    osr_sock_read_start(s);
  else if (!want && osr_sock_is_reading(s))
    osr_sock_read_stop(s);
}

/* ---- timer ----------------------------------------------------------------- */

static void on_timer(uv_timer_t *t)
{
  osr_ws_t *ws = t->data;

  switch (ws->state) {
  case WS_CONNECTING:
    ws->timed_out = 1;
    if (ws->creq != NULL)
      osr_connect_cancel(ws->creq); /* on_connected reports ETIMEDOUT */
    break;
  case WS_HANDSHAKE:
    fail_open(ws, OSR_ETIMEDOUT);
    break;
  case WS_OPEN:
    if (ws->pong_outstanding) {
      OSR_LOG_DEBUG("ws", "%p keepalive: no pong", (void *)ws);
      finish(ws);
      break;
    }
    ws->pong_outstanding = 1;
    osr_ws_ping(ws, "osr-ka", 6);
    break;
  case WS_CLOSING:
  case WS_LINGER:
    finish(ws);
    break;
  default:
    break;
  }
}

/* ---- socket events ----------------------------------------------------------- */

static void handshake_read(osr_ws_t *ws);

static void on_sock_read(osr_sock_t *s, int status)
{
  osr_ws_t *ws = s->data;

  if (status < 0) {
    ws->peer_eof = 1;
    if (ws->state == WS_HANDSHAKE)
      fail_open(ws, status == OSR_EOF ? OSR_ECONNRESET : status);
    else
      finish(ws);
    return;
  }
  switch (ws->state) {
  case WS_HANDSHAKE:
    handshake_read(ws);
    break;
  case WS_OPEN:
  case WS_CLOSING:
    process(ws);
    break;
  case WS_LINGER:
    osr_buf_consume(&s->input, s->input.len);
    break;
  default:
    break;
  }
}

static void on_sock_close(osr_sock_t *s)
{
  osr_ws_t *ws = s->data;

  ws->sock = NULL;
  ws->in = NULL;
  if (ws->state < WS_OPEN)
    fail_open(ws, OSR_ECANCELED); /* closed under us during the handshake */
  if (ws->state != WS_FINISHING) {
    ws->state = WS_FINISHING;
    if (ws->timer_inited) {
      uv_timer_stop(&ws->timer);
      uv_close((uv_handle_t *)&ws->timer, on_timer_closed);
    }
  }
  if (--ws->handles_open == 0)
    final(ws);
}

static void on_sock_timeout(osr_sock_t *s)
{
  osr_ws_t *ws = s->data;
  if (ws->state == WS_OPEN)
    osr_ws_close(ws, WSLAY_CODE_GOING_AWAY, "idle timeout");
  else if (ws->state < WS_OPEN)
    fail_open(ws, OSR_ETIMEDOUT);
  else
    finish(ws);
}

static void on_sock_drain(osr_sock_t *s)
{
  osr_ws_t *ws = s->data;
  if (ws->state == WS_OPEN)
    osr_ws_close(ws, WSLAY_CODE_GOING_AWAY, "server shutting down");
}

static const osr_sock_events_t ws_sock_events = {
    .on_read = on_sock_read,
    .on_close = on_sock_close,
    .on_timeout = on_sock_timeout,
    .on_drain = on_sock_drain,
};

static void attach(osr_ws_t *ws, osr_sock_t *s)
{
  ws->sock = s;
  ws->loop = s->loop;
  ws->in = &s->input;
  ws->handles_open++;
  osr_sock_set_events(s, &ws_sock_events, ws);
  osr_sock_set_idle_timeout(s, ws->opts.idle_timeout_ms);
  osr_sock_set_nodelay(s, 1);
  if (!ws->timer_inited) {
    uv_timer_init(ws->loop, &ws->timer);
    ws->timer.data = ws;
    ws->timer_inited = 1;
    ws->handles_open++;
  }
}

/* The session is open: keepalive, then parse what arrived with the head. */
static void go_open(osr_ws_t *ws)
{
  ws->state = WS_OPEN;
  if (ws->timer_inited) {
    uv_timer_stop(&ws->timer);
    if (ws->opts.ping_interval_ms != 0)
      uv_timer_start(&ws->timer, on_timer, ws->opts.ping_interval_ms, ws->opts.ping_interval_ms);
  }
}

int osr__ws_new_on_sock(osr_sock_t *s, int is_server, const osr_ws_opts_t *opts,
                        const osr_ws_events_t *ev, void *data, osr_ws_t **out)
{
  osr_ws_t *ws = ws_new(is_server, opts, ev, data);
  attach(ws, s);
  go_open(ws);
  *out = ws;
  update_reading(ws);
  return 0;
}

/* ========================================================================== */
/* Server                                                                      */

static void on_upgraded(osr_sock_t *s, int status, void *arg)
{
  osr_ws_t *ws = arg;

  if (status != 0 || s == NULL) {
    /* osr_ws_accept returned 0, so on_close is owed: 1006. */
    ws->state = WS_OPEN;
    finish(ws);
    return;
  }
  attach(ws, s);
  go_open(ws);
  if (ws->close_pending)
    start_closing(ws); /* osr_ws_close was called before the 101 went out */
  flush(ws);
  update_reading(ws); /* bytes already in s->input are delivered next */
}

static void respond_error(osr_http_req_t *req, int status, const char *why)
{
  if (status == 426) {
    static const char body[] = "unsupported websocket version\n";
    osr_http_header_t h[2] = {
        {OSR_IOV_LIT("sec-websocket-version"), OSR_IOV_LIT("13")},
        {OSR_IOV_LIT("content-type"), OSR_IOV_LIT("text/plain")},
    };
    osr_iovec_t b = OSR_IOV_LIT(body);
    if (osr_http_respond(req, 426, h, 2, (int64_t)b.len) == 0)
      (void)osr_http_write(req, &b, 1, 1, NULL, NULL);
    return;
  }
  char msg[128];
  int n = snprintf(msg, sizeof(msg), "%s\n", why);
  (void)osr_http_send(req, status, "text/plain", msg, (size_t)n);
}

int osr_ws_accept(osr_http_req_t *req, const osr_ws_opts_t *opts, const osr_ws_events_t *ev,
                  void *data, osr_ws_t **out)
{
  char accept[OSR_WS_ACCEPT_LEN];
  const char *why = "";
  int proto = -1;

  if (out != NULL)
    *out = NULL;
  osr_ws_opts_t o = opts != NULL ? *opts : (osr_ws_opts_t){0};
  int st = osr__ws_check_request(req, o.subprotocols, o.nsubprotocols, accept, &proto, &why);
  if (st != 0) {
    OSR_LOG_DEBUG("ws", "rejecting upgrade from %s: %s", req->peer, why);
    respond_error(req, st, why);
    return OSR_EWS;
  }
  osr_ws_t *ws = ws_new(1, &o, ev, data);
  ws->state = WS_UPGRADING;
  if (proto >= 0)
    ws->proto = ws->protos[proto];

  osr_http_header_t h[4] = {
      {OSR_IOV_LIT("Upgrade"), OSR_IOV_LIT("websocket")},
      {OSR_IOV_LIT("Connection"), OSR_IOV_LIT("Upgrade")},
      {OSR_IOV_LIT("Sec-WebSocket-Accept"), osr_iov(accept, strlen(accept))},
      {OSR_IOV_LIT("Sec-WebSocket-Protocol"), osr_iov(ws->proto, ws->proto ? strlen(ws->proto) : 0)},
  };
  if (out != NULL)
    *out = ws;
  int rv = osr_http_upgrade(req, h, ws->proto != NULL ? 4 : 3, on_upgraded, ws);
  if (rv != 0) {
    if (out != NULL)
      *out = NULL;
    ws->open_failed = 1; /* no callbacks: the caller got an error */
    finish(ws);
    (void)osr_http_send(req, 500, "text/plain", "upgrade failed\n", 15);
    return rv;
  }
  return 0;
}

/* ========================================================================== */
/* Client                                                                      */

static void handshake_read(osr_ws_t *ws)
{
  size_t head_len = 0;
  int proto = -1, status = 0;
  osr_buf_t *in = ws->in;

  int rv = osr__ws_parse_response(osr_buf_data(in), in->len, ws->accept, ws->opts.subprotocols,
                                  ws->opts.nsubprotocols, &head_len, &proto, &status);
  if (rv == OSR_EAGAIN)
    return;
  if (rv != 0) {
    if (rv == OSR_EHTTP && status != 0)
      OSR_LOG_DEBUG("ws", "%p handshake answered %d", (void *)ws, status);
    fail_open(ws, rv);
    return;
  }
  osr_buf_consume(in, head_len);
  ws->proto = proto >= 0 ? ws->protos[proto] : NULL;
  uv_timer_stop(&ws->timer);
  go_open(ws);
  if (ws->ev.on_open != NULL)
    ws->ev.on_open(ws, 0, ws->data);
  /* Frames may have arrived right behind the head. */
  process(ws);
  check_closing(ws);
}

static void on_connected(osr_sock_t *s, int status, void *data)
{
  osr_ws_t *ws = data;

  ws->creq = NULL;
  if (status != 0) {
    fail_open(ws, ws->timed_out ? OSR_ETIMEDOUT : status);
    return;
  }
  if (ws->state != WS_CONNECTING) {
    osr_sock_close(s); /* closed meanwhile */
    return;
  }
  attach(ws, s);
  ws->state = WS_HANDSHAKE;
  flush(ws); /* the request is already in ws->out */
  update_reading(ws);
}

static int has_crlf(const char *s)
{
  return s != NULL && strpbrk(s, "\r\n") != NULL;
}

static int iov_has_crlf(const osr_iovec_t *v)
{
  return memchr(v->base, '\r', v->len) != NULL || memchr(v->base, '\n', v->len) != NULL;
}

static int build_request(osr_ws_t *ws, const char *addr, const char *path,
                         const osr_ws_connect_opts_t *opts, const char *key)
{
  osr_buf_t *b = &ws->out;
  const char *host = opts->host;
  int rv = 0;

  if (host == NULL)
    host = strncmp(addr, "unix:", 5) == 0 ? "localhost" : addr;
  if (path == NULL || path[0] != '/' || has_crlf(path) || has_crlf(host) ||
      has_crlf(opts->origin) || strchr(path, ' ') != NULL)
    return OSR_EINVAL;
  rv |= osr_buf_appendf(b,
                        "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\n"
                        "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                        "Sec-WebSocket-Version: 13\r\n",
                        path, host, key);
  if (ws->opts.nsubprotocols != 0) {
    rv |= osr_buf_appendf(b, "Sec-WebSocket-Protocol: ");
    for (size_t i = 0; i < ws->opts.nsubprotocols; i++) {
      const char *p = ws->protos[i];
      if (p[0] == '\0')
        return OSR_EINVAL;
      for (const char *c = p; *c; c++)
        if (!is_tchar(*c))
          return OSR_EINVAL;
      rv |= osr_buf_appendf(b, "%s%s", i ? ", " : "", p);
    }
    rv |= osr_buf_appendf(b, "\r\n");
  }
  if (opts->origin != NULL)
    rv |= osr_buf_appendf(b, "Origin: %s\r\n", opts->origin);
  for (size_t i = 0; i < opts->nheaders; i++) {
    const osr_http_header_t *h = &opts->headers[i];
    if (h->name.len == 0 || iov_has_crlf(&h->name) || iov_has_crlf(&h->value))
      return OSR_EINVAL;
    for (size_t k = 0; k < h->name.len; k++)
      if (!is_tchar(h->name.base[k]))
        return OSR_EINVAL;
    rv |= osr_buf_append(b, h->name.base, h->name.len);
    rv |= osr_buf_append(b, ": ", 2);
    rv |= osr_buf_append(b, h->value.base, h->value.len);
    rv |= osr_buf_append(b, "\r\n", 2);
  }
  rv |= osr_buf_append(b, "\r\n", 2);
  return rv != 0 ? OSR_EINVAL : 0;
}

int osr_ws_connect(uv_loop_t *loop, const char *addr, const char *path,
                   const osr_ws_connect_opts_t *opts, const osr_ws_events_t *ev, void *data,
                   osr_ws_t **out)
{
  osr_ws_connect_opts_t o = opts != NULL ? *opts : (osr_ws_connect_opts_t){0};
  unsigned char raw[16];
  char key[OSR_WS_KEY_LEN];
  int rv;

  if (out != NULL)
    *out = NULL;
  if (addr == NULL || RAND_bytes(raw, sizeof(raw)) != 1)
    return OSR_EINVAL;
  EVP_EncodeBlock((unsigned char *)key, raw, sizeof(raw));

  osr_ws_t *ws = ws_new(0, &o.ws, ev, data);
  ws->loop = loop;
  ws->state = WS_CONNECTING;
  ws->timeout_ms = o.timeout_ms != 0 ? o.timeout_ms : 10000;
  osr__ws_accept_key(key, strlen(key), ws->accept);
  rv = build_request(ws, addr, path, &o, key);
  if (rv == 0) {
    osr_connect_opts_t co = {.timeout_ms = ws->timeout_ms, .tls = o.tls, .sni = o.sni};
    rv = osr_connect(loop, addr, &co, on_connected, ws, &ws->creq);
  }
  if (rv != 0) {
    ws->open_failed = 1;
    ws->state = WS_FINISHING;
    final(ws);
    return rv;
  }
  /* One deadline for connect + TLS + the HTTP exchange. */
  uv_timer_init(loop, &ws->timer);
  ws->timer.data = ws;
  ws->timer_inited = 1;
  ws->handles_open++;
  uv_timer_start(&ws->timer, on_timer, ws->timeout_ms, 0);
  if (out != NULL)
    *out = ws;
  return 0;
}

/* ========================================================================== */
/* Common API                                                                  */

int osr_ws_send(osr_ws_t *ws, int op, const void *data, size_t len)
{
  if (ws->state != WS_OPEN || ws->failing)
    return OSR_ECLOSED;
  if (op != OSR_WS_TEXT && op != OSR_WS_BINARY)
    return OSR_EINVAL;
  /* Behind a frame of osr_ws_sendv's: wslay would send this one first. */
  if (queued_bytes(ws) >= ws->opts.max_queued || ws->dpending) {
    ws->want_writable = 1;
    return OSR_EAGAIN;
  }
  if (op == OSR_WS_TEXT && !osr__ws_utf8_valid(data, len))
    return OSR_EINVAL;
  struct wslay_event_msg m = {
      (uint8_t)(op == OSR_WS_TEXT ? WSLAY_TEXT_FRAME : WSLAY_BINARY_FRAME),
      (const uint8_t *)data,
      len,
  };
  int rv = wslay_event_queue_msg(ws->ctx, &m);
  if (rv == WSLAY_ERR_NOMEM)
    return OSR_ENOMEM;
  if (rv != 0)
    return OSR_ECLOSED;
  flush(ws);
  return 0;
}

int osr_ws_sendv(osr_ws_t *ws, int op, const osr_iovec_t *bufs, size_t nbufs, osr_ws_sendv_cb cb,
                 void *arg)
{
  if (ws->state != WS_OPEN || ws->failing)
    return OSR_ECLOSED;
  if (!ws->is_server || ws->mem || nbufs > OSR_WS_SENDV_MAX ||
      (op != OSR_WS_TEXT && op != OSR_WS_BINARY) || (op == OSR_WS_TEXT && nbufs > 1))
    return OSR_EINVAL;
  if (ws->dpending || ws->dwriting)
    return OSR_EBUSY;
  if (queued_bytes(ws) >= ws->opts.max_queued) {
    ws->want_writable = 1;
    return OSR_EAGAIN;
  }
  uint64_t len = 0;
  for (size_t i = 0; i < nbufs; i++)
    len += bufs[i].len;
  if (op == OSR_WS_TEXT && nbufs == 1 && !osr__ws_utf8_valid(bufs[0].base, bufs[0].len))
    return OSR_EINVAL;
  /* RFC 6455 5.2: FIN + opcode, no mask (a server's frame), the shortest
   * length encoding. */
  uint8_t *h = ws->dhdr;
  size_t hl = 2;
  h[0] = (uint8_t)(0x80 | (op == OSR_WS_TEXT ? WSLAY_TEXT_FRAME : WSLAY_BINARY_FRAME));
  if (len < 126) {
    h[1] = (uint8_t)len;
  } else if (len < 65536) {
    h[1] = 126;
    h[2] = (uint8_t)(len >> 8);
    h[3] = (uint8_t)len;
    hl = 4;
  } else {
    h[1] = 127;
    for (int i = 0; i < 8; i++)
      h[2 + i] = (uint8_t)(len >> (56 - 8 * i));
    hl = 10;
  }
  ws->diov[0] = osr_iov(ws->dhdr, hl);
  ws->dn = 1;
  for (size_t i = 0; i < nbufs; i++)
    if (bufs[i].len != 0)
      ws->diov[ws->dn++] = bufs[i];
  ws->dlen = hl + (size_t)len;
  ws->dcb = cb;
  ws->darg = arg;
  ws->dpending = 1;
  flush(ws);
  return 0;
}

int osr_ws_ping(osr_ws_t *ws, const void *data, size_t len)
{
  if (ws->state != WS_OPEN || ws->failing)
    return OSR_ECLOSED;
  if (len > 125)
    return OSR_EINVAL;
  struct wslay_event_msg m = {WSLAY_PING, (const uint8_t *)data, len};
  int rv = wslay_event_queue_msg(ws->ctx, &m);
  if (rv == WSLAY_ERR_NOMEM)
    return OSR_ENOMEM;
  if (rv != 0)
    return OSR_ECLOSED;
  flush(ws);
  return 0;
}

static int code_is_sendable(int code)
{
  return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) ||
         (code >= 3000 && code <= 4999);
}

void osr_ws_close(osr_ws_t *ws, int code, const char *reason)
{
  switch (ws->state) {
  case WS_CONNECTING:
  case WS_HANDSHAKE:
    if (ws->creq != NULL) {
      osr_connect_cancel(ws->creq); /* on_connected -> fail_open(ECANCELED) */
      return;
    }
    fail_open(ws, OSR_ECANCELED);
    return;
  case WS_UPGRADING:
  case WS_OPEN:
    break;
  default:
    return;
  }
  if (ws->close_wanted)
    return;
  if (!code_is_sendable(code))
    code = WSLAY_CODE_NORMAL_CLOSURE;
  size_t rlen = reason != NULL ? strlen(reason) : 0;
  if (rlen > MAX_REASON)
    rlen = MAX_REASON;
  /* Cut at a character boundary; an invalid reason is dropped. */
  while (rlen > 0 && !osr__ws_utf8_valid(reason, rlen))
    rlen--;
  ws->close_wanted = 1;
  ws->close_code = (uint16_t)code;
  if (rlen != 0)
    memcpy(ws->close_reason, reason, rlen);
  ws->close_reason_len = rlen;
  if (ws->state == WS_UPGRADING) {
    ws->close_pending = 1; /* the 101 is on its way: close once we own the socket */
    return;
  }
  start_closing(ws);
  flush(ws);
}

const char *osr_ws_subprotocol(const osr_ws_t *ws)
{
  return ws->proto;
}

void osr_ws_read_stop(osr_ws_t *ws)
{
  ws->user_paused = 1;
  update_reading(ws);
}

void osr_ws_read_start(osr_ws_t *ws)
{
  if (!ws->user_paused)
    return;
  ws->user_paused = 0;
  update_reading(ws);
  /* Bytes already buffered are delivered by the socket's kick; over the
   * memory transport, parse them now. */
  if (ws->mem && !ws->in_recv)
    process(ws);
}

void *osr_ws_data(const osr_ws_t *ws)
{
  return ws->data;
}

/* ========================================================================== */
/* Memory transport                                                            */

int osr__ws_mem_new(int is_server, const osr_ws_opts_t *opts, const osr_ws_events_t *ev,
                    void *data, size_t out_max, osr_ws_t **out)
{
  osr_ws_t *ws = ws_new(is_server, opts, ev, data);
  ws->mem = 1;
  osr_buf_init(&ws->mem_in, ws->opts.max_message + 1024 * 1024);
  osr_buf_init(&ws->mem_out, out_max);
  ws->in = &ws->mem_in;
  go_open(ws);
  *out = ws;
  return 0;
}

int osr__ws_mem_feed(osr_ws_t *ws, const void *p, size_t len)
{
  if (ws->state == WS_FINISHING)
    return OSR_ECLOSED;
  if (osr_buf_append(&ws->mem_in, p, len) != 0)
    return OSR_ENOMEM;
  process(ws);
  check_closing(ws);
  return ws->state == WS_FINISHING ? OSR_ECLOSED : 0;
}

osr_buf_t *osr__ws_mem_output(osr_ws_t *ws)
{
  return &ws->mem_out;
}

void osr__ws_mem_free(osr_ws_t *ws)
{
  if (ws->state != WS_FINISHING)
    finish(ws);
  ws->mem = 0;
  ws->in_final = 0;
  ws->closed_reported = 1;
  osr_buf_dispose(&ws->mem_in);
  osr_buf_dispose(&ws->mem_out);
  final(ws);
}
