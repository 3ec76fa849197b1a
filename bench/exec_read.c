/*
 * exec_read: the reader of the 1 GiB exec stdout row (bench/dataplane_bench.py,
 * bench/exec_ab.py). One C reader for every path, so that the reader is not
 * what bounds any of them (the Python loop it replaces spent ~0.3 s of CPU
 * per GiB and took a bytearray slice per frame):
 *
 *   exec_read connect ADDR PREFIX json|proto BYTES [HEADER...]
 *       POST PREFIX/process.Process/Start (Connect server stream, the
 *       encoding an SDK uses: application/connect+json, or
 *       application/connect+proto) running `head -c BYTES /dev/zero`, and
 *       count the stdout bytes of its data events. ADDR is unix:PATH (the
 *       agent's own socket) or HOST:PORT (a proxy in front of it).
 *   exec_read ws ADDR PATH BYTES [HEADER...]
 *       the same command through osr-dataplane's Kubernetes exec console
 *       (WebSocket v5.channel.k8s.io), counting channel-1 bytes.
 *   exec_read pipe BYTES
 *       the ceiling: the command's stdout pipe on standard input, read to
 *       its end (no agent, no socket).
 *
 * Output, one line: "bytes N seconds S MBps M" (from the request to the
 * final status), exit 0 only if BYTES stdout bytes arrived and the stream
 * ended with success.
 *
 * Cost per byte is the same for every path: read(2) into one 4 MiB buffer,
 * message headers parsed in place (a few bytes copied into a small buffer
 * only when a read or HTTP chunk boundary splits them), payload skipped,
 * never copied. Base64 payloads (JSON) are counted from their length and
 * padding, not decoded. Bench tool: libc only, blocking I/O.
 */
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define BUF_CAP   (4u << 20)
#define SMALL_MSG 4096 /* messages up to this size are copied whole */

typedef struct rd_s {
  int fd;
  uint8_t *buf;
  size_t pos, len;
  int chunked;         /* body in HTTP/1.1 chunked framing */
  uint64_t chunk_left; /* bytes left in the current chunk */
  int first_chunk;
  int body_eof;
} rd_t;

static void die(const char *msg)
{
  fprintf(stderr, "exec_read: %s\n", msg);
  exit(1);
}

/* Ensure at least `min` raw bytes are buffered (min small: never more than
 * a header). The unconsumed remainder is < min, so moving it is cheap. */
static int raw_fill(rd_t *r, size_t min)
{
  while (r->len - r->pos < min) {
    if (r->pos == r->len) {
      r->pos = r->len = 0;
    } else if (BUF_CAP - r->pos < min || BUF_CAP - r->len < 65536) {
      memmove(r->buf, r->buf + r->pos, r->len - r->pos);
      r->len -= r->pos;
      r->pos = 0;
    }
    ssize_t n = read(r->fd, r->buf + r->len, BUF_CAP - r->len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    r->len += (size_t)n;
  }
  return 0;
}

/* A CRLF-terminated line of the raw stream (chunk sizes), consumed. */
static char *raw_line(rd_t *r, char *out, size_t cap)
{
  for (size_t need = 2;; need++) {
    if (need > cap || raw_fill(r, need) != 0)
      return NULL;
    const uint8_t *p = r->buf + r->pos;
    if (p[need - 2] == '\r' && p[need - 1] == '\n') {
      memcpy(out, p, need - 2);
      out[need - 2] = '\0';
      r->pos += need;
      return out;
    }
  }
}

/* The next contiguous span of body bytes (at least one), or 0 at the end. */
static size_t body_span(rd_t *r, const uint8_t **p)
{
  if (r->body_eof)
    return 0;
  if (r->chunked && r->chunk_left == 0) {
    char line[64];
    if (!r->first_chunk && (raw_line(r, line, sizeof(line)) == NULL || line[0] != '\0'))
      die("bad chunk end");
    r->first_chunk = 0;
    if (raw_line(r, line, sizeof(line)) == NULL)
      die("truncated chunk size");
    r->chunk_left = strtoull(line, NULL, 16);
    if (r->chunk_left == 0) {
      r->body_eof = 1;
      return 0;
    }
  }
  if (raw_fill(r, 1) != 0) {
    r->body_eof = 1;
    return 0;
  }
  size_t n = r->len - r->pos;
  if (r->chunked && n > r->chunk_left)
    n = (size_t)r->chunk_left;
  *p = r->buf + r->pos;
  return n;
}

static void body_consume(rd_t *r, size_t n)
{
  r->pos += n;
  if (r->chunked)
    r->chunk_left -= n;
}

static void body_skip(rd_t *r, uint64_t n)
{
  while (n > 0) {
    const uint8_t *p;
    size_t k = body_span(r, &p);
    if (k == 0)
      die("body ended inside a message");
    if (k > n)
      k = (size_t)n;
    body_consume(r, k);
    n -= k;
  }
}

static int body_copy(rd_t *r, uint8_t *dst, size_t n)
{
  while (n > 0) {
    const uint8_t *p;
    size_t k = body_span(r, &p);
    if (k == 0)
      return -1;
    if (k > n)
      k = n;
    memcpy(dst, p, k);
    body_consume(r, k);
    dst += k;
    n -= k;
  }
  return 0;
}

/* ---- connection and response head --------------------------------------------- */

static int dial(const char *addr)
{
  int fd;
  if (strncmp(addr, "unix:", 5) == 0) {
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    snprintf(un.sun_path, sizeof(un.sun_path), "%s", addr + 5);
    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&un, sizeof(un)) != 0)
      die("connect unix");
    return fd;
  }
  char host[256];
  snprintf(host, sizeof(host), "%s", addr);
  char *colon = strrchr(host, ':');
  if (colon == NULL)
    die("ADDR is unix:PATH or HOST:PORT");
  *colon = '\0';
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
  if (getaddrinfo(host, colon + 1, &hints, &ai) != 0)
    die("getaddrinfo");
  fd = socket(ai->ai_family, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0)
    die("connect tcp");
  freeaddrinfo(ai);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

static void send_all(int fd, const void *p, size_t n)
{
  const char *c = p;
  while (n > 0) {
    ssize_t k = write(fd, c, n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      die("write");
    c += k;
    n -= (size_t)k;
  }
}

/* Read the response head; returns its status code and sets r->chunked. */
static int read_head(rd_t *r)
{
  for (size_t need = 4;; need++) {
    if (need > 16384 || raw_fill(r, need) != 0)
      die("no response head");
    const uint8_t *p = r->buf + r->pos;
    if (memcmp(p + need - 4, "\r\n\r\n", 4) != 0)
      continue;
    char head[16385];
    memcpy(head, p, need);
    head[need] = '\0';
    r->pos += need;
    for (char *c = head; *c; c++)
      *c = (char)tolower((unsigned char)*c);
    r->chunked = strstr(head, "\r\ntransfer-encoding: chunked") != NULL;
    r->first_chunk = 1;
    if (strncmp(head, "http/1.1 ", 9) != 0)
      die("not an HTTP/1.1 response");
    return atoi(head + 9);
  }
}

static void add_headers(char *req, size_t cap, size_t *n, char **hdr, int nh)
{
  for (int i = 0; i < nh; i++)
    *n += (size_t)snprintf(req + *n, cap - *n, "%s\r\n", hdr[i]);
}

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- Connect server stream ------------------------------------------------------- */

static size_t put_varint(uint8_t *p, uint64_t v)
{
  size_t n = 0;
  while (v >= 0x80) {
    p[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  p[n++] = (uint8_t)v;
  return n;
}

static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
  *v = 0;
  for (int s = 0; s < 64 && *p < end; s += 7) {
    uint8_t b = *(*p)++;
    *v |= (uint64_t)(b & 0x7f) << s;
    if (!(b & 0x80))
      return 0;
  }
  return -1;
}

static size_t put_str(uint8_t *p, int field, const char *s)
{
  size_t n = 0, len = strlen(s);
  p[n++] = (uint8_t)(field << 3 | 2);
  n += put_varint(p + n, len);
  memcpy(p + n, s, len);
  return n + len;
}

/* The Start request's message: {"process":{"cmd":"head","args":["-c",N,"/dev/zero"]}}. */
static size_t start_request(int proto, const char *nbytes, uint8_t *out)
{
  if (!proto)
    return (size_t)sprintf(
        (char *)out, "{\"process\":{\"cmd\":\"head\",\"args\":[\"-c\",\"%s\",\"/dev/zero\"]}}",
        nbytes);
  uint8_t cfg[256];
  size_t n = put_str(cfg, 1, "head");
  n += put_str(cfg + n, 2, "-c");
  n += put_str(cfg + n, 2, nbytes);
  n += put_str(cfg + n, 2, "/dev/zero");
  size_t m = 0;
  out[m++] = 1 << 3 | 2; /* StartRequest.process */
  m += put_varint(out + m, n);
  memcpy(out + m, cfg, n);
  return m + n;
}

/* Stdout bytes of one JSON data event, from its length and base64 padding:
 * {"event":{"data":{"stdout":"<base64>"}}}; -1 if it is not one. */
static int64_t json_stdout(const uint8_t *head, size_t headlen, const uint8_t *tail, uint64_t len)
{
  static const char pfx[] = "{\"event\":{\"data\":{\"stdout\":\"";
  const size_t pl = sizeof(pfx) - 1, sl = 4; /* "}}} */
  if (headlen < pl || memcmp(head, pfx, pl) != 0 || len < pl + sl)
    return -1;
  uint64_t b64 = len - pl - sl;
  if (b64 % 4 != 0)
    die("json: base64 length not a multiple of 4");
  /* tail: the message's last 8 bytes, base64 ending before its "}}} */
  int pad = (b64 > 0 && tail[3] == '=') + (b64 > 1 && tail[2] == '=');
  return (int64_t)(b64 / 4 * 3) - pad;
}

/* Stdout bytes of one protobuf StartResponse: event(1) { data(2) {
 * stdout(1) bytes } }; -1 if it is another event. */
static int64_t proto_stdout(const uint8_t *p, size_t headlen)
{
  const uint8_t *end = p + headlen;
  uint64_t v;
  if (headlen < 2 || p[0] != (1 << 3 | 2))
    die("proto: not a StartResponse");
  p++;
  if (get_varint(&p, end, &v) != 0 || p >= end)
    die("proto: bad length");
  if (*p++ != (2 << 3 | 2))
    return -1; /* start, end, keepalive */
  if (get_varint(&p, end, &v) != 0 || p >= end)
    die("proto: bad length");
  if (*p++ != (1 << 3 | 2))
    die("proto: data event that is not stdout");
  if (get_varint(&p, end, &v) != 0)
    die("proto: bad length");
  return (int64_t)v;
}

static int run_connect(const char *addr, const char *prefix, int proto, const char *nbytes,
                       char **hdr, int nh, rd_t *r, uint64_t *got)
{
  static uint8_t body[512], msg[SMALL_MSG + 1];
  size_t mlen = start_request(proto, nbytes, body + 5);
  body[0] = 0;
  body[1] = (uint8_t)(mlen >> 24);
  body[2] = (uint8_t)(mlen >> 16);
  body[3] = (uint8_t)(mlen >> 8);
  body[4] = (uint8_t)mlen;
  char req[8192];
  size_t n = (size_t)snprintf(req, sizeof(req),
                              "POST %s/process.Process/Start HTTP/1.1\r\nHost: localhost\r\n"
                              "Content-Type: application/connect+%s\r\n"
                              "Connect-Protocol-Version: 1\r\nContent-Length: %zu\r\n",
                              prefix, proto ? "proto" : "json", mlen + 5);
  add_headers(req, sizeof(req), &n, hdr, nh);
  n += (size_t)snprintf(req + n, sizeof(req) - n, "\r\n");
  r->fd = dial(addr);
  send_all(r->fd, req, n);
  send_all(r->fd, body, mlen + 5);
  int code = read_head(r);
  if (code != 200) {
    fprintf(stderr, "exec_read: HTTP %d\n", code);
    return -1;
  }
  int ok = 0;
  for (;;) {
    uint8_t env[5];
    if (body_copy(r, env, 5) != 0)
      break;
    uint64_t len = (uint64_t)env[1] << 24 | env[2] << 16 | env[3] << 8 | env[4];
    if (env[0] & 2) { /* end of stream: {} or {"error":..} */
      if (len > SMALL_MSG || body_copy(r, msg, (size_t)len) != 0)
        die("bad end-of-stream message");
      msg[len] = '\0';
      if (strstr((char *)msg, "error") != NULL) {
        fprintf(stderr, "exec_read: stream error %s\n", msg);
        return -1;
      }
      break;
    }
    const uint8_t *head = msg, *tail;
    size_t headlen;
    if (len <= SMALL_MSG) {
      if (body_copy(r, msg, (size_t)len) != 0)
        die("truncated message");
      msg[len] = '\0';
      headlen = (size_t)len;
      tail = len >= 8 ? msg + len - 8 : msg;
    } else { /* 64 bytes of head, the payload skipped, 8 of tail */
      headlen = 64;
      if (body_copy(r, msg, 64) != 0)
        die("truncated message");
      body_skip(r, len - 72);
      if (body_copy(r, msg + 64, 8) != 0)
        die("truncated message");
      tail = msg + 64;
    }
    int64_t k = proto ? proto_stdout(head, headlen) : json_stdout(head, headlen, tail, len);
    if (k >= 0) {
      *got += (uint64_t)k;
    } else if (len <= SMALL_MSG && memmem(msg, (size_t)len, "exit status 0", 13) != NULL &&
               memmem(msg, (size_t)len, "error", 5) == NULL) {
      ok = 1; /* the end event of a successful exit */
    }
  }
  return ok ? 0 : -1;
}

/* ---- WebSocket exec console ------------------------------------------------------ */

static int run_ws(const char *addr, const char *path, char **hdr, int nh, rd_t *r, uint64_t *got)
{
  char req[16384];
  size_t n =
      (size_t)snprintf(req, sizeof(req),
                       "GET %s HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
                       "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                       "Sec-WebSocket-Version: 13\r\n"
                       "Sec-WebSocket-Protocol: v5.channel.k8s.io\r\n",
                       path);
  add_headers(req, sizeof(req), &n, hdr, nh);
  n += (size_t)snprintf(req + n, sizeof(req) - n, "\r\n");
  r->fd = dial(addr);
  send_all(r->fd, req, n);
  int code = read_head(r);
  if (code != 101) {
    fprintf(stderr, "exec_read: HTTP %d\n", code);
    return -1;
  }
  r->chunked = 0;
  int chan = -1;
  static uint8_t status[SMALL_MSG + 1];
  for (;;) {
    uint8_t h[8];
    if (body_copy(r, h, 2) != 0)
      die("closed before the status");
    int op = h[0] & 0x0f;
    uint64_t len = h[1] & 0x7f;
    if (len >= 126) {
      size_t k = len == 126 ? 2 : 8;
      if (body_copy(r, h, k) != 0)
        die("truncated frame");
      len = 0;
      for (size_t i = 0; i < k; i++)
        len = len << 8 | h[i];
    }
    if (op == 8)
      die("closed before the status");
    if ((op == 1 || op == 2) && len > 0) { /* a new message: its first byte is the channel */
      uint8_t c;
      if (body_copy(r, &c, 1) != 0)
        die("truncated frame");
      chan = c;
      len--;
    }
    if (chan == 3) {
      if (len > SMALL_MSG || body_copy(r, status, (size_t)len) != 0)
        die("bad status message");
      status[len] = '\0';
      if (strstr((char *)status, "Success") == NULL) {
        fprintf(stderr, "exec_read: status %s\n", status);
        return -1;
      }
      return 0;
    }
    body_skip(r, len);
    if (chan == 1)
      *got += len;
  }
}

int main(int argc, char **argv)
{
  if (argc < 3)
    die("usage: exec_read connect ADDR PREFIX json|proto BYTES [HEADER...] | "
        "exec_read ws ADDR PATH BYTES [HEADER...] | exec_read pipe BYTES");
  rd_t r = {.fd = -1};
  r.buf = malloc(BUF_CAP);
  if (r.buf == NULL)
    die("out of memory");
  uint64_t want, got = 0;
  double t0 = now_s();
  int rv;
  if (strcmp(argv[1], "connect") == 0) {
    if (argc < 6)
      die("connect: ADDR PREFIX json|proto BYTES");
    want = strtoull(argv[5], NULL, 10);
    rv = run_connect(argv[2], argv[3], strcmp(argv[4], "proto") == 0, argv[5], argv + 6, argc - 6,
                     &r, &got);
  } else if (strcmp(argv[1], "pipe") == 0) {
    want = strtoull(argv[2], NULL, 10);
    ssize_t k;
    while ((k = read(0, r.buf, BUF_CAP)) > 0 || (k < 0 && errno == EINTR))
      got += k > 0 ? (uint64_t)k : 0;
    rv = 0;
  } else if (strcmp(argv[1], "ws") == 0 && argc >= 5) {
    want = strtoull(argv[4], NULL, 10);
    rv = run_ws(argv[2], argv[3], argv + 5, argc - 5, &r, &got);
  } else {
    die("mode is connect, ws or pipe");
  }
  double dt = now_s() - t0;
  printf("bytes %llu seconds %.6f MBps %.1f\n", (unsigned long long)got, dt,
         (double)got / dt / 1e6);
  if (rv != 0 || got != want) {
    fprintf(stderr, "exec_read: %llu of %llu bytes, %s\n", (unsigned long long)got,
            (unsigned long long)want, rv != 0 ? "no success status" : "short");
    return 1;
  }
  return 0;
}
