/* The shared adapter contract-test harness (contract.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "contract.h"
#include "util/mem.h"

uv_loop_t loop;
int in_call;
int sync_calls;

void note_call(res_t *r, int status)
{
  if (in_call)
    sync_calls++;
  r->calls++;
  r->status = status;
}

void on_create(osr_provider_t *p, int status, const osr_resource_t *res, void *data)
{
  (void)p;
  res_t *r = data;
  note_call(r, status);
  if (status == 0) {
    assert_non_null(res);
    r->res = *res;
  } else {
    assert_null(res);
  }
}

void on_done(osr_provider_t *p, int status, void *data)
{
  (void)p;
  note_call(data, status);
}

void on_list(osr_provider_t *p, int status, const osr_resource_t *res, size_t n, void *data)
{
  (void)p;
  res_t *r = data;
  note_call(r, status);
  r->n = n;
  r->found = 0;
  for (size_t i = 0; i < n; i++) {
    if (i < 16)
      r->list[i] = res[i];
    if (r->want != NULL && strcmp(res[i].sandbox_id, r->want) == 0) {
      r->found++;
      r->found_state = res[i].state;
    }
  }
}

void on_page(osr_provider_t *p, int status, const osr_resource_t *res, size_t n, const char *next,
             void *data)
{
  page_t *pg = data;
  (void)p;
  note_call(&pg->r, status);
  pg->n = n;
  pg->nids = 0;
  for (size_t i = 0; i < n; i++) {
    if (pg->nids == 32 ||
        (pg->prefix != NULL && strncmp(res[i].sandbox_id, pg->prefix, strlen(pg->prefix)) != 0))
      continue;
    snprintf(pg->sandbox_ids[pg->nids], sizeof(pg->sandbox_ids[0]), "%s", res[i].sandbox_id);
    snprintf(pg->provider_ids[pg->nids++], sizeof(pg->provider_ids[0]), "%s", res[i].provider_id);
  }
  pg->has_next = next != NULL;
  snprintf(pg->next, sizeof(pg->next), "%s", next != NULL ? next : "");
}

static void on_tick(uv_timer_t *t)
{
  (void)t;
}

void run_until(const int *flag, uint64_t ms)
{
  uv_timer_t guard;
  uv_timer_init(&loop, &guard);
  uv_timer_start(&guard, on_tick, 5, 5);
  uint64_t end = uv_now(&loop) + ms;
  while (!*flag && uv_now(&loop) < end)
    uv_run(&loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&guard, NULL);
  uv_run(&loop, UV_RUN_NOWAIT);
}

int closed;
void on_closed(osr_provider_t *p)
{
  if (in_call)
    sync_calls++;
  closed++;
  assert_null(p->impl);
}

void adapter_free(osr_provider_t *p)
{
  closed = 0;
  in_call = 1;
  p->adapter->close(p, on_closed);
  in_call = 0;
  run_until(&closed, 5000);
  assert_int_equal(closed, 1);
  osr_free(p);
}
