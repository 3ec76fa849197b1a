/*
 * create_load: a closed-loop HTTP/1.1 load generator for create requests,
 * used by bench/create_bench.py.
 *
 *   create_load --connect IP:PORT --path /v1/sandboxes [-H 'Name: value']...
 *               --body TEMPLATE -c CONNS (-d SECONDS [-w WARMUP] | -n COUNT)
 *               [--seq-start N] [--expect STATUS] [--hard-timeout SECONDS]
 *
 * CONNS keep-alive connections each keep exactly one request in flight: the
 * next request goes out as soon as the previous answer is complete, so the
 * concurrency is exactly CONNS. Every "{seq}" in TEMPLATE is replaced by a
 * number unique to the request (counting from --seq-start), which the direct
 * osr-sim runs need for unique sandbox ids.
 *
 * With -d, requests that start after the warm-up and before the end are
 * measured; creates/s counts the answers that arrive inside that window.
 * With -n, exactly COUNT requests are sent and all are measured.
 *
 * Prints one JSON object: requests, ok (answers with the expected status),
 * errors (other statuses, broken connections), rps, and latency percentiles
 * in microseconds of the ok answers (p50, p90, p99, p999, max, mean). The
 * latency of a request is the time from the first byte written to the last
 * byte of the answer read, on CLOCK_MONOTONIC.
 *
 * Why C and not Python: one Python thread tops out around a few thousand
 * requests per second with its own scheduling noise in the tail, which is
 * the quantity being measured. This is one thread on epoll, written for the
 * two servers it talks to (osr-gateway and osr-sim): responses carry a
 * Content-Length; a chunked response is counted as an error.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS       4096
#define RBUF_SIZE       (256 * 1024) /* largest answer accepted */
#define MAX_HEADERS_ARG 16
#define MAX_SAMPLES     (16u << 20)

typedef struct conn_s {
  int fd;
  int busy;     /* a request is in flight */
  int measured; /* this request counts in the latencies */
  uint64_t t0;  /* ns, first byte written */
  char *wbuf;   /* the request being written */
  size_t wlen, woff;
  char *rbuf;
  size_t rlen;
} conn_t;

static struct sockaddr_in addr;
static const char *path = "/v1/sandboxes";
static const char *headers[MAX_HEADERS_ARG];
static int nheaders;
static const char *body_tpl = "{}";
static int nconns = 1, expect = 201;
static double duration = 0, warmup = 0, hard_timeout = 600;
static long count_n = 0;
static uint64_t seq;
static char host_hdr[64];

static int ep;
static conn_t conns[MAX_CONNS];
static uint32_t *samples; /* us of measured ok answers */
static size_t nsamples;
static long sent, ok, errors, in_window, status_counts[600];
static uint64_t t_begin, t_ws, t_we; /* ns: start, measurement window */
static int stopping;

static uint64_t now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *what)
{
  fprintf(stderr, "create_load: %s: %s\n", what, strerror(errno));
  exit(1);
}

static void *xmalloc(size_t n)
{
  void *p = malloc(n);
  if (p == NULL) {
    fprintf(stderr, "create_load: out of memory\n");
    exit(1);
  }
  return p;
}

/* The request with "{seq}" replaced by the next sequence number. */
static size_t build_request(char *out, size_t cap)
{
  char body[8192];
  size_t bl = 0;
  char num[24];
  int nl = snprintf(num, sizeof(num), "%" PRIu64, seq++);
  for (const char *p = body_tpl; *p != '\0';) {
    if (strncmp(p, "{seq}", 5) == 0) {
      if (bl + (size_t)nl >= sizeof(body))
        break;
      memcpy(body + bl, num, (size_t)nl);
      bl += (size_t)nl;
      p += 5;
    } else {
      if (bl + 1 >= sizeof(body))
        break;
      body[bl++] = *p++;
    }
  }
  int n = snprintf(out, cap, "POST %s HTTP/1.1\r\nHost: %s\r\n", path, host_hdr);
  for (int i = 0; i < nheaders && (size_t)n < cap; i++)
    n += snprintf(out + n, cap - (size_t)n, "%s\r\n", headers[i]);
  if ((size_t)n < cap)
    n += snprintf(out + n, cap - (size_t)n,
                  "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", bl);
  if ((size_t)n + bl >= cap) {
    fprintf(stderr, "create_load: request too large\n");
    exit(2);
  }
  memcpy(out + n, body, bl);
  return (size_t)n + bl;
}

static void conn_open(conn_t *c)
{
  c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c->fd < 0)
    die("socket");
  int one = 1;
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (connect(c->fd, (struct sockaddr *)&addr, sizeof(addr)) != 0 && errno != EINPROGRESS)
    die("connect");
  struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
  if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) != 0)
    die("epoll_ctl");
  c->busy = 0;
  c->rlen = 0;
}

static void conn_close(conn_t *c)
{
  if (c->fd >= 0) {
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
  }
  c->fd = -1;
  c->busy = 0;
}

static int want_more(void)
{
  if (stopping)
    return 0;
  if (count_n > 0)
    return sent < count_n;
  return now_ns() < t_we;
}

static void set_events(conn_t *c, uint32_t events)
{
  struct epoll_event ev = {.events = events, .data.ptr = c};
  epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void try_write(conn_t *c)
{
  while (c->woff < c->wlen) {
    ssize_t w = write(c->fd, c->wbuf + c->woff, c->wlen - c->woff);
    if (w < 0) {
      if (errno == EAGAIN) {
        set_events(c, EPOLLIN | EPOLLOUT);
        return;
      }
      errors++;
      conn_close(c);
      return;
    }
    c->woff += (size_t)w;
  }
  set_events(c, EPOLLIN);
}

static void start_request(conn_t *c)
{
  if (!want_more())
    return;
  c->wlen = build_request(c->wbuf, 16384);
  c->woff = 0;
  c->busy = 1;
  c->t0 = now_ns();
  c->measured = count_n > 0 || (c->t0 >= t_ws && c->t0 < t_we);
  sent++;
  try_write(c);
}

/* Returns the total length of a complete answer in rbuf, 0 if more bytes are
 * needed, -1 if the answer is not one we understand. */
static long parse_answer(conn_t *c, int *status, int *close_after)
{
  char *end = memmem(c->rbuf, c->rlen, "\r\n\r\n", 4);
  if (end == NULL)
    return c->rlen >= RBUF_SIZE ? -1 : 0;
  size_t hlen = (size_t)(end - c->rbuf) + 4;
  if (c->rlen < 12 || memcmp(c->rbuf, "HTTP/1.", 7) != 0)
    return -1;
  *status = atoi(c->rbuf + 9);
  long clen = -1;
  *close_after = 0;
  for (char *p = memchr(c->rbuf, '\n', hlen); p != NULL && p < end;
       p = memchr(p, '\n', hlen - (size_t)(p - c->rbuf))) {
    p++;
    if (strncasecmp(p, "content-length:", 15) == 0)
      clen = strtol(p + 15, NULL, 10);
    else if (strncasecmp(p, "transfer-encoding:", 18) == 0)
      return -1;
    else if (strncasecmp(p, "connection:", 11) == 0 && strncasecmp(p + 11, " close", 6) == 0)
      *close_after = 1;
  }
  if (clen < 0 || hlen + (size_t)clen > RBUF_SIZE)
    return -1;
  return c->rlen >= hlen + (size_t)clen ? (long)(hlen + (size_t)clen) : 0;
}

static void on_answer(conn_t *c, int status, uint64_t t1)
{
  c->busy = 0;
  if (status >= 100 && status < 600)
    status_counts[status]++;
  if (status != expect) {
    errors++;
    if (errors <= 3) {
      size_t n = c->rlen < 600 ? c->rlen : 600;
      fprintf(stderr, "create_load: unexpected answer: %.*s\n", (int)n, c->rbuf);
    }
    return;
  }
  ok++;
  if (t1 >= t_ws && t1 <= t_we)
    in_window++;
  if (c->measured && nsamples < MAX_SAMPLES) {
    uint64_t us = (t1 - c->t0 + 500) / 1000;
    samples[nsamples++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
  }
}

static void on_readable(conn_t *c)
{
  for (;;) {
    ssize_t r = read(c->fd, c->rbuf + c->rlen, RBUF_SIZE - c->rlen);
    if (r < 0 && errno == EAGAIN)
      return;
    if (r <= 0) {
      if (c->busy)
        errors++;
      conn_close(c);
      conn_open(c); /* keep the concurrency; the next request goes out on connect */
      return;
    }
    c->rlen += (size_t)r;
    int status = 0, close_after = 0;
    long n = parse_answer(c, &status, &close_after);
    if (n < 0) {
      errors++;
      conn_close(c);
      conn_open(c);
      return;
    }
    if (n == 0)
      continue;
    on_answer(c, status, now_ns());
    memmove(c->rbuf, c->rbuf + n, c->rlen - (size_t)n);
    c->rlen -= (size_t)n;
    if (close_after) {
      conn_close(c);
      conn_open(c);
      return;
    }
    start_request(c);
    return;
  }
}

static int cmp_u32(const void *a, const void *b)
{
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

static uint32_t pct(double q)
{
  if (nsamples == 0)
    return 0;
  size_t i = (size_t)(q * (double)(nsamples - 1) + 0.5);
  return samples[i];
}

static void usage(void)
{
  fprintf(stderr, "usage: create_load --connect IP:PORT [--path P] [-H 'N: v']... [--body T] -c N\n"
                  "                   (-d SECONDS [-w WARMUP] | -n COUNT) [--seq-start N]\n"
                  "                   [--expect STATUS] [--hard-timeout SECONDS]\n");
  exit(2);
}

int main(int argc, char **argv)
{
  const char *target = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL)
      usage();
    if (strcmp(a, "--connect") == 0)
      target = v;
    else if (strcmp(a, "--path") == 0)
      path = v;
    else if (strcmp(a, "-H") == 0 && nheaders < MAX_HEADERS_ARG)
      headers[nheaders++] = v;
    else if (strcmp(a, "--body") == 0)
      body_tpl = v;
    else if (strcmp(a, "-c") == 0)
      nconns = (int)strtol(v, NULL, 10);
    else if (strcmp(a, "-d") == 0)
      duration = strtod(v, NULL);
    else if (strcmp(a, "-w") == 0)
      warmup = strtod(v, NULL);
    else if (strcmp(a, "-n") == 0)
      count_n = strtol(v, NULL, 10);
    else if (strcmp(a, "--seq-start") == 0)
      seq = strtoull(v, NULL, 10);
    else if (strcmp(a, "--expect") == 0)
      expect = (int)strtol(v, NULL, 10);
    else if (strcmp(a, "--hard-timeout") == 0)
      hard_timeout = strtod(v, NULL);
    else
      usage();
    i++;
  }
  if (target == NULL || nconns < 1 || nconns > MAX_CONNS || (duration <= 0) == (count_n <= 0))
    usage();
  char ip[48];
  const char *colon = strrchr(target, ':');
  if (colon == NULL || (size_t)(colon - target) >= sizeof(ip))
    usage();
  memcpy(ip, target, (size_t)(colon - target));
  ip[colon - target] = '\0';
  memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)strtol(colon + 1, NULL, 10));
  if (inet_pton(AF_INET, ip, &addr.sin_addr) != 1)
    usage();
  snprintf(host_hdr, sizeof(host_hdr), "%s", target);

  samples = xmalloc(sizeof(uint32_t) * MAX_SAMPLES);
  ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0)
    die("epoll_create1");
  for (int i = 0; i < nconns; i++) {
    conns[i].wbuf = xmalloc(16384);
    conns[i].rbuf = xmalloc(RBUF_SIZE);
    conn_open(&conns[i]);
  }

  t_begin = now_ns();
  if (count_n > 0) {
    t_ws = t_begin;
    t_we = UINT64_MAX;
  } else {
    t_ws = t_begin + (uint64_t)(warmup * 1e9);
    t_we = t_ws + (uint64_t)(duration * 1e9);
  }
  uint64_t t_hard = t_begin + (uint64_t)(hard_timeout * 1e9);
  uint64_t t_last = t_begin;
  struct epoll_event evs[256];
  for (;;) {
    uint64_t now = now_ns();
    if (now >= t_hard) {
      fprintf(stderr, "create_load: hard timeout, %ld requests unanswered\n", sent - ok - errors);
      stopping = 1;
      break;
    }
    int inflight = 0;
    for (int i = 0; i < nconns; i++)
      inflight += conns[i].busy;
    if (!want_more() && inflight == 0)
      break;
    int n = epoll_wait(ep, evs, 256, 100);
    if (n < 0 && errno != EINTR)
      die("epoll_wait");
    for (int i = 0; i < n; i++) {
      conn_t *c = evs[i].data.ptr;
      if (c->fd < 0)
        continue;
      if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        on_readable(c);
        if (c->fd < 0)
          continue;
      }
      if (evs[i].events & EPOLLOUT) {
        if (!c->busy)
          start_request(c); /* connected: first request */
        else if (c->woff < c->wlen)
          try_write(c);
        else
          set_events(c, EPOLLIN);
        if (!c->busy && c->fd >= 0)
          set_events(c, EPOLLIN); /* nothing more to send */
      }
    }
    t_last = now_ns();
  }
  uint64_t t_end = t_last;
  for (int i = 0; i < nconns; i++)
    conn_close(&conns[i]);

  qsort(samples, nsamples, sizeof(samples[0]), cmp_u32);
  double sum = 0;
  for (size_t i = 0; i < nsamples; i++)
    sum += samples[i];
  double secs = count_n > 0 ? (double)(t_end - t_begin) / 1e9 : duration;
  long counted = count_n > 0 ? ok : in_window;
  printf("{\"conns\":%d,\"requests\":%ld,\"ok\":%ld,\"errors\":%ld,\"seconds\":%.3f,\"rps\":%.1f,"
         "\"samples\":%zu,\"p50_us\":%u,\"p90_us\":%u,\"p99_us\":%u,\"p999_us\":%u,\"max_us\":%u,"
         "\"mean_us\":%.1f,\"next_seq\":%" PRIu64 ",\"status\":{",
         nconns, sent, ok, errors, secs, (double)counted / secs, nsamples, pct(0.50), pct(0.90),
         pct(0.99), pct(0.999), nsamples ? samples[nsamples - 1] : 0,
         nsamples ? sum / (double)nsamples : 0.0, seq);
  int first = 1;
  for (int s = 100; s < 600; s++) {
    if (status_counts[s] != 0) {
      printf("%s\"%d\":%ld", first ? "" : ",", s, status_counts[s]);
      first = 0;
    }
  }
  printf("}}\n");
  return stopping ? 3 : 0;
}
