/*
 * store_bench: durable create throughput of the binding store.
 *
 *   store_bench URL [N] [C]
 *
 * Runs N sandbox creates as the gateway does them: create_intent (the row in
 * state `creating`, written before the provider is called) and, when it is
 * durable, an update to `running` (the provider answered). C creates are in
 * flight at any time. Prints creates/s (complete create+update pairs per
 * second of wall time) and p50/p99 latencies of the intent write and of the
 * whole pair, measured on the loop thread from the call to the callback.
 *
 * Every create uses a fresh id and idempotency key in a tenant unique to the
 * run, so runs against one database do not interfere.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/store.h"
#include "util/mem.h"

typedef struct bench_s {
  uv_loop_t *loop;
  osr_store_t *st;
  long n, c;
  long started, finished, failed;
  char tenant[48];
  uint64_t *lat_intent; /* ns per create */
  uint64_t *lat_pair;
  uint64_t t_start, t_end;
  int open_status, opened, closed;
} bench_t;

typedef struct op_s {
  bench_t *b;
  long idx;
  uint64_t t0, t1;
  osr_binding_t bind;
} op_t;

static void start_one(bench_t *b);

static void on_updated(int status, void *data)
{
  op_t *op = data;
  bench_t *b = op->b;
  uint64_t now = uv_hrtime();

  if (status != 0)
    b->failed++;
  b->lat_pair[op->idx] = now - op->t0;
  b->finished++;
  osr_binding_dispose(&op->bind);
  osr_free(op);
  if (b->started < b->n)
    start_one(b);
  else if (b->finished == b->n)
    b->t_end = now;
}

static void on_created(int status, const osr_binding_t *bind, int created, void *data)
{
  op_t *op = data;
  bench_t *b = op->b;

  op->t1 = uv_hrtime();
  b->lat_intent[op->idx] = op->t1 - op->t0;
  if (status != 0 || !created) {
    on_updated(status != 0 ? status : -1, op);
    return;
  }
  (void)bind;
  op->bind.state = OSR_BINDING_RUNNING;
  snprintf(op->bind.provider_id, sizeof(op->bind.provider_id), "sim-%ld", op->idx);
  snprintf(op->bind.agent_endpoint, sizeof(op->bind.agent_endpoint), "127.0.0.1:%ld", 20000 + op->idx % 1000);
  op->bind.updated_ms = op->bind.created_ms + 1;
  if (osr_store_update(b->st, &op->bind, on_updated, op) != 0)
    on_updated(-1, op);
}

static void start_one(bench_t *b)
{
  op_t *op = osr_xcalloc(1, sizeof(*op));
  long i = b->started++;

  op->b = b;
  op->idx = i;
  osr_binding_init(&op->bind);
  snprintf(op->bind.id, sizeof(op->bind.id), "b%07ld%012ld", (long)getpid() % 10000000, i);
  snprintf(op->bind.tenant, sizeof(op->bind.tenant), "%s", b->tenant);
  snprintf(op->bind.idem_key, sizeof(op->bind.idem_key), "key-%ld", i);
  memset(op->bind.request_hash, 'f', 64);
  snprintf(op->bind.template_id, sizeof(op->bind.template_id), "python:3.12");
  snprintf(op->bind.provider, sizeof(op->bind.provider), "sim");
  snprintf(op->bind.region, sizeof(op->bind.region), "local");
  op->bind.isolation = OSR_ISO_GVISOR;
  op->bind.attempt = 1;
  op->bind.expires_ms = 0;
  op->bind.request_json = osr_xstrdup("{\"template\":\"python:3.12\",\"timeoutSeconds\":300}");
  op->bind.metadata_json = osr_xstrdup("{\"bench\":\"store\"}");
  op->t0 = uv_hrtime();
  if (osr_store_create_intent(b->st, &op->bind, on_created, op) != 0) {
    b->failed++;
    b->lat_intent[i] = 0;
    on_updated(-1, op);
  }
}

static void on_open(osr_store_t *st, int status, void *data)
{
  bench_t *b = data;
  (void)st;
  b->open_status = status;
  b->opened = 1;
}

static void on_closed(void *data)
{
  ((bench_t *)data)->closed = 1;
}

static int cmp_u64(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static double pct_ms(uint64_t *v, long n, double p)
{
  long i = (long)(p * (double)(n - 1) + 0.5);
  return (double)v[i] / 1e6;
}

int main(int argc, char **argv)
{
  bench_t b;
  uv_loop_t loop;
  long i;

  if (argc < 2) {
    fprintf(stderr, "usage: %s URL [N=20000] [C=100]\n", argv[0]);
    return 2;
  }
  memset(&b, 0, sizeof(b));
  b.n = argc > 2 ? strtol(argv[2], NULL, 10) : 20000;
  b.c = argc > 3 ? strtol(argv[3], NULL, 10) : 100;
  if (b.n < 1 || b.c < 1 || b.n > 10000000) {
    fprintf(stderr, "bad N or C\n");
    return 2;
  }
  snprintf(b.tenant, sizeof(b.tenant), "bench-%d-%" PRIu64, (int)getpid(), uv_hrtime() / 1000);
  b.lat_intent = osr_xcalloc((size_t)b.n, sizeof(uint64_t));
  b.lat_pair = osr_xcalloc((size_t)b.n, sizeof(uint64_t));
  uv_loop_init(&loop);
  b.loop = &loop;
  if (osr_store_open(&loop, argv[1], on_open, &b, &b.st) != 0) {
    fprintf(stderr, "bad store URL\n");
    return 2;
  }
  while (!b.opened)
    uv_run(&loop, UV_RUN_ONCE);
  if (b.open_status != 0) {
    fprintf(stderr, "open failed: %d\n", b.open_status);
    return 1;
  }
  b.t_start = uv_hrtime();
  for (i = 0; i < b.c && b.started < b.n; i++)
    start_one(&b);
  while (b.finished < b.n)
    uv_run(&loop, UV_RUN_ONCE);
  osr_store_close(b.st, on_closed, &b);
  while (!b.closed)
    uv_run(&loop, UV_RUN_ONCE);
  uv_loop_close(&loop);

  qsort(b.lat_intent, (size_t)b.n, sizeof(uint64_t), cmp_u64);
  qsort(b.lat_pair, (size_t)b.n, sizeof(uint64_t), cmp_u64);
  {
    double secs = (double)(b.t_end - b.t_start) / 1e9;
    printf("store_bench backend=%s n=%ld c=%ld failed=%ld\n", argv[1][0] == 's' ? "sqlite" : "postgres",
           b.n, b.c, b.failed);
    printf("  creates/s (intent+update, durable): %.0f   wall %.2f s\n", (double)b.n / secs, secs);
    printf("  intent  p50 %.2f ms  p99 %.2f ms\n", pct_ms(b.lat_intent, b.n, 0.50),
           pct_ms(b.lat_intent, b.n, 0.99));
    printf("  pair    p50 %.2f ms  p99 %.2f ms\n", pct_ms(b.lat_pair, b.n, 0.50),
           pct_ms(b.lat_pair, b.n, 0.99));
  }
  osr_free(b.lat_intent);
  osr_free(b.lat_pair);
  return b.failed != 0;
}
