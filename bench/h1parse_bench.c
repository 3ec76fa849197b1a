/*
 * Wall-clock cost of parsing one proxied small request and its response
 * with OSR's HTTP/1.1 parser (src/net/http1_parse.c), llhttp's generic copy
 * against its SSE4.2 copy (subprojects/llhttp/osr_llhttp_dispatch.h), in
 * interleaved rounds of one process:
 *   build/bench/h1parse_bench [TOKEN_LEN [ROUNDS [ITERS]]]
 * The request is bench/dataplane_drive.py's (GET with Host and an
 * X-Access-Token of TOKEN_LEN bytes, 259 as dp-mint signs them), the
 * response nginx's answer to /hello. Prints ns per request+response pair,
 * best and median of the rounds, per copy. Numbers, not a test: the machine
 * decides the spread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "net/http1_parse.h"
#ifdef OSR_LLHTTP_DISPATCH
#include "osr_llhttp_dispatch.h"
#endif

static int on_head(osr_h1p_t *p)
{
  (void)p;
  return 0;
}

static int on_body(osr_h1p_t *p, const char *at, size_t len)
{
  (void)p;
  (void)at;
  (void)len;
  return 0;
}

static const osr_h1p_events_t ev = {NULL, on_head, on_body, NULL};

static double now_ns(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void parse_all(osr_h1p_t *p, const char *s, size_t n)
{
  size_t used = 0;
  if (osr__h1p_execute(p, s, n, &used) != OSR_H1P_MESSAGE || used != n) {
    fprintf(stderr, "h1parse_bench: the message did not parse\n");
    exit(1);
  }
  osr__h1p_trim(p);
}

int main(int argc, char **argv)
{
  size_t tok_len = argc > 1 ? strtoul(argv[1], NULL, 10) : 259;
  int rounds = argc > 2 ? atoi(argv[2]) : 9;
  long iters = argc > 3 ? atol(argv[3]) : 100000;
  if (tok_len > 2000 || rounds < 1 || rounds > 99 || iters < 1)
    return 2;
  char tok[2001], req[2200];
  memset(tok, 'a', tok_len);
  tok[tok_len] = '\0';
  int rn = snprintf(req, sizeof(req),
                    "GET /sbx/s1/28000/hello HTTP/1.1\r\nHost: x\r\nX-Access-Token: %s\r\n\r\n", tok);
  static const char resp[] = "HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\n"
                             "Date: Wed, 02 Dec 2026 16:30:00 GMT\r\nContent-Type: text/plain\r\n"
                             "Content-Length: 12\r\nConnection: keep-alive\r\n\r\nhello world\n";
  osr_http_limits_t lim;
  memset(&lim, 0, sizeof(lim));
  osr_http_limits_defaults(&lim);

  int modes = 1;
#ifdef OSR_LLHTTP_DISPATCH
  int was = osr_llhttp_simd();
  modes = osr_llhttp_simd_select(1) >= 0 ? 2 : 1;
#endif
  double res[2][99];
  for (int r = 0; r < rounds; r++) {
    for (int k = 0; k < modes; k++) {
      int m = modes == 2 ? (k + r) % 2 : 0; /* each copy goes first every other round */
#ifdef OSR_LLHTTP_DISPATCH
      (void)osr_llhttp_simd_select(m);
#endif
      osr_h1p_t a, b;
      osr__h1p_init(&a, 1, &lim, 0, &ev, NULL);
      osr__h1p_init(&b, 0, &lim, 0, &ev, NULL);
      double t0 = now_ns();
      for (long i = 0; i < iters; i++) {
        parse_all(&a, req, (size_t)rn);
        parse_all(&b, resp, sizeof(resp) - 1);
      }
      res[m][r] = (now_ns() - t0) / (double)iters;
      osr__h1p_dispose(&a);
      osr__h1p_dispose(&b);
    }
  }
#ifdef OSR_LLHTTP_DISPATCH
  (void)osr_llhttp_simd_select(was);
#endif
  printf("request %d B, response %zu B, %d rounds of %ld\n", rn, sizeof(resp) - 1, rounds, iters);
  for (int m = 0; m < modes; m++) {
    qsort(res[m], (size_t)rounds, sizeof(double), cmp_d);
    printf("%-8s ns per request+response: best %.1f, median %.1f\n", m ? "sse4.2" : "generic",
           res[m][0], res[m][rounds / 2]);
  }
  return 0;
}
