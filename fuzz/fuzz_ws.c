/*
 * Fuzz the WebSocket module from memory (no sockets, no timers).
 *
 * Input: byte 0 selects the mode, byte 1 the chunk size used to feed the
 * rest (so the frame scanner and wslay are resumed at arbitrary points),
 * then the bytes "from the peer":
 *   mode % 4 == 0  a server session (client frames, masked)
 *   mode % 4 == 1  a client session (server frames, unmasked)
 *   mode % 4 == 2  the client's handshake-response parser, then, if the head
 *                  is accepted, a client session on the bytes after it
 *   mode % 4 == 3  UTF-8 validation and the header token/key helpers
 * The session echoes every message (exercising the send path and the
 * output cap), closes on a message "close", and pauses/resumes reading on
 * "stop". Caps are small so the limits are reached quickly.
 */
#include <stdint.h>
#include <string.h>

#include "net/ws.h"
#include "net/ws_internal.h"
#include "util/log.h"

typedef struct fz_s {
  int messages;
  int closes;
} fz_t;

static void fz_message(osr_ws_t *ws, int op, const osr_iovec_t *m, void *data)
{
  fz_t *f = data;
  f->messages++;
  if (m->len == 5 && memcmp(m->base, "close", 5) == 0) {
    osr_ws_close(ws, 4000, "fuzz");
    return;
  }
  if (m->len == 4 && memcmp(m->base, "stop", 4) == 0) {
    osr_ws_read_stop(ws);
    osr_ws_read_start(ws);
  }
  if (m->len == 4 && memcmp(m->base, "ping", 4) == 0)
    (void)osr_ws_ping(ws, "p", 1);
  (void)osr_ws_send(ws, op, m->base, m->len);
}

static void fz_close(osr_ws_t *ws, int code, const osr_iovec_t *reason, void *data)
{
  fz_t *f = data;
  (void)ws;
  (void)code;
  (void)reason;
  f->closes++;
  if (f->closes != 1)
    __builtin_trap(); /* on_close exactly once */
}

static const osr_ws_events_t fz_events = {
    .on_message = fz_message,
    .on_close = fz_close,
};

static void run_session(int is_server, const uint8_t *p, size_t n, size_t chunk)
{
  osr_ws_opts_t o;
  osr_ws_t *ws;
  fz_t f = {0, 0};

  memset(&o, 0, sizeof(o));
  o.max_message = 64 * 1024;
  o.max_fragments = 8;
  o.max_queued = 16 * 1024;
  osr__ws_mem_new(is_server, &o, &fz_events, &f, 4096, &ws);
  for (size_t off = 0; off < n; off += chunk) {
    size_t len = n - off < chunk ? n - off : chunk;
    if (osr__ws_mem_feed(ws, p + off, len) != 0)
      break;
    /* The "peer" reads everything we wrote. */
    osr_buf_t *out = osr__ws_mem_output(ws);
    osr_buf_consume(out, out->len);
  }
  osr__ws_mem_free(ws);
  if (f.closes != 1)
    __builtin_trap();
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
  (void)argc;
  (void)argv;
  osr_log_set_level(OSR_LOG_OFF);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  static const char *const offered[] = {"echo.v1", "chat.v2"};

  if (size < 2 || size > 1024 * 1024)
    return 0;
  int mode = data[0] % 4;
  size_t chunk = data[1] == 0 ? size : data[1];
  const uint8_t *p = data + 2;
  size_t n = size - 2;

  switch (mode) {
  case 0:
  case 1:
    run_session(mode == 0, p, n, chunk);
    break;
  case 2: {
    size_t head = 0;
    int proto, status;
    int rv = osr__ws_parse_response((const char *)p, n, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", offered,
                                    2, &head, &proto, &status);
    if (rv == 0) {
      if (head > n || proto >= 2)
        __builtin_trap();
      run_session(0, p + head, n - head, chunk);
    }
    break;
  }
  default: {
    osr_iovec_t v = osr_iov(p, n);
    (void)osr__ws_utf8_valid(p, n);
    (void)osr__ws_has_token(&v, "upgrade");
    (void)osr__ws_key_is_valid(&v);
    char acc[OSR_WS_ACCEPT_LEN];
    (void)osr__ws_accept_key((const char *)p, n, acc);
    break;
  }
  }
  return 0;
}
