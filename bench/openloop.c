/*
 * openloop: an open-loop HTTP/1.1 latency generator (wrk2 is not in Debian),
 * used by bench/dataplane_bench.py for the "added latency at a fixed
 * request rate" row.
 *
 *   openloop IP PORT PATH RATE SECONDS CONNS [HEADER]...
 *
 * Request i is due at t0 + i / RATE whatever happened before it (open
 * loop): it goes out on an idle keep-alive connection, or waits in a queue
 * until one is idle. Its latency is measured from when it was *due* to the
 * last byte of its answer, so a stall delays every request queued behind it
 * and shows up in the tail (no coordinated omission). The first second is
 * warm-up and not measured.
 *
 * Prints one line: sent, ok, errors and the p50/p99/p99.9/max latency of the
 * measured requests in microseconds. One thread on epoll; answers must carry
 * a Content-Length (the benchmark's backend sends one).
 *
 * OPENLOOP_TRACE_DIR=D also writes D/openloop-PORT-PID.txt: the arguments,
 * then one line per measured request, "due_us latency_us" (due time from
 * the start of the measured part), in answer order: when a tail's slow
 * requests happened, e.g. every second, shows what the tail waits on.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
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

#define BUF_MAX (64 * 1024)

typedef struct conn_s {
  int fd;
  int busy;
  int64_t due; /* of the request in flight, ns */
  char buf[BUF_MAX];
  size_t len;
} conn_t;

static int64_t now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp64(const void *a, const void *b)
{
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* Length of a complete answer at the start of c->buf, 0 if incomplete,
 * -1 if unusable. */
static long answer_len(const conn_t *c)
{
  const char *e = memmem(c->buf, c->len, "\r\n\r\n", 4);
  if (e == NULL)
    return c->len >= BUF_MAX ? -1 : 0;
  size_t head = (size_t)(e - c->buf) + 4;
  long cl = -1;
  for (const char *p = c->buf; p < e;) {
    const char *nl = memchr(p, '\n', (size_t)(e + 2 - p)); /* the last line ends at e + 1 */
    if (nl == NULL)
      break;
    if ((size_t)(nl - p) > 15 && strncasecmp(p, "content-length:", 15) == 0)
      cl = strtol(p + 15, NULL, 10);
    p = nl + 1;
  }
  if (cl < 0 || head + (size_t)cl > BUF_MAX)
    return -1;
  return c->len >= head + (size_t)cl ? (long)(head + (size_t)cl) : 0;
}

int main(int argc, char **argv)
{
  if (argc < 7) {
    fprintf(stderr, "usage: openloop IP PORT PATH RATE SECONDS CONNS [HEADER]...\n");
    return 2;
  }
  const char *ip = argv[1], *path = argv[3];
  int port = atoi(argv[2]), nconns = atoi(argv[6]);
  double rate = atof(argv[4]), secs = atof(argv[5]);
  char req[8192];
  int rl = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: %s:%d\r\n", path, ip, port);
  for (int i = 7; i < argc && rl < (int)sizeof(req) - 256; i++)
    rl += snprintf(req + rl, sizeof(req) - (size_t)rl, "%s\r\n", argv[i]);
  rl += snprintf(req + rl, sizeof(req) - (size_t)rl, "\r\n");
  if (rl >= (int)sizeof(req) || nconns <= 0 || rate <= 0 || secs <= 1)
    return 2;

  size_t total = (size_t)(rate * secs);
  int64_t *lat = calloc(total, sizeof(*lat));
  const char *trace_dir = getenv("OPENLOOP_TRACE_DIR");
  int64_t *dues = trace_dir != NULL ? calloc(total, sizeof(*dues)) : NULL;
  int64_t *queue = calloc(total, sizeof(*queue)); /* due times waiting for a conn */
  conn_t *conns = calloc((size_t)nconns, sizeof(*conns));
  int ep = epoll_create1(0);
  if (lat == NULL || queue == NULL || conns == NULL || ep < 0)
    return 1;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, ip, &sa.sin_addr);
  for (int i = 0; i < nconns; i++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
      perror("connect");
      return 1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    conns[i].fd = fd;
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  }

  int64_t t0 = now_ns() + 10000000, warm = t0 + 1000000000;
  int64_t step = (int64_t)(1e9 / rate);
  size_t next = 0, qh = 0, qt = 0, nlat = 0, ok = 0, errors = 0, done = 0;
  int idle_hint = 0;
  while (done < total) {
    int64_t now = now_ns();
    if (now > t0 + (int64_t)(secs * 1e9) + 5000000000LL)
      break; /* 5 s past the end: stop waiting */
    while (next < total && t0 + (int64_t)next * step <= now)
      queue[qt++] = t0 + (int64_t)(next++) * step;
    while (qh < qt) {
      int c = -1;
      for (int k = 0; k < nconns; k++) {
        int i = (idle_hint + k) % nconns;
        if (!conns[i].busy && conns[i].fd >= 0) {
          c = i;
          break;
        }
      }
      if (c < 0)
        break;
      idle_hint = c + 1;
      conns[c].busy = 1;
      conns[c].due = queue[qh++];
      if (write(conns[c].fd, req, (size_t)rl) != rl) {
        errors++;
        done++;
        close(conns[c].fd);
        conns[c].fd = -1;
      }
    }
    int64_t wait_ns = next < total ? t0 + (int64_t)next * step - now_ns() : 100000000;
    int timeout = wait_ns <= 0 ? 0 : (int)(wait_ns / 1000000);
    struct epoll_event evs[64];
    int n = epoll_wait(ep, evs, 64, timeout);
    for (int e = 0; e < n; e++) {
      conn_t *c = &conns[evs[e].data.u32];
      ssize_t r = read(c->fd, c->buf + c->len, BUF_MAX - c->len);
      if (r <= 0) {
        if (r < 0 && errno == EAGAIN)
          continue;
        if (c->busy) {
          errors++;
          done++;
        }
        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->fd = -1;
        c->busy = 0;
        continue;
      }
      c->len += (size_t)r;
      long al = answer_len(c);
      if (al == 0)
        continue;
      int64_t t = now_ns();
      done++;
      if (al < 0 || !c->busy) {
        if (errors++ == 0)
          fprintf(stderr, "openloop: unusable answer (%s)\n", al < 0 ? "no length" : "unasked");
        c->len = 0;
        c->busy = 0;
        continue;
      }
      if (memcmp(c->buf, "HTTP/1.1 200", 12) == 0) {
        ok++;
        if (c->due >= warm) {
          if (dues != NULL)
            dues[nlat] = c->due - warm;
          lat[nlat++] = t - c->due;
        }
      } else {
        if (errors++ == 0)
          fprintf(stderr, "openloop: first error answer: %.*s\n", (int)(al < 200 ? al : 200),
                  c->buf);
      }
      memmove(c->buf, c->buf + al, c->len - (size_t)al);
      c->len -= (size_t)al;
      c->busy = 0;
    }
  }
  if (dues != NULL) {
    char name[4096];
    snprintf(name, sizeof(name), "%s/openloop-%d-%d.txt", trace_dir, port, (int)getpid());
    FILE *f = fopen(name, "w");
    if (f != NULL) {
      fprintf(f, "# %s %d %s rate %g secs %g conns %d\n", ip, port, path, rate, secs, nconns);
      for (size_t i = 0; i < nlat; i++)
        fprintf(f, "%lld %lld\n", (long long)(dues[i] / 1000), (long long)(lat[i] / 1000));
      fclose(f);
    }
    free(dues);
  }
  qsort(lat, nlat, sizeof(*lat), cmp64);
#define PCT(p) (nlat ? lat[(size_t)((double)(nlat - 1) * (p))] / 1000 : 0)
  printf("sent %zu ok %zu errors %zu measured %zu p50 %lld p99 %lld p999 %lld max %lld\n", next, ok,
         errors, nlat, (long long)PCT(0.50), (long long)PCT(0.99), (long long)PCT(0.999),
         (long long)(nlat ? lat[nlat - 1] / 1000 : 0));
  return errors > 0 ? 3 : 0;
}
