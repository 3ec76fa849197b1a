/*
 * The harness every adapter contract test shares (docs/adapters.md "The
 * contract test"): one loop, a flag set around each adapter call so that a
 * callback run inside it is counted (sync_calls must stay 0), callbacks that
 * record each result once, a bounded loop runner and a synchronous close.
 * Include after cmocka.h.
 */
#ifndef OSR_TESTS_ADAPTERS_CONTRACT_H
#define OSR_TESTS_ADAPTERS_CONTRACT_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "osr/adapter.h"

extern uv_loop_t loop;
extern int in_call;    /* set while an adapter function runs */
extern int sync_calls; /* callbacks that ran inside the call: must stay 0 */

/* What one operation's callback reported. */
typedef struct res_s {
  int calls;
  int status;
  osr_resource_t res;
  osr_resource_t list[16]; /* list: the first 16 resources */
  size_t n;
  const char *want;        /* list: the sandbox id to look for */
  int found;               /* list: how often `want` was in it */
  osr_resource_state_t found_state;
} res_t;

void note_call(res_t *r, int status);
/* Callbacks for create/resume/get, destroy/pause and list; data = res_t. */
void on_create(osr_provider_t *p, int status, const osr_resource_t *res, void *data);
void on_done(osr_provider_t *p, int status, void *data);
void on_list(osr_provider_t *p, int status, const osr_resource_t *res, size_t n, void *data);
/* One list_page() answer: the ids of what it held (those whose sandbox id
 * starts with `prefix`, or all if it is NULL; at most 32) and its next cursor. */
typedef struct page_s {
  res_t r;
  const char *prefix;
  char sandbox_ids[32][80];
  char provider_ids[32][128];
  size_t n, nids;
  char next[512];
  int has_next;
} page_t;
/* The list_page callback; data = page_t (prefix kept, the rest reset). */
void on_page(osr_provider_t *p, int status, const osr_resource_t *res, size_t n, const char *next,
             void *data);
/* Run the loop until *flag becomes non-zero or `ms` pass (bounded). */
void run_until(const int *flag, uint64_t ms);
/* The close callback: counts into `closed` (checks it ran later). */
extern int closed;
void on_closed(osr_provider_t *p);
/* close() the adapter, check its callback runs once and later, free p. */
void adapter_free(osr_provider_t *p);

#endif
