/*
 * The binding store, backend-independent part: argument checks, the request
 * queue, the worker threads with group commit, the uv_async_t that brings
 * results back to the loop thread, and every operation written once against
 * the SQL layer of store_int.h.
 *
 * Life of a request. osr_store_*() validates and copies its arguments into an
 * osr__req_t (the caller's memory may go away at once) and appends it to a
 * loop-side list; once per loop turn (a prepare and a check handle, before
 * and after the poll phase) that list moves to the queue under one lock and
 * one wake-up. Handing requests over one at a time woke the worker for each
 * (on one CPU it preempts the loop at once), so at C = 10 most batches held
 * one request: 1.05 commits and 4.2 context switches per create. A worker
 * takes everything queued (up to
 * OSR__STORE_BATCH_MAX), runs it in ONE transaction, appends the requests to
 * the done list and pokes the async handle; the loop thread then calls each
 * callback and frees the request. Because every result travels through the
 * done list, a callback never runs inside the call that queued it, including
 * the early failures (queue full, database down).
 *
 * Group commit is where the throughput comes from: while one commit is being
 * written (and, with sync=full, fsynced), new requests pile up and the next
 * batch commits them all with one more write. Reads ride in the same
 * transaction; they see the batch's own earlier writes.
 *
 * Failure handling inside a batch. A request whose logical answer is "not
 * found" or "already exists" is not a failure: it sets its own status and the
 * batch goes on. A statement that fails (PostgreSQL then aborts the whole
 * transaction) rolls the batch back and every request in it is run again in a
 * transaction of its own, so one bad request cannot fail its neighbours. A
 * lost connection is retried once on a fresh connection when nothing can
 * have been committed (the failure came before COMMIT was sent); otherwise
 * the batch answers OSR_EUNAVAILABLE.
 *
 * Fast failure while the database is down: after a failed connect every
 * worker fails what it takes from the queue at once for CIRCUIT_MS before any
 * worker tries to connect again (a circuit in the store shared by all
 * workers), so the API answers `unavailable` in microseconds instead of
 * queueing behind connect timeouts.
 *
 * Close: osr_store_close refuses new calls, lets the workers drain the queue,
 * and each worker frees its connection on its own thread and exits. When the
 * last has exited and its results have been delivered, the loop thread joins
 * the threads and closes the async handle; its close callback frees the
 * store and calls the user's callback.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "store/store_int.h"
#include "util/log.h"
#include "util/mem.h"

#define CIRCUIT_MS 500

typedef enum req_op_e {
  OP_OPEN = 1,
  OP_CREATE,
  OP_UPDATE,
  OP_GET,
  OP_LIST,
  OP_TOUCH,
  OP_KEY_PUT,
  OP_KEY_LOOKUP,
  OP_KEY_LIST,
  OP_KEY_REVOKE,
  OP_AUDIT_APPEND,
  OP_AUDIT_LIST,
  OP_COUNT,
} req_op_t;

/* One metadata entry, flattened from the JSON object on the loop thread. */
typedef struct meta_kv_s {
  char *k;
  char *v;
} meta_kv_t;

typedef struct osr__req_s osr__req_t;
struct osr__req_s {
  osr__req_t *next;
  req_op_t op;
  int status;
  uint64_t t0;                    /* uv_hrtime() at submission */
  uint64_t t_run, t_ran;          /* its batch started / ended (worker, uv_hrtime) */
  int relaxed;                    /* UPDATE: commit without waiting for the disk */
  int background;                 /* LIST, COUNT: may run on the background worker */
  union {
    void (*any)(void);            /* what req_new stores; read as the typed member */
    osr_store_open_cb open;
    osr_store_done_cb done;
    osr_store_binding_cb binding;
    osr_store_list_cb list;
    osr_store_key_cb key;
    osr_store_keys_cb keys;
    osr_store_audit_cb audit;
    osr_store_counts_cb counts;
  } cb;
  void *data;
  union {
    struct {                      /* CREATE, UPDATE, GET */
      osr_binding_t b;            /* input (create/update; GET: only the id) */
      osr_binding_t out;          /* GET's row, or CREATE's existing row */
      int created;
      int any_tenant;             /* GET with tenant NULL */
      char tenant[OSR_TENANT_MAX];
      meta_kv_t *meta;            /* CREATE */
      size_t nmeta;
      osr_binding_state_t if_state;   /* UPDATE: compare-and-set (0 = off) */
      int64_t if_updated_ms;
      int has_audit;              /* UPDATE: append ev if the update applied */
      osr_audit_event_t ev;
    } bind;
    struct {                      /* LIST */
      int has_tenant;
      char tenant[OSR_TENANT_MAX];
      unsigned state_mask;
      meta_kv_t *filters;
      size_t nfilters;
      int has_cursor;
      int64_t cur_created;
      char cur_id[OSR_ID_MAX];
      size_t limit;
      int64_t expires_before_ms;
      int64_t due_at_ms;
      int has_owner;
      char owner[OSR_OWNER_MAX];
      int64_t created_before_ms;
      osr_binding_t *items;       /* output */
      size_t n;
      char next_cursor[OSR_ID_MAX + 24];
    } list;
    struct {                      /* TOUCH */
      char id[OSR_ID_MAX];
      int64_t at_ms;
      osr__req_t *leader;         /* coalesced into this request's update */
    } touch;
    struct {                      /* KEY_PUT, KEY_LOOKUP, KEY_REVOKE */
      osr_api_key_t k;
      int64_t at_ms;
    } key;
    struct {                      /* KEY_LIST */
      int has_tenant;
      char tenant[OSR_TENANT_MAX];
      osr_api_key_t *items;
      size_t n;
    } keys;
    struct {                      /* AUDIT_APPEND */
      osr_audit_event_t ev;
    } audit;
    struct {                      /* AUDIT_LIST */
      int has_tenant;
      char tenant[OSR_TENANT_MAX];
      int64_t before_seq;         /* 0 = newest */
      size_t limit;
      osr_audit_event_t *items;
      size_t n;
      char next_cursor[24];
    } alist;
    struct {                      /* COUNT */
      int has_tenant;
      char tenant[OSR_TENANT_MAX];
      uint64_t counts[OSR_BINDING_LOST + 1];
    } count;
  } u;
};

struct osr_store_s {
  uv_loop_t *loop;
  uv_async_t async;
  uv_prepare_t flush_prepare;     /* hand the loop turn's requests over */
  uv_check_t flush_check;
  int open_handles;               /* of the three above, not yet closed */
  const osr__db_vtbl_t *be;
  osr__store_cfg_t cfg;

  /* Loop thread only. */
  int closing;                    /* osr_store_close was called */
  int close_started;              /* uv_close(&async) was called */
  void (*close_cb)(void *data);
  void *close_data;
  size_t outstanding;             /* submitted, callback not yet called */
  osr__req_t *pend_head, *pend_tail; /* submitted this loop turn, not queued */
  uint64_t last_latency_us;
  osr_store_timing_t last_timing; /* of the request whose callback runs */

  /* Shared with the workers, under mu. */
  uv_mutex_t mu;
  uv_cond_t cv;
  osr__req_t *q_head, *q_tail;
  size_t q_len;
  /* The background lane (see "Background reads" below): its own queue,
   * condition and worker, when the backend has a reader connection. */
  osr__req_t *bg_head, *bg_tail;
  size_t bg_len;
  uv_cond_t bg_cv;
  int has_bg;
  osr__req_t *done_head, *done_tail;
  int stopping;
  int exited;

  int nworkers;
  int no_workers;                 /* none could be started: shed everything */
  uv_thread_t *threads;

  /* Shared by the workers without the queue lock. */
  uv_mutex_t migrate_mu;
  atomic_int migrated;
  atomic_llong circuit_until_ms;  /* monotonic ms; connect attempts wait until then */
  atomic_ullong n_tx, n_req, n_rowstmt, n_rows, n_split, n_flush; /* osr_store_stats */
  atomic_ullong n_wal_restart, n_wal_miss;                /* osr__store_count */
};

/* ---- small helpers ------------------------------------------------------------ */

int64_t osr__store_mono_ms(void)
{
  return (int64_t)(uv_hrtime() / 1000000u);
}

static int64_t wall_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const osr__store_cfg_t *osr__store_cfg(const osr_store_t *st)
{
  return &st->cfg;
}

osr__store_cfg_t *osr__store_cfg_mut(osr_store_t *st)
{
  return &st->cfg;
}

/* Copy a NUL-terminated string into a fixed array, truncating. */
static void scpy(char *dst, size_t cap, const char *src)
{
  size_t n;
  if (src == NULL)
    src = "";
  n = strnlen(src, cap - 1);
  memcpy(dst, src, n);
  dst[n] = '\0';
}

/* 1 if `s` is NUL-terminated within `cap` bytes (callers' fixed arrays). */
static int fits(const char *s, size_t cap)
{
  return s != NULL && memchr(s, '\0', cap) != NULL;
}

static int json_ok(const char *s)
{
  return s == NULL || strnlen(s, OSR__STORE_JSON_MAX + 1) <= OSR__STORE_JSON_MAX;
}

static char *dup_or_null(const char *s)
{
  return s != NULL ? osr_xstrdup(s) : NULL;
}

/* ---- bindings: value helpers ---------------------------------------------------- */

static const char *const state_names[] = {
  [OSR_BINDING_CREATING] = "creating", [OSR_BINDING_RUNNING] = "running",
  [OSR_BINDING_PAUSED] = "paused",     [OSR_BINDING_ENDED] = "ended",
  [OSR_BINDING_FAILED] = "failed",     [OSR_BINDING_LOST] = "lost",
};

const char *osr_binding_state_name(osr_binding_state_t s)
{
  if ((int)s <= 0 || (size_t)s >= OSR_ARRAY_SIZE(state_names))
    return "unknown";
  return state_names[s];
}

osr_binding_state_t osr_binding_state_parse(const char *s)
{
  size_t i;
  if (s == NULL)
    return (osr_binding_state_t)0;
  for (i = 1; i < OSR_ARRAY_SIZE(state_names); i++)
    if (strcmp(s, state_names[i]) == 0)
      return (osr_binding_state_t)i;
  return (osr_binding_state_t)0;
}

void osr_binding_init(osr_binding_t *b)
{
  memset(b, 0, sizeof(*b));
}

void osr_binding_dispose(osr_binding_t *b)
{
  osr_freep(&b->request_json);
  osr_freep(&b->granted_json);
  osr_freep(&b->metadata_json);
  osr_freep(&b->error_json);
}

void osr_binding_copy(osr_binding_t *dst, const osr_binding_t *src)
{
  if (dst == src)
    return;
  memcpy(dst, src, sizeof(*dst));
  dst->request_json = dup_or_null(src->request_json);
  dst->granted_json = dup_or_null(src->granted_json);
  dst->metadata_json = dup_or_null(src->metadata_json);
  dst->error_json = dup_or_null(src->error_json);
}

static int binding_strings_ok(const osr_binding_t *b)
{
  return fits(b->id, sizeof(b->id)) && fits(b->tenant, sizeof(b->tenant)) &&
         fits(b->idem_key, sizeof(b->idem_key)) && fits(b->request_hash, sizeof(b->request_hash)) &&
         fits(b->template_id, sizeof(b->template_id)) && fits(b->provider, sizeof(b->provider)) &&
         fits(b->provider_id, sizeof(b->provider_id)) && fits(b->region, sizeof(b->region)) &&
         fits(b->agent_endpoint, sizeof(b->agent_endpoint)) &&
         fits(b->end_reason, sizeof(b->end_reason)) && fits(b->owner, sizeof(b->owner)) &&
         json_ok(b->request_json) &&
         json_ok(b->granted_json) && json_ok(b->metadata_json) && json_ok(b->error_json);
}

static void meta_free(meta_kv_t *m, size_t n)
{
  size_t i;
  for (i = 0; i < n; i++) {
    osr_free(m[i].k);
    osr_free(m[i].v);
  }
  osr_free(m);
}

/* Flatten a metadata document: a JSON object whose values are all strings,
 * with bounded key/value sizes and entry count. Runs on the loop thread at
 * call time so a bad document is an OSR_EINVAL return, as for any other bad
 * argument; the document is at most OSR__STORE_JSON_MAX bytes. */
static int meta_parse(const char *text, meta_kv_t **out, size_t *nout)
{
  json_t *root, *val;
  json_error_t err;
  const char *key;
  meta_kv_t *m = NULL;
  size_t n = 0;
  int rv = 0;

  *out = NULL;
  *nout = 0;
  if (text == NULL || *text == '\0')
    return 0;
  root = json_loads(text, JSON_REJECT_DUPLICATES, &err);
  if (root == NULL || !json_is_object(root) || json_object_size(root) > OSR__STORE_META_KEYS_MAX) {
    json_decref(root);
    return OSR_EINVAL;
  }
  if (json_object_size(root) > 0)
    m = osr_xcalloc(json_object_size(root), sizeof(*m));
  json_object_foreach(root, key, val)
  {
    const char *v = json_string_value(val);
    if (v == NULL || strlen(key) > OSR__STORE_META_STR_MAX ||
        json_string_length(val) > OSR__STORE_META_STR_MAX || strlen(v) != json_string_length(val)) {
      rv = OSR_EINVAL;
      break;
    }
    m[n].k = osr_xstrdup(key);
    m[n].v = osr_xstrdup(v);
    n++;
  }
  json_decref(root);
  if (rv != 0) {
    meta_free(m, n);
    return rv;
  }
  *out = m;
  *nout = n;
  return 0;
}

/* ---- requests ---------------------------------------------------------------------- */

typedef void (*any_cb_t)(void);

static osr__req_t *req_new(req_op_t op, any_cb_t cb, void *data)
{
  osr__req_t *r = osr_xcalloc(1, sizeof(*r));
  r->op = op;
  r->data = data;
  /* Stored through the generic member, called through the typed one that
   * matches `op` in deliver(). */
  r->cb.any = cb;
  return r;
}

/* Forget outputs so a request can run again (batch retry). */
static void req_reset_out(osr__req_t *r)
{
  size_t i;
  r->status = 0;
  switch (r->op) {
  case OP_CREATE:
  case OP_GET:
    r->u.bind.created = 0;
    osr_binding_dispose(&r->u.bind.out);
    break;
  case OP_LIST:
    for (i = 0; i < r->u.list.n; i++)
      osr_binding_dispose(&r->u.list.items[i]);
    osr_freep(&r->u.list.items);
    r->u.list.n = 0;
    r->u.list.next_cursor[0] = '\0';
    break;
  case OP_KEY_LIST:
    osr_freep(&r->u.keys.items);
    r->u.keys.n = 0;
    break;
  case OP_COUNT:
    memset(r->u.count.counts, 0, sizeof(r->u.count.counts));
    break;
  case OP_AUDIT_LIST:
    for (i = 0; i < r->u.alist.n; i++)
      osr_free(r->u.alist.items[i].detail_json);
    osr_freep(&r->u.alist.items);
    r->u.alist.n = 0;
    r->u.alist.next_cursor[0] = '\0';
    break;
  default:
    break;
  }
}

static void req_free(osr__req_t *r)
{
  req_reset_out(r);
  switch (r->op) {
  case OP_CREATE:
  case OP_UPDATE:
  case OP_GET:
    osr_binding_dispose(&r->u.bind.b);
    meta_free(r->u.bind.meta, r->u.bind.nmeta);
    osr_free(r->u.bind.ev.detail_json);
    break;
  case OP_LIST:
    meta_free(r->u.list.filters, r->u.list.nfilters);
    break;
  case OP_AUDIT_APPEND:
    osr_free(r->u.audit.ev.detail_json);
    break;
  default:
    break;
  }
  osr_free(r);
}

/* The status a caller sees: internal database codes become "unavailable". */
static int public_status(int s)
{
  if (s == OSR__EDB || s == OSR_EAGAIN)
    return OSR_EUNAVAILABLE;
  return s;
}

static void deliver(osr_store_t *st, osr__req_t *r)
{
  int s = public_status(r->status);
  const char *cur;

  uint64_t now = uv_hrtime();
  st->last_latency_us = (now - r->t0) / 1000u;
  st->last_timing.submitted_us = r->t0 / 1000u;
  st->last_timing.batch_start_us = r->t_run / 1000u;
  st->last_timing.batch_end_us = r->t_ran / 1000u;
  st->last_timing.delivered_us = now / 1000u;
  switch (r->op) {
  case OP_OPEN:
    if (r->cb.open != NULL)
      r->cb.open(st, s, r->data);
    break;
  case OP_CREATE:
  case OP_GET: {
    const osr_binding_t *b = r->op == OP_CREATE && r->u.bind.created ? &r->u.bind.b : &r->u.bind.out;
    if (r->cb.binding != NULL)
      r->cb.binding(s, s == 0 ? b : NULL, s == 0 ? r->u.bind.created : 0, r->data);
    break;
  }
  case OP_LIST:
    cur = r->u.list.next_cursor[0] != '\0' ? r->u.list.next_cursor : NULL;
    if (r->cb.list != NULL)
      r->cb.list(s, s == 0 ? r->u.list.items : NULL, s == 0 ? r->u.list.n : 0, s == 0 ? cur : NULL,
                 r->data);
    break;
  case OP_KEY_LOOKUP:
    if (r->cb.key != NULL)
      r->cb.key(s, s == 0 ? &r->u.key.k : NULL, r->data);
    break;
  case OP_KEY_LIST:
    if (r->cb.keys != NULL)
      r->cb.keys(s, s == 0 ? r->u.keys.items : NULL, s == 0 ? r->u.keys.n : 0, r->data);
    break;
  case OP_AUDIT_LIST:
    cur = r->u.alist.next_cursor[0] != '\0' ? r->u.alist.next_cursor : NULL;
    if (r->cb.audit != NULL)
      r->cb.audit(s, s == 0 ? r->u.alist.items : NULL, s == 0 ? r->u.alist.n : 0, s == 0 ? cur : NULL,
                  r->data);
    break;
  case OP_COUNT:
    if (r->cb.counts != NULL)
      r->cb.counts(s, s == 0 ? r->u.count.counts : NULL, s == 0 ? OSR_BINDING_LOST + 1 : 0, r->data);
    break;
  default:
    if (r->cb.done != NULL)
      r->cb.done(s, r->data);
    break;
  }
}

/* ---- the loop-thread side ----------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h)
{
  osr_store_t *st = h->data;
  void (*cb)(void *) = st->close_cb;
  void *data = st->close_data;

  if (--st->open_handles > 0)
    return;
  uv_mutex_destroy(&st->mu);
  uv_cond_destroy(&st->cv);
  uv_cond_destroy(&st->bg_cv);
  uv_mutex_destroy(&st->migrate_mu);
  if (st->be != NULL && st->be->unconfigure != NULL)
    st->be->unconfigure(st);
  osr_free(st->cfg.target);
  osr_free(st->threads);
  osr_free(st);
  if (cb != NULL)
    cb(data);
}

/* Close for real once every worker has exited and every result is out. */
static void maybe_finish_close(osr_store_t *st)
{
  int i, done;

  if (!st->closing || st->close_started)
    return;
  uv_mutex_lock(&st->mu);
  done = st->exited == st->nworkers && st->done_head == NULL;
  uv_mutex_unlock(&st->mu);
  if (!done)
    return;
  /* The workers have left their loops; joining waits at most for their
   * final uv_async_send, which must not race uv_close. */
  for (i = 0; i < st->nworkers; i++)
    uv_thread_join(&st->threads[i]);
  st->close_started = 1;
  uv_close((uv_handle_t *)&st->flush_prepare, on_handle_closed);
  uv_close((uv_handle_t *)&st->flush_check, on_handle_closed);
  uv_close((uv_handle_t *)&st->async, on_handle_closed);
}

static void on_async(uv_async_t *a)
{
  osr_store_t *st = osr_container_of(a, osr_store_t, async);
  osr__req_t *list, *r;

  uv_mutex_lock(&st->mu);
  list = st->done_head;
  st->done_head = st->done_tail = NULL;
  uv_mutex_unlock(&st->mu);

  while ((r = list) != NULL) {
    list = r->next;
    st->outstanding--;
    deliver(st, r);
    req_free(r);
  }
  /* Idle, the store does not keep the loop alive (like a libuv request that
   * is not pending); close keeps it referenced until the handle is closed. */
  if (st->outstanding == 0 && !st->closing)
    uv_unref((uv_handle_t *)&st->async);
  maybe_finish_close(st);
}

/* Append r to the list head..tail (the queue, the done list, the loop turn's). */
static void req_append(osr__req_t **head, osr__req_t **tail, osr__req_t *r)
{
  r->next = NULL;
  if (*tail != NULL)
    (*tail)->next = r;
  else
    *head = r;
  *tail = r;
}

/* Move the requests submitted since the last call to the workers' queue:
 * one lock, one wake-up. */
static void flush(osr_store_t *st)
{
  osr__req_t *r = st->pend_head, *next;
  size_t queued = 0, bg_queued = 0;
  int shed = 0;

  if (r == NULL)
    return;
  st->pend_head = st->pend_tail = NULL;
  uv_mutex_lock(&st->mu);
  for (; r != NULL; r = next) {
    next = r->next;
    if (st->q_len + st->bg_len >= OSR__STORE_QUEUE_MAX || st->no_workers) {
      /* Shed load rather than queue without bound; the answer still
       * arrives through the async handle, never from inside the call. */
      r->status = OSR_EUNAVAILABLE;
      req_append(&st->done_head, &st->done_tail, r);
      shed = 1;
    } else if (r->background && st->has_bg && atomic_load(&st->migrated)) {
      /* Once the schema is in place (the reader never migrates). */
      req_append(&st->bg_head, &st->bg_tail, r);
      st->bg_len++;
      bg_queued++;
    } else {
      req_append(&st->q_head, &st->q_tail, r);
      st->q_len++;
      queued++;
    }
  }
  /* One worker takes a whole batch; wake them all only when there is more
   * than one request (several workers on PostgreSQL share the queue). */
  if (queued == 1)
    uv_cond_signal(&st->cv);
  else if (queued > 1)
    uv_cond_broadcast(&st->cv);
  if (bg_queued > 0)
    uv_cond_signal(&st->bg_cv);
  uv_mutex_unlock(&st->mu);
  if (shed)
    uv_async_send(&st->async);
}

static void on_flush_prepare(uv_prepare_t *h)
{
  flush(h->data);
}

static void on_flush_check(uv_check_t *h)
{
  flush(h->data);
}

static int submit(osr_store_t *st, osr__req_t *r)
{
  r->t0 = uv_hrtime();
  st->outstanding++;
  uv_ref((uv_handle_t *)&st->async); /* the loop turns until it is answered */
  req_append(&st->pend_head, &st->pend_tail, r);
  if (st->closing)
    flush(st); /* the workers are draining: no later turn to wait for */
  return 0;
}

/* ---- the worker side: SQL helpers ------------------------------------------------------ */

#define A_TEXT(x) ((osr__sql_arg_t){.s = (x), .i = 0, .is_int = 0})
#define A_INT(x) ((osr__sql_arg_t){.s = NULL, .i = (int64_t)(x), .is_int = 1})

static void row_to_binding(const osr__db_vtbl_t *be, osr__db_t *db, osr_binding_t *b)
{
  osr_binding_init(b);
  scpy(b->id, sizeof(b->id), be->col_text(db, OSR__BC_ID));
  scpy(b->tenant, sizeof(b->tenant), be->col_text(db, OSR__BC_TENANT));
  scpy(b->idem_key, sizeof(b->idem_key), be->col_text(db, OSR__BC_IDEM));
  scpy(b->request_hash, sizeof(b->request_hash), be->col_text(db, OSR__BC_HASH));
  scpy(b->template_id, sizeof(b->template_id), be->col_text(db, OSR__BC_TEMPLATE));
  scpy(b->provider, sizeof(b->provider), be->col_text(db, OSR__BC_PROVIDER));
  scpy(b->provider_id, sizeof(b->provider_id), be->col_text(db, OSR__BC_PROVIDER_ID));
  scpy(b->region, sizeof(b->region), be->col_text(db, OSR__BC_REGION));
  b->isolation = (osr_isolation_t)be->col_int(db, OSR__BC_ISOLATION);
  scpy(b->agent_endpoint, sizeof(b->agent_endpoint), be->col_text(db, OSR__BC_ENDPOINT));
  b->state = (osr_binding_state_t)be->col_int(db, OSR__BC_STATE);
  b->attempt = (int)be->col_int(db, OSR__BC_ATTEMPT);
  b->created_ms = be->col_int(db, OSR__BC_CREATED);
  b->updated_ms = be->col_int(db, OSR__BC_UPDATED);
  b->expires_ms = be->col_int(db, OSR__BC_EXPIRES);
  b->idle_timeout_ms = be->col_int(db, OSR__BC_IDLE);
  b->last_activity_ms = be->col_int(db, OSR__BC_ACTIVITY);
  b->ended_ms = be->col_int(db, OSR__BC_ENDED);
  scpy(b->end_reason, sizeof(b->end_reason), be->col_text(db, OSR__BC_END_REASON));
  b->request_json = dup_or_null(be->col_text(db, OSR__BC_REQUEST));
  b->granted_json = dup_or_null(be->col_text(db, OSR__BC_GRANTED));
  b->metadata_json = dup_or_null(be->col_text(db, OSR__BC_METADATA));
  b->error_json = dup_or_null(be->col_text(db, OSR__BC_ERROR));
  scpy(b->owner, sizeof(b->owner), be->col_text(db, OSR__BC_OWNER));
}

static void row_to_key(const osr__db_vtbl_t *be, osr__db_t *db, osr_api_key_t *k)
{
  memset(k, 0, sizeof(*k));
  scpy(k->key_id, sizeof(k->key_id), be->col_text(db, 0));
  scpy(k->tenant, sizeof(k->tenant), be->col_text(db, 1));
  k->role = (osr_role_t)be->col_int(db, 2);
  scpy(k->hash, sizeof(k->hash), be->col_text(db, 3));
  scpy(k->name, sizeof(k->name), be->col_text(db, 4));
  k->created_ms = be->col_int(db, 5);
  k->revoked_ms = be->col_int(db, 6);
}

/* Run a query expected to return at most one row; *found says whether it
 * did. Returns 0 or a database error. */
static int query_one(const osr__db_vtbl_t *be, osr__db_t *db, int stmt, const osr__sql_arg_t *args,
                     int nargs, int *found, void (*fill)(const osr__db_vtbl_t *, osr__db_t *, void *),
                     void *out)
{
  int rv = be->query(db, stmt, NULL, args, nargs);
  *found = 0;
  if (rv == 0) {
    rv = be->row_next(db);
    if (rv > 0) {
      fill(be, db, out);
      *found = 1;
      rv = 0;
    }
  }
  be->query_end(db);
  return rv;
}

static void fill_binding_cb(const osr__db_vtbl_t *be, osr__db_t *db, void *out)
{
  row_to_binding(be, db, out);
}

static void fill_nothing_cb(const osr__db_vtbl_t *be, osr__db_t *db, void *out)
{
  (void)be;
  (void)db;
  (void)out;
}

static void fill_key_cb(const osr__db_vtbl_t *be, osr__db_t *db, void *out)
{
  row_to_key(be, db, out);
}

/* A tiny bounded string builder for the dynamic list queries. */
typedef struct sqlb_s {
  char buf[4096];
  size_t len;
  int overflow;
} sqlb_t;

static void sqlb_add(sqlb_t *q, const char *fmt, ...) OSR_PRINTF(2, 3);
static void sqlb_add(sqlb_t *q, const char *fmt, ...)
{
  va_list ap;
  int n;
  if (q->overflow)
    return;
  va_start(ap, fmt);
  n = vsnprintf(q->buf + q->len, sizeof(q->buf) - q->len, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof(q->buf) - q->len)
    q->overflow = 1;
  else
    q->len += (size_t)n;
}

/* ---- the worker side: operations ------------------------------------------------------ */

/* Each op returns 0 with r->status set to its logical answer (0,
 * OSR_ENOTFOUND, OSR_ECONFLICT), or a database error that aborts the
 * transaction it runs in. */

/* The parameters of B_INSERT for one binding, in column order. */
#define CREATE_NARGS 24
static void create_args(const osr_binding_t *b, osr__sql_arg_t *a)
{
  const osr__sql_arg_t v[CREATE_NARGS] = {
    A_TEXT(b->id), A_TEXT(b->tenant), A_TEXT(b->idem_key), A_TEXT(b->request_hash),
    A_TEXT(b->template_id), A_TEXT(b->provider), A_TEXT(b->provider_id), A_TEXT(b->region),
    A_INT(b->isolation), A_TEXT(b->agent_endpoint), A_INT(b->state), A_INT(b->attempt),
    A_INT(b->created_ms), A_INT(b->updated_ms), A_INT(b->expires_ms), A_INT(b->idle_timeout_ms),
    A_INT(b->last_activity_ms), A_INT(b->ended_ms), A_TEXT(b->end_reason),
    A_TEXT(b->request_json), A_TEXT(b->granted_json), A_TEXT(b->metadata_json),
    A_TEXT(b->error_json), A_TEXT(b->owner),
  };
  memcpy(a, v, sizeof(v));
}

/* The binding row was inserted: its metadata rows follow. */
static int create_written(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t *r)
{
  const osr_binding_t *b = &r->u.bind.b;
  size_t i;
  int rv;

  for (i = 0; i < r->u.bind.nmeta; i++) {
    osr__sql_arg_t m[3] = {A_TEXT(b->id), A_TEXT(r->u.bind.meta[i].k), A_TEXT(r->u.bind.meta[i].v)};
    rv = be->exec(db, OSR__ST_META_INSERT, NULL, m, 3, NULL);
    if (rv != 0)
      return rv;
  }
  r->u.bind.created = 1;
  r->status = 0;
  return 0;
}

/* Nothing was inserted: the (tenant, key) row exists (committed by anyone,
 * or inserted earlier in this very batch, even by the same statement) and is
 * the answer. With no key the conflict can only be the id itself. */
static int create_not_written(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t *r)
{
  const osr_binding_t *b = &r->u.bind.b;
  osr__sql_arg_t k[2] = {A_TEXT(b->tenant), A_TEXT(b->idem_key)};
  int rv, found;

  r->u.bind.created = 0;
  if (b->idem_key[0] == '\0') {
    r->status = OSR_ECONFLICT;
    return 0;
  }
  rv = query_one(be, db, OSR__ST_B_BY_KEY, k, 2, &found, fill_binding_cb, &r->u.bind.out);
  if (rv != 0)
    return rv;
  r->status = found ? 0 : OSR_ECONFLICT;
  return 0;
}

static int op_create(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t *r)
{
  osr__sql_arg_t a[CREATE_NARGS];
  int64_t changes = 0;
  int rv;

  create_args(&r->u.bind.b, a);
  rv = be->exec(db, OSR__ST_B_INSERT, NULL, a, CREATE_NARGS, &changes);
  if (rv != 0)
    return rv;
  return changes == 1 ? create_written(be, db, r) : create_not_written(be, db, r);
}

static int op_audit_insert(const osr__db_vtbl_t *be, osr__db_t *db, const osr_audit_event_t *e);

/* The parameters of B_UPDATE_IF for one request (B_UPDATE takes the first
 * 17), in order. */
#define UPDATE_NARGS 19
static void update_args(const osr__req_t *r, osr__sql_arg_t *a)
{
  const osr_binding_t *b = &r->u.bind.b;
  const osr__sql_arg_t v[UPDATE_NARGS] = {
    A_TEXT(b->id), A_TEXT(b->provider), A_TEXT(b->provider_id), A_TEXT(b->region),
    A_INT(b->isolation), A_TEXT(b->agent_endpoint), A_INT(b->state), A_INT(b->attempt),
    A_INT(b->updated_ms), A_INT(b->expires_ms), A_INT(b->idle_timeout_ms),
    A_INT(b->last_activity_ms), A_INT(b->ended_ms), A_TEXT(b->end_reason),
    A_TEXT(b->granted_json), A_TEXT(b->error_json), A_TEXT(b->owner),
    A_INT(r->u.bind.if_state), A_INT(r->u.bind.if_updated_ms),
  };
  memcpy(a, v, sizeof(v));
}

static int update_is_cond(const osr__req_t *r)
{
  return r->u.bind.if_state != 0 || r->u.bind.if_updated_ms != 0;
}

/* The update changed no row: lost the compare-and-set, or the row is gone.
 * Callers treat these differently (someone else resolved it vs nothing to
 * resolve). */
static int update_missed(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t *r)
{
  osr__sql_arg_t a[1] = {A_TEXT(r->u.bind.b.id)};
  int rv, found;

  r->status = OSR_ENOTFOUND;
  if (!update_is_cond(r))
    return 0;
  rv = query_one(be, db, OSR__ST_B_EXISTS, a, 1, &found, fill_nothing_cb, NULL);
  if (rv != 0)
    return rv;
  if (found)
    r->status = OSR_ECONFLICT;
  return 0;
}

static int op_update(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t *r)
{
  osr__sql_arg_t a[UPDATE_NARGS];
  int64_t changes = 0;
  int rv, cond = update_is_cond(r);

  update_args(r, a);
  rv = be->exec(db, cond ? OSR__ST_B_UPDATE_IF : OSR__ST_B_UPDATE, NULL, a,
                cond ? UPDATE_NARGS : UPDATE_NARGS - 2, &changes);
  if (rv != 0)
    return rv;
  if (changes == 0)
    return update_missed(be, db, r);
  /* The audit row rides in the same transaction: it exists exactly when
   * the change it describes was committed, at no extra commit. */
  if (r->u.bind.has_audit) {
    rv = op_audit_insert(be, db, &r->u.bind.ev);
    if (rv != 0)
      return rv;
  }
  r->status = 0;
  return 0;
}

static int op_get(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t *r)
{
  osr__sql_arg_t a[1] = {A_TEXT(r->u.bind.b.id)};
  int found, rv;

  rv = query_one(be, db, OSR__ST_B_BY_ID, a, 1, &found, fill_binding_cb, &r->u.bind.out);
  if (rv != 0)
    return rv;
  if (!found) {
    r->status = OSR_ENOTFOUND;
    return 0;
  }
  if (!r->u.bind.any_tenant && strcmp(r->u.bind.out.tenant, r->u.bind.tenant) != 0) {
    /* Another tenant's sandbox is indistinguishable from a missing one. */
    osr_binding_dispose(&r->u.bind.out);
    r->status = OSR_ENOTFOUND;
    return 0;
  }
  r->status = 0;
  return 0;
}

static int op_list(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t *r)
{
  osr__sql_arg_t a[10 + 2 * OSR__STORE_META_FILTERS_MAX];
  sqlb_t q;
  int na = 0, rv, first = 1, s;
  size_t i, cap = 0;

  q.len = 0;
  q.overflow = 0;
  sqlb_add(&q, "%s WHERE 1 = 1", osr__sql_binding_select);
  if (r->u.list.has_tenant) {
    a[na++] = A_TEXT(r->u.list.tenant);
    sqlb_add(&q, " AND tenant = $%d", na);
  }
  if (r->u.list.state_mask == (1u << OSR_BINDING_CREATING)) {
    /* Recovery's creating rows: the partial index bindings_creating
     * (WHERE state = 1) serves exactly this term. */
    sqlb_add(&q, " AND state = %d", OSR_BINDING_CREATING);
  } else if (r->u.list.state_mask != 0) {
    /* Our own small integers, written as literals: one text per mask is
     * fine and keeps the parameter count fixed. "+state" keeps the planner
     * off the state index: a page is LIMIT rows in (created_ms, id) order,
     * which an index in that order yields by walking forward from the
     * cursor, while "state IN (...)" by the state index reads and sorts
     * every matching row for every page (a reaper pass over N live
     * bindings was O(N^2 / page) on SQLite). */
    sqlb_add(&q, " AND +state IN (");
    for (s = OSR_BINDING_CREATING; s <= OSR_BINDING_LOST; s++) {
      if (r->u.list.state_mask & (1u << s)) {
        sqlb_add(&q, "%s%d", first ? "" : ", ", s);
        first = 0;
      }
    }
    sqlb_add(&q, "%s)", first ? "NULL" : "");
  }
  if (r->u.list.expires_before_ms != 0) {
    a[na++] = A_INT(r->u.list.expires_before_ms);
    sqlb_add(&q, " AND expires_ms <> 0 AND expires_ms < $%d", na);
  }
  if (r->u.list.due_at_ms != 0) {
    /* The reaper's TTL passes (reaper.c expiry_reason, the same rule):
     * the background worker walks the page order and filters, so the loop
     * gets the due rows only, not every live one. */
    a[na++] = A_INT(r->u.list.due_at_ms);
    sqlb_add(&q,
             " AND ((expires_ms <> 0 AND expires_ms <= $%d) OR (idle_timeout_ms <> 0 AND "
             "last_activity_ms <> 0 AND last_activity_ms + idle_timeout_ms <= $%d))",
             na, na);
  }
  if (r->u.list.has_owner) {
    a[na++] = A_TEXT(r->u.list.owner);
    sqlb_add(&q, " AND owner = $%d", na);
  }
  if (r->u.list.created_before_ms != 0) {
    a[na++] = A_INT(r->u.list.created_before_ms);
    sqlb_add(&q, " AND created_ms < $%d", na);
  }
  if (r->u.list.has_cursor) {
    a[na++] = A_INT(r->u.list.cur_created);
    a[na++] = A_TEXT(r->u.list.cur_id);
    sqlb_add(&q, " AND (created_ms, id) > ($%d, $%d)", na - 1, na);
  }
  for (i = 0; i < r->u.list.nfilters; i++) {
    a[na++] = A_TEXT(r->u.list.filters[i].k);
    a[na++] = A_TEXT(r->u.list.filters[i].v);
    sqlb_add(&q, " AND id IN (SELECT binding_id FROM binding_metadata WHERE k = $%d AND v = $%d)",
             na - 1, na);
  }
  a[na++] = A_INT(r->u.list.limit + 1);
  sqlb_add(&q, " ORDER BY created_ms, id LIMIT $%d", na);
  if (q.overflow) {
    r->status = OSR_EINVAL;
    return 0;
  }

  rv = be->query(db, -1, q.buf, a, na);
  while (rv == 0) {
    rv = be->row_next(db);
    if (rv <= 0)
      break;
    rv = 0;
    if (r->u.list.n == r->u.list.limit) {
      /* One row more than the page: there is a next page. */
      const osr_binding_t *last = &r->u.list.items[r->u.list.n - 1];
      snprintf(r->u.list.next_cursor, sizeof(r->u.list.next_cursor), "%" PRId64 ":%s",
               last->created_ms, last->id);
      break;
    }
    if (r->u.list.n == cap) {
      cap = cap != 0 ? cap * 2 : 16;
      if (cap > r->u.list.limit)
        cap = r->u.list.limit;
      r->u.list.items = osr_xrealloc(r->u.list.items, cap * sizeof(osr_binding_t));
    }
    row_to_binding(be, db, &r->u.list.items[r->u.list.n++]);
  }
  be->query_end(db);
  if (rv < 0)
    return rv;
  r->status = 0;
  return 0;
}

static int op_touch(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t *r)
{
  osr__sql_arg_t a[2] = {A_TEXT(r->u.touch.id), A_INT(r->u.touch.at_ms)};
  int rv = be->exec(db, OSR__ST_B_TOUCH, NULL, a, 2, NULL);
  if (rv == 0)
    r->status = 0;
  return rv;
}

static int op_key_put(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t *r)
{
  const osr_api_key_t *k = &r->u.key.k;
  osr__sql_arg_t a[7] = {A_TEXT(k->key_id), A_TEXT(k->tenant), A_INT(k->role), A_TEXT(k->hash),
                         A_TEXT(k->name),   A_INT(k->created_ms), A_INT(k->revoked_ms)};
  int64_t changes = 0;
  int rv = be->exec(db, OSR__ST_KEY_INSERT, NULL, a, 7, &changes);
  if (rv != 0)
    return rv;
  r->status = changes > 0 ? 0 : OSR_ECONFLICT;
  return 0;
}

static int op_key_lookup(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t *r)
{
  char hash[sizeof(r->u.key.k.hash)];
  osr__sql_arg_t a[1] = {A_TEXT(hash)};
  int found, rv;

  memcpy(hash, r->u.key.k.hash, sizeof(hash));
  rv = query_one(be, db, OSR__ST_KEY_LOOKUP, a, 1, &found, fill_key_cb, &r->u.key.k);
  if (rv != 0)
    return rv;
  r->status = found ? 0 : OSR_ENOTFOUND;
  return 0;
}

static int op_key_list(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t *r)
{
  osr__sql_arg_t a[2];
  int rv, stmt;
  size_t cap = 0;

  if (r->u.keys.has_tenant) {
    a[0] = A_TEXT(r->u.keys.tenant);
    a[1] = A_INT(OSR__STORE_KEYS_MAX);
    stmt = OSR__ST_KEY_LIST_TENANT;
    rv = be->query(db, stmt, NULL, a, 2);
  } else {
    a[0] = A_INT(OSR__STORE_KEYS_MAX);
    stmt = OSR__ST_KEY_LIST_ALL;
    rv = be->query(db, stmt, NULL, a, 1);
  }
  while (rv == 0) {
    rv = be->row_next(db);
    if (rv <= 0)
      break;
    rv = 0;
    if (r->u.keys.n == cap) {
      cap = cap != 0 ? cap * 2 : 8;
      r->u.keys.items = osr_xrealloc(r->u.keys.items, cap * sizeof(osr_api_key_t));
    }
    row_to_key(be, db, &r->u.keys.items[r->u.keys.n++]);
  }
  be->query_end(db);
  if (rv < 0)
    return rv;
  r->status = 0;
  return 0;
}

static int op_key_revoke(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t *r)
{
  osr__sql_arg_t a[2] = {A_TEXT(r->u.key.k.key_id), A_INT(r->u.key.at_ms)};
  int64_t changes = 0;
  int rv = be->exec(db, OSR__ST_KEY_REVOKE, NULL, a, 2, &changes);
  if (rv != 0)
    return rv;
  r->status = changes > 0 ? 0 : OSR_ENOTFOUND;
  return 0;
}

/* The parameters of AUDIT_INSERT for one event, in order. */
#define AUDIT_NARGS 7
static void audit_args(const osr_audit_event_t *e, osr__sql_arg_t *a)
{
  const osr__sql_arg_t v[AUDIT_NARGS] = {A_INT(e->at_ms),      A_TEXT(e->tenant),
                                         A_TEXT(e->actor),     A_TEXT(e->action),
                                         A_TEXT(e->sandbox_id), A_TEXT(e->outcome),
                                         A_TEXT(e->detail_json)};
  memcpy(a, v, sizeof(v));
}

static int op_audit_insert(const osr__db_vtbl_t *be, osr__db_t *db, const osr_audit_event_t *e)
{
  osr__sql_arg_t a[AUDIT_NARGS];
  audit_args(e, a);
  return be->exec(db, OSR__ST_AUDIT_INSERT, NULL, a, AUDIT_NARGS, NULL);
}

static int op_audit_append(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t *r)
{
  int rv = op_audit_insert(be, db, &r->u.audit.ev);
  if (rv == 0)
    r->status = 0;
  return rv;
}

static int op_audit_list(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t *r)
{
  osr__sql_arg_t a[3];
  sqlb_t q;
  int na = 0, rv;
  size_t cap = 0;

  q.len = 0;
  q.overflow = 0;
  sqlb_add(&q, "%s WHERE 1 = 1", osr__sql_audit_select);
  if (r->u.alist.has_tenant) {
    a[na++] = A_TEXT(r->u.alist.tenant);
    sqlb_add(&q, " AND tenant = $%d", na);
  }
  if (r->u.alist.before_seq > 0) {
    a[na++] = A_INT(r->u.alist.before_seq);
    sqlb_add(&q, " AND seq < $%d", na);
  }
  a[na++] = A_INT(r->u.alist.limit + 1);
  sqlb_add(&q, " ORDER BY seq DESC LIMIT $%d", na);

  rv = be->query(db, -1, q.buf, a, na);
  while (rv == 0) {
    osr_audit_event_t *e;
    rv = be->row_next(db);
    if (rv <= 0)
      break;
    rv = 0;
    if (r->u.alist.n == r->u.alist.limit) {
      snprintf(r->u.alist.next_cursor, sizeof(r->u.alist.next_cursor), "%" PRId64,
               r->u.alist.items[r->u.alist.n - 1].seq);
      break;
    }
    if (r->u.alist.n == cap) {
      cap = cap != 0 ? cap * 2 : 16;
      if (cap > r->u.alist.limit)
        cap = r->u.alist.limit;
      r->u.alist.items = osr_xrealloc(r->u.alist.items, cap * sizeof(osr_audit_event_t));
    }
    e = &r->u.alist.items[r->u.alist.n++];
    memset(e, 0, sizeof(*e));
    e->seq = be->col_int(db, 0);
    e->at_ms = be->col_int(db, 1);
    scpy(e->tenant, sizeof(e->tenant), be->col_text(db, 2));
    scpy(e->actor, sizeof(e->actor), be->col_text(db, 3));
    scpy(e->action, sizeof(e->action), be->col_text(db, 4));
    scpy(e->sandbox_id, sizeof(e->sandbox_id), be->col_text(db, 5));
    scpy(e->outcome, sizeof(e->outcome), be->col_text(db, 6));
    e->detail_json = dup_or_null(be->col_text(db, 7));
  }
  be->query_end(db);
  if (rv < 0)
    return rv;
  r->status = 0;
  return 0;
}

/* One GROUP BY instead of paging through every row: the gauge costs one
 * index scan on bindings_state whatever the table's size. */
static int op_count(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t *r)
{
  osr__sql_arg_t a[1];
  int rv;

  if (r->u.count.has_tenant) {
    a[0] = A_TEXT(r->u.count.tenant);
    rv = be->query(db, -1, "SELECT state, COUNT(*) FROM bindings WHERE tenant = $1 GROUP BY state", a,
                   1);
  } else {
    rv = be->query(db, -1, "SELECT state, COUNT(*) FROM bindings GROUP BY state", NULL, 0);
  }
  while (rv == 0) {
    int64_t s, c;
    rv = be->row_next(db);
    if (rv <= 0)
      break;
    rv = 0;
    s = be->col_int(db, 0);
    c = be->col_int(db, 1);
    if (s >= OSR_BINDING_CREATING && s <= OSR_BINDING_LOST && c > 0)
      r->u.count.counts[s] = (uint64_t)c;
  }
  be->query_end(db);
  if (rv < 0)
    return rv;
  r->status = 0;
  return 0;
}

static int run_op(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t *r)
{
  switch (r->op) {
  case OP_OPEN: r->status = 0; return 0;
  case OP_CREATE: return op_create(be, db, r);
  case OP_UPDATE: return op_update(be, db, r);
  case OP_GET: return op_get(be, db, r);
  case OP_LIST: return op_list(be, db, r);
  case OP_TOUCH:
    if (r->u.touch.leader != NULL)
      return 0; /* answered with its leader's status */
    return op_touch(be, db, r);
  case OP_KEY_PUT: return op_key_put(be, db, r);
  case OP_KEY_LOOKUP: return op_key_lookup(be, db, r);
  case OP_KEY_LIST: return op_key_list(be, db, r);
  case OP_KEY_REVOKE: return op_key_revoke(be, db, r);
  case OP_AUDIT_APPEND: return op_audit_append(be, db, r);
  case OP_AUDIT_LIST: return op_audit_list(be, db, r);
  case OP_COUNT: return op_count(be, db, r);
  }
  return OSR__EDB;
}

/* ---- the worker side: many rows in one statement ------------------------------------- */

/* On a backend with array parameters, a batch's consecutive creates become
 * one B_INSERT_ROWS and its consecutive binding updates one B_UPDATE_ROWS
 * (plus one AUDIT_INSERT_ROWS for their audit rows). At concurrency 100 a
 * PostgreSQL transaction held ~15 creates, each its own INSERT: a round
 * trip, a backend wake-up and a statement's executor start-up per row, and
 * the server's CPU (on the same cores as the gateway) was what capped the
 * rate, not its WAL flushes (0.04 per create). Per row the answer is the
 * one the single-row statement gives: a row the statement did not write is
 * resolved on its own (create_not_written, update_missed), and a statement
 * that fails takes the transaction with it, after which run_batch runs every
 * request alone (so one bad row fails only its own request). */

/* Column-major parameters of a *_ROWS statement: ncols array arguments of
 * up to OSR__STORE_ROWS_MAX elements each. */
typedef struct rows_s {
  osr__sql_arg_t cols[CREATE_NARGS];
  osr__sql_arg_t cells[CREATE_NARGS][OSR__STORE_ROWS_MAX];
  int ncols;
  int n;
} rows_t;

/* Column-major parameter cells, as the multi-row statements take them:
 * row r of column c is cells[c * stride + r]. Store one row given as the
 * single-row statement's ncols parameters. */
static void cols_put(osr__sql_arg_t *cells, size_t stride, size_t r, const osr__sql_arg_t *row,
                     int ncols)
{
  int c;
  for (c = 0; c < ncols; c++)
    cells[(size_t)c * stride + r] = row[c];
}

/* The ncols array arguments over the first n rows of such cells. */
static void cols_args(osr__sql_arg_t *args, osr__sql_arg_t *cells, size_t stride, size_t n,
                      int ncols)
{
  int c;
  for (c = 0; c < ncols; c++)
    args[c] = (osr__sql_arg_t){.elems = cells + (size_t)c * stride, .nelems = (int)n};
}

/* ~60 KiB: on the heap, not the worker's stack; freed with osr_free. */
static rows_t *rows_new(int ncols)
{
  rows_t *t = osr_xmalloc(sizeof(*t));
  t->ncols = ncols;
  t->n = 0;
  return t;
}

/* Append one row given as the single-row statement's parameters. */
static void rows_add(rows_t *t, const osr__sql_arg_t *a)
{
  cols_put(&t->cells[0][0], OSR__STORE_ROWS_MAX, (size_t)t->n++, a, t->ncols);
}

/* The array arguments, valid until the next rows_add. */
static const osr__sql_arg_t *rows_args(rows_t *t)
{
  cols_args(t->cols, &t->cells[0][0], OSR__STORE_ROWS_MAX, (size_t)t->n, t->ncols);
  return t->cols;
}

static const char *req_bind_id(const osr__req_t *r)
{
  return r->u.bind.b.id;
}

/* 1 if reqs[k]'s id is one of reqs[0..k-1]'s. */
static int id_seen(osr__req_t **reqs, size_t k)
{
  size_t j;
  for (j = 0; j < k; j++)
    if (strcmp(req_bind_id(reqs[j]), req_bind_id(reqs[k])) == 0)
      return 1;
  return 0;
}

#define UPDATE_ROWS_MIN 3
/* How many requests from reqs[0] one multi-row statement takes: the run of
 * creates (or of updates) with distinct ids, up to OSR__STORE_ROWS_MAX. A
 * repeated id ends the run, so a request sees the rows of every request
 * before it exactly as when each runs alone (the second update of one row
 * compares against the first's result). 1: run it on its own. */
static size_t rows_run(const osr__db_vtbl_t *be, osr__req_t **reqs, size_t n)
{
  req_op_t op = reqs[0]->op;
  size_t k;

  if (!be->array_params || (op != OP_CREATE && op != OP_UPDATE))
    return 1;
  for (k = 1; k < n && k < OSR__STORE_ROWS_MAX && reqs[k]->op == op && !id_seen(reqs, k); k++)
    ;
  /* The multi-row UPDATE is planned at each execution (store_pg.c), ~0.13
   * ms of server CPU: for two rows, two prepared single-row statements
   * (a round trip each) cost less. */
  return op == OP_UPDATE && k < UPDATE_ROWS_MIN ? 1 : k;
}

/* Read the current result's rows, the ids of rows a statement wrote, and
 * mark those requests of reqs[0..n-1] in `hit` (ids are distinct:
 * rows_run). 0 or a database error. */
static int mark_hits(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t **reqs, size_t n,
                     unsigned char *hit)
{
  size_t i;
  int rv;

  memset(hit, 0, n);
  while ((rv = be->row_next(db)) > 0) {
    const char *id = be->col_text(db, 0);
    for (i = 0; id != NULL && i < n; i++) {
      if (!hit[i] && strcmp(req_bind_id(reqs[i]), id) == 0) {
        hit[i] = 1;
        break;
      }
    }
  }
  return rv < 0 ? rv : 0;
}

/* Run a *_ROWS statement whose RETURNING gives the id of every row it
 * wrote; mark those requests in `hit`. */
static int rows_returning(const osr__db_vtbl_t *be, osr__db_t *db, int stmt, rows_t *t,
                          osr__req_t **reqs, size_t n, unsigned char *hit)
{
  int rv = be->query(db, stmt, NULL, rows_args(t), t->ncols);

  if (rv == 0)
    rv = mark_hits(be, db, reqs, n, hit);
  be->query_end(db);
  return rv;
}

/* The rows of n requests, each given by `args` as the single-row
 * statement's parameters. */
static rows_t *rows_of(osr__req_t **reqs, size_t n, int ncols,
                       void (*args)(const osr__req_t *, osr__sql_arg_t *))
{
  rows_t *t = rows_new(ncols);
  osr__sql_arg_t a[CREATE_NARGS];
  size_t i;

  for (i = 0; i < n; i++) {
    args(reqs[i], a);
    rows_add(t, a);
  }
  return t;
}

static void create_req_args(const osr__req_t *r, osr__sql_arg_t *a)
{
  create_args(&r->u.bind.b, a);
}

static int op_create_rows(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t **reqs, size_t n)
{
  rows_t *t = rows_of(reqs, n, CREATE_NARGS, create_req_args);
  unsigned char hit[OSR__STORE_ROWS_MAX];
  size_t i;
  int rv;

  rv = rows_returning(be, db, OSR__ST_B_INSERT_ROWS, t, reqs, n, hit);
  osr_free(t);
  for (i = 0; rv == 0 && i < n; i++)
    rv = hit[i] ? create_written(be, db, reqs[i]) : create_not_written(be, db, reqs[i]);
  return rv;
}

static int op_update_rows(const osr__db_vtbl_t *be, osr__db_t *db, osr__req_t **reqs, size_t n)
{
  rows_t *t = rows_of(reqs, n, UPDATE_NARGS, update_args);
  osr__sql_arg_t a[AUDIT_NARGS];
  unsigned char hit[OSR__STORE_ROWS_MAX];
  size_t i;
  int rv;

  rv = rows_returning(be, db, OSR__ST_B_UPDATE_ROWS, t, reqs, n, hit);
  if (rv != 0) {
    osr_free(t);
    return rv;
  }
  /* The audit rows of the updates that applied, in request order, in the
   * same transaction (as op_update). */
  t->ncols = AUDIT_NARGS;
  t->n = 0;
  for (i = 0; i < n; i++) {
    if (hit[i] && reqs[i]->u.bind.has_audit) {
      audit_args(&reqs[i]->u.bind.ev, a);
      rows_add(t, a);
    }
  }
  if (t->n > 0)
    rv = be->exec(db, OSR__ST_AUDIT_INSERT_ROWS, NULL, rows_args(t), AUDIT_NARGS, NULL);
  for (i = 0; rv == 0 && i < n; i++) {
    if (hit[i])
      reqs[i]->status = 0;
    else
      rv = update_missed(be, db, reqs[i]);
  }
  osr_free(t);
  return rv;
}

/* The store counters of a multi-row statement of k rows (k > 1). */
static void count_rows_stmt(osr_store_t *st, size_t k)
{
  if (k > 1) {
    atomic_fetch_add(&st->n_rowstmt, 1);
    atomic_fetch_add(&st->n_rows, k);
  }
}

/* ---- the worker side: a transaction in one flush ------------------------------------------ */

/* On PostgreSQL every statement whose answer is needed before the next one
 * is a round trip, and COMMIT one more. A batch of creates and binding
 * updates only needs its answers after the commit: which rows each
 * statement wrote (RETURNING), and for the others a read of what is there.
 * So such a batch goes as BEGIN, its statements and COMMIT in one flush
 * (query_commit): one round trip for the intent step of a create and one
 * for its binding step, where each took two (three when a batch held two
 * updates, each its own prepared UPDATE). The rows that used to follow a
 * statement once its answer was known ride inside it (schema.c
 * B_UPDATE_AUDIT, B_UPDATE_ROWS_AUDIT, B_INSERT_ROWS_META): the audit row of
 * an update that applied, the metadata rows of a binding that was written.
 * Everything else is as in run_tx: a failing statement makes the server
 * skip the rest and the COMMIT, the batch rolls back and run_batch reruns
 * it one request at a time; the rows committed are the same rows. A request
 * whose row was not written is resolved after the commit, on its own
 * (create_not_written, update_missed: under READ COMMITTED each read sees
 * what is committed when it runs, a moment later than inside the
 * transaction, which no caller can tell from a later call); such a read
 * failing fails that request alone, the others' rows being committed. */

/* Parameter cells one flush needs at most per statement (its heads) and
 * per request (its row and audit row; a create's 24 plus 3 per metadata
 * entry): the widest statements take 27 parameters. */
#define FLUSH_ARGS 27

/* Below this many rows a run of updates goes as single-row statements: in
 * one flush they cost no round trip each, and the multi-row UPDATE is
 * planned at every execution (store_pg.c). Server CPU per row, k prepared
 * single-row statements against one multi-row statement of k rows (bench/
 * README "binding step in one round trip"): k = 2 72 / 210 us, 4 58 / 110,
 * 8 60-65 / 60-95, 12 88 / 78, 16 90 / 65, 32 88 / 55. At C = 10 (runs of
 * 3-5) create_tail's update transaction took a median 596 and 709 us with
 * single-row statements against 1,422 and 1,053 us with the multi-row one. */
#define FLUSH_UPDATE_ROWS_MIN 12

typedef struct flush_s {
  osr__sql_stmt_t stmts[OSR__STORE_FLUSH_MAX];
  size_t first[OSR__STORE_FLUSH_MAX]; /* the statement's requests: reqs[first .. first+count) */
  size_t count[OSR__STORE_FLUSH_MAX];
  int n;
  osr__sql_arg_t *cells; /* every statement's parameters (one allocation) */
  size_t used, cap;
} flush_t;

static osr__sql_arg_t *flush_take(flush_t *f, size_t k)
{
  osr__sql_arg_t *a = f->cells + f->used;
  f->used += k;
  return a; /* within cap: flush_plan sized it */
}

/* B_INSERT_ROWS (or B_INSERT_ROWS_META when any has metadata) for creates
 * reqs[0..k-1]. */
static void flush_creates(flush_t *f, osr__req_t **reqs, size_t k)
{
  osr__sql_stmt_t *s = &f->stmts[f->n];
  osr__sql_arg_t *head = flush_take(f, CREATE_NARGS + 3), *cells = flush_take(f, CREATE_NARGS * k);
  osr__sql_arg_t a[CREATE_NARGS], *meta;
  size_t r, j, nmeta = 0, m = 0;

  for (r = 0; r < k; r++) {
    create_args(&reqs[r]->u.bind.b, a);
    cols_put(cells, k, r, a, CREATE_NARGS);
    nmeta += reqs[r]->u.bind.nmeta;
  }
  cols_args(head, cells, k, k, CREATE_NARGS);
  *s = (osr__sql_stmt_t){.stmt = OSR__ST_B_INSERT_ROWS, .args = head, .nargs = CREATE_NARGS};
  if (nmeta > 0) {
    meta = flush_take(f, 3 * nmeta);
    for (r = 0; r < k; r++) {
      for (j = 0; j < reqs[r]->u.bind.nmeta; j++, m++) {
        osr__sql_arg_t row[3] = {A_TEXT(reqs[r]->u.bind.b.id),
                                 A_TEXT(reqs[r]->u.bind.meta[j].k),
                                 A_TEXT(reqs[r]->u.bind.meta[j].v)};
        cols_put(meta, nmeta, m, row, 3);
      }
    }
    cols_args(head + CREATE_NARGS, meta, nmeta, nmeta, 3);
    s->stmt = OSR__ST_B_INSERT_ROWS_META;
    s->nargs = CREATE_NARGS + 3;
  }
}

/* B_UPDATE_AUDIT for one update, B_UPDATE_ROWS_AUDIT for k > 1. */
static void flush_updates(flush_t *f, osr__req_t **reqs, size_t k)
{
  enum { NARGS = UPDATE_NARGS + 1 + AUDIT_NARGS };
  osr__sql_stmt_t *s = &f->stmts[f->n];
  osr__sql_arg_t *head = flush_take(f, NARGS), *cells, *audit;
  osr__sql_arg_t a[UPDATE_NARGS];
  size_t r, na = 0, m = 0;
  int c;

  *s = (osr__sql_stmt_t){.stmt = OSR__ST_B_UPDATE_AUDIT, .args = head, .nargs = NARGS};
  if (k == 1) {
    /* $20 says whether $21..$27 are an audit row. */
    update_args(reqs[0], head);
    head[UPDATE_NARGS] = A_INT(reqs[0]->u.bind.has_audit != 0);
    for (c = 0; c < AUDIT_NARGS; c++)
      head[UPDATE_NARGS + 1 + c] = A_TEXT(NULL);
    if (reqs[0]->u.bind.has_audit)
      audit_args(&reqs[0]->u.bind.ev, head + UPDATE_NARGS + 1);
    return;
  }
  s->stmt = OSR__ST_B_UPDATE_ROWS_AUDIT;
  cells = flush_take(f, UPDATE_NARGS * k);
  for (r = 0; r < k; r++) {
    update_args(reqs[r], a);
    cols_put(cells, k, r, a, UPDATE_NARGS);
    na += reqs[r]->u.bind.has_audit != 0;
  }
  cols_args(head, cells, k, k, UPDATE_NARGS);
  /* The audit rows ($20 the id of the binding each belongs to, then
   * AUDIT_INSERT's columns), in request order. */
  audit = flush_take(f, (1 + AUDIT_NARGS) * na);
  for (r = 0; r < k; r++) {
    osr__sql_arg_t e[1 + AUDIT_NARGS];
    if (!reqs[r]->u.bind.has_audit)
      continue;
    e[0] = A_TEXT(req_bind_id(reqs[r]));
    audit_args(&reqs[r]->u.bind.ev, e + 1);
    cols_put(audit, na, m++, e, 1 + AUDIT_NARGS);
  }
  cols_args(head + UPDATE_NARGS, audit, na, na, 1 + AUDIT_NARGS);
}

/* The batch's statements in f (f->cells allocated; the caller frees it), or
 * 0 when the batch cannot go in one flush: a request other than a create or
 * an update, more than OSR__STORE_FLUSH_MAX statements, or a backend
 * without query_commit. */
static int flush_plan(const osr__db_vtbl_t *be, osr__req_t **reqs, size_t n, flush_t *f)
{
  size_t i, k, nmeta = 0;
  int m = 0;

  f->n = 0;
  f->cells = NULL;
  if (be->query_commit == NULL || !be->array_params)
    return 0;
  for (i = 0; i < n; i += k) {
    if ((reqs[i]->op != OP_CREATE && reqs[i]->op != OP_UPDATE) || m == OSR__STORE_FLUSH_MAX)
      return 0;
    k = rows_run(be, reqs + i, n - i);
    if (reqs[i]->op == OP_UPDATE && k < FLUSH_UPDATE_ROWS_MIN)
      k = 1;
    f->first[m] = i;
    f->count[m++] = k;
  }
  for (i = 0; i < n; i++)
    nmeta += reqs[i]->op == OP_CREATE ? reqs[i]->u.bind.nmeta : 0;
  f->cap = (size_t)m * FLUSH_ARGS + n * FLUSH_ARGS + 3 * nmeta;
  f->cells = osr_xmalloc(f->cap * sizeof(*f->cells));
  f->used = 0;
  for (f->n = 0; f->n < m; f->n++) {
    osr__req_t **run = reqs + f->first[f->n];
    if (run[0]->op == OP_CREATE)
      flush_creates(f, run, f->count[f->n]);
    else
      flush_updates(f, run, f->count[f->n]);
  }
  return m;
}

/* Run the planned batch and COMMIT in one round trip, then answer each
 * request. The rows are durable (or, relaxed, committed) when this returns
 * 0, as with a separate COMMIT. */
static int tx_one_flush(osr_store_t *st, osr__db_t *db, osr__req_t **reqs, size_t n, flush_t *f,
                        int *at_commit)
{
  const osr__db_vtbl_t *be = st->be;
  unsigned char hit[OSR__STORE_BATCH_MAX];
  size_t i;
  int rv, s;

  atomic_fetch_add(&st->n_flush, 1);
  for (s = 0; s < f->n; s++)
    count_rows_stmt(st, f->count[s]);
  rv = be->query_commit(db, f->stmts, f->n, at_commit);
  if (rv != 0) {
    if (rv != OSR_EUNAVAILABLE)
      be->exec(db, OSR__ST_ROLLBACK, NULL, NULL, 0, NULL);
    return rv;
  }
  for (s = 0; rv == 0 && s < f->n; s++) {
    be->query_pick(db, s);
    rv = mark_hits(be, db, reqs + f->first[s], f->count[s], hit + f->first[s]);
  }
  be->query_end(db);
  if (rv != 0)
    return OSR_EUNAVAILABLE; /* committed, answers unknown: never replayed (*at_commit) */
  for (i = 0; i < n; i++) {
    osr__req_t *r = reqs[i];
    if (hit[i]) {
      r->u.bind.created = r->op == OP_CREATE; /* metadata rows came with it */
      r->status = 0;
      continue;
    }
    if (!be->db_is_connected(db))
      rv = OSR_EUNAVAILABLE;
    else
      rv = r->op == OP_CREATE ? create_not_written(be, db, r) : update_missed(be, db, r);
    if (rv != 0) {
      req_reset_out(r);
      r->status = rv == OSR_EINVAL ? OSR_EINVAL : OSR_EUNAVAILABLE;
    }
  }
  return 0;
}

/* ---- the worker side: migrations ------------------------------------------------------- */

/* Run one migration's statements (';'-separated, no ';' inside literals). */
static int run_migration_sql(const osr__db_vtbl_t *be, osr__db_t *db, const char *sql)
{
  static const char tok[] = "@SERIAL_PK@";
  size_t n = strlen(sql), i, o = 0, extra = strlen(be->serial_pk);
  char *buf = osr_xmalloc(n + 1 + extra * 4), *p, *semi;
  int rv = 0, subs = 0;

  /* Substitute the dialect's auto-increment key (at most a few times). */
  for (i = 0; i < n;) {
    if (subs < 4 && strncmp(sql + i, tok, sizeof(tok) - 1) == 0) {
      memcpy(buf + o, be->serial_pk, extra);
      o += extra;
      i += sizeof(tok) - 1;
      subs++;
    } else {
      buf[o++] = sql[i++];
    }
  }
  buf[o] = '\0';
  for (p = buf; rv == 0 && *p != '\0'; p = semi) {
    semi = strchr(p, ';');
    if (semi != NULL)
      *semi++ = '\0';
    else
      semi = p + strlen(p);
    while (*p == ' ' || *p == '\n')
      p++;
    if (*p != '\0')
      rv = be->exec(db, -1, p, NULL, 0, NULL);
  }
  osr_free(buf);
  return rv;
}

/* Bring the schema to the newest version this build knows, once per store
 * (the first worker to connect does it; the others wait on migrate_mu).
 * Across processes the transaction and the backend's migrate_lock make two
 * gateways starting at once apply each version exactly once: the second
 * waits for the first's commit, then reads the new version and does nothing. */
static int migrate(osr_store_t *st, osr__db_t *db)
{
  const osr__db_vtbl_t *be = st->be;
  int64_t cur = 0;
  size_t i;
  int rv;

  uv_mutex_lock(&st->migrate_mu);
  if (atomic_load(&st->migrated)) {
    uv_mutex_unlock(&st->migrate_mu);
    return 0;
  }
  rv = be->exec(db, OSR__ST_BEGIN, NULL, NULL, 0, NULL);
  if (rv != 0)
    goto out;
  rv = be->migrate_lock(db);
  if (rv == 0)
    rv = be->exec(db, -1,
                  "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
                  "applied_ms BIGINT NOT NULL)",
                  NULL, 0, NULL);
  if (rv == 0) {
    rv = be->query(db, -1, "SELECT COALESCE(MAX(version), 0) FROM schema_migrations", NULL, 0);
    if (rv == 0) {
      rv = be->row_next(db);
      if (rv > 0) {
        cur = be->col_int(db, 0);
        rv = 0;
      }
    }
    be->query_end(db);
  }
  for (i = 0; rv == 0 && i < osr__nmigrations; i++) {
    osr__sql_arg_t a[2] = {A_INT(osr__migrations[i].version), A_INT(wall_ms())};
    if (osr__migrations[i].version <= cur)
      continue;
    rv = run_migration_sql(be, db, osr__migrations[i].sql);
    if (rv == 0)
      rv = be->exec(db, -1, "INSERT INTO schema_migrations (version, applied_ms) VALUES ($1, $2)", a, 2,
                    NULL);
    if (rv == 0)
      OSR_LOG_INFO("store", "%s: applied schema migration %d", be->name, osr__migrations[i].version);
  }
  if (rv == 0)
    rv = be->exec(db, OSR__ST_COMMIT, NULL, NULL, 0, NULL);
  if (rv != 0) {
    be->exec(db, OSR__ST_ROLLBACK, NULL, NULL, 0, NULL);
    goto out;
  }
  if (osr__nmigrations > 0 && cur > osr__migrations[osr__nmigrations - 1].version)
    OSR_LOG_WARN("store", "%s: schema version %" PRId64 " is newer than this build's %d", be->name, cur,
                 osr__migrations[osr__nmigrations - 1].version);
  atomic_store(&st->migrated, 1);
out:
  uv_mutex_unlock(&st->migrate_mu);
  if (rv != 0)
    OSR_LOG_WARN("store", "%s: schema migration failed (%d)", be->name, rv);
  return rv;
}

/* Connected and migrated, or why not. Honours the shared circuit. */
static int ensure_ready(osr_store_t *st, osr__db_t *db)
{
  const osr__db_vtbl_t *be = st->be;
  int rv;

  if (!be->db_is_connected(db)) {
    int64_t now = osr__store_mono_ms();
    if (now < (int64_t)atomic_load(&st->circuit_until_ms))
      return OSR_EUNAVAILABLE;
    rv = be->db_connect(db);
    if (rv != 0) {
      atomic_store(&st->circuit_until_ms, (long long)(osr__store_mono_ms() + CIRCUIT_MS));
      return rv;
    }
    atomic_store(&st->circuit_until_ms, 0);
  }
  if (!atomic_load(&st->migrated)) {
    rv = migrate(st, db);
    if (rv == OSR_EUNAVAILABLE)
      be->db_disconnect(db);
    if (rv != 0)
      return rv;
  }
  return 0;
}

/* ---- the worker side: batches ------------------------------------------------------------- */

/* Run reqs in one transaction. On failure everything is rolled back and
 * *at_commit says whether COMMIT had been sent (then the outcome is unknown
 * and the batch must not be replayed). */
static int run_tx(osr_store_t *st, osr__db_t *db, osr__req_t **reqs, size_t n, int *at_commit)
{
  /* A batch is all relaxed or all strict (worker_main splits them). */
  int relaxed = n > 0 && reqs[0]->relaxed;
  const osr__db_vtbl_t *be = st->be;
  size_t i, k;
  int rv;

  *at_commit = 0;
  for (i = 0; i < n; i++)
    req_reset_out(reqs[i]);
  rv = be->exec(db, OSR__ST_BEGIN, NULL, NULL, 0, NULL);
  if (rv == 0 && relaxed)
    rv = be->exec(db, OSR__ST_RELAX, NULL, NULL, 0, NULL);
  if (rv != 0)
    return rv;
  atomic_fetch_add(&st->n_tx, 1);
  {
    flush_t f;
    if (flush_plan(be, reqs, n, &f) > 0) {
      rv = tx_one_flush(st, db, reqs, n, &f, at_commit);
      osr_free(f.cells);
      return rv;
    }
  }
  for (i = 0; i < n; i += k) {
    k = rows_run(be, reqs + i, n - i);
    count_rows_stmt(st, k);
    if (k == 1)
      rv = run_op(be, db, reqs[i]);
    else if (reqs[i]->op == OP_CREATE)
      rv = op_create_rows(be, db, reqs + i, k);
    else
      rv = op_update_rows(be, db, reqs + i, k);
    if (rv != 0) {
      if (rv != OSR_EUNAVAILABLE)
        be->exec(db, OSR__ST_ROLLBACK, NULL, NULL, 0, NULL);
      return rv;
    }
  }
  *at_commit = 1;
  rv = be->exec(db, OSR__ST_COMMIT, NULL, NULL, 0, NULL);
  if (rv != 0 && rv != OSR_EUNAVAILABLE)
    be->exec(db, OSR__ST_ROLLBACK, NULL, NULL, 0, NULL);
  return rv;
}

static void fail_all(osr__req_t **reqs, size_t n, int status)
{
  size_t i;
  for (i = 0; i < n; i++) {
    req_reset_out(reqs[i]);
    reqs[i]->status = status;
  }
}

/* Touches of one id in one batch become one UPDATE with the latest time. */
static void coalesce_touches(osr__req_t **reqs, size_t n)
{
  size_t i, j;
  for (i = 0; i < n; i++) {
    if (reqs[i]->op != OP_TOUCH || reqs[i]->u.touch.leader != NULL)
      continue;
    for (j = i + 1; j < n; j++) {
      osr__req_t *o = reqs[j];
      if (o->op != OP_TOUCH || o->u.touch.leader != NULL ||
          strcmp(o->u.touch.id, reqs[i]->u.touch.id) != 0)
        continue;
      o->u.touch.leader = reqs[i];
      if (o->u.touch.at_ms > reqs[i]->u.touch.at_ms)
        reqs[i]->u.touch.at_ms = o->u.touch.at_ms;
    }
  }
}

static void run_batch(osr_store_t *st, osr__db_t *db, osr__req_t **reqs, size_t n)
{
  const osr__db_vtbl_t *be = st->be;
  int rv, at_commit, tries;
  size_t i;

  rv = ensure_ready(st, db);
  if (rv != 0) {
    fail_all(reqs, n, rv == OSR_EINVAL ? OSR_EUNAVAILABLE : rv);
    return;
  }
  coalesce_touches(reqs, n);

  rv = run_tx(st, db, reqs, n, &at_commit);
  if (rv == OSR_EUNAVAILABLE && !at_commit) {
    /* The connection died, typically while idle (server restarted). Nothing
     * was committed, so one replay on a fresh connection is safe. */
    be->db_disconnect(db);
    rv = ensure_ready(st, db);
    if (rv == 0)
      rv = run_tx(st, db, reqs, n, &at_commit);
  }
  if (rv == OSR_EUNAVAILABLE) {
    be->db_disconnect(db);
    fail_all(reqs, n, OSR_EUNAVAILABLE);
  } else if (rv != 0) {
    /* Any failure but a lost connection (handled above) means nothing was
     * committed, COMMIT's own failures included: SQLite leaves the
     * transaction open for the ROLLBACK run_tx sent, and PostgreSQL
     * skips a COMMIT that follows a failed statement (a pipelined insert
     * whose error is only read at COMMIT, see store_pg.c). So each request
     * may safely run again on its own. */
    /* One statement failed and took the transaction with it: run each
     * request on its own so the others are not punished. Deadlocks and
     * serialization failures are retried a few times. */
    atomic_fetch_add(&st->n_split, 1);
    for (i = 0; i < n; i++) {
      for (tries = 0; tries < 3; tries++) {
        rv = run_tx(st, db, &reqs[i], 1, &at_commit);
        if (rv != OSR_EAGAIN)
          break;
      }
      if (rv == OSR_EUNAVAILABLE) {
        be->db_disconnect(db);
        fail_all(reqs + i, n - i, OSR_EUNAVAILABLE);
        break;
      }
      if (rv != 0) {
        req_reset_out(reqs[i]);
        reqs[i]->status = rv; /* OSR_EINVAL stays; database codes become unavailable */
      }
    }
  }
  for (i = 0; i < n; i++)
    if (reqs[i]->op == OP_TOUCH && reqs[i]->u.touch.leader != NULL)
      reqs[i]->status = reqs[i]->u.touch.leader->status;
}

/* This thread's time on a CPU and waiting for one (ns, from the scheduler's
 * /proc/thread-self/schedstat), for the trace line below only: the rest of
 * a batch's wall time is time blocked (disk, locks). Zeros elsewhere. */
static void thread_sched_ns(uint64_t *cpu, uint64_t *wait)
{
  *cpu = *wait = 0;
  if (osr__log_level > OSR_LOG_TRACE)
    return;
  FILE *f = fopen("/proc/thread-self/schedstat", "r");
  if (f == NULL)
    return;
  unsigned long long c = 0, w = 0;
  if (fscanf(f, "%llu %llu", &c, &w) == 2) {
    *cpu = c;
    *wait = w;
  }
  fclose(f);
}

/* Run one batch (all relaxed or all strict), then hand its results to the
 * loop thread. */
static void run_and_deliver(osr_store_t *st, osr__db_t *db, osr__req_t **batch, size_t n)
{
  size_t i;
  uint64_t t0 = uv_hrtime(), c0, w0, c1, w1;

  thread_sched_ns(&c0, &w0);
  run_batch(st, db, batch, n);
  thread_sched_ns(&c1, &w1);
  uint64_t t1 = uv_hrtime();
  for (i = 0; i < n; i++) {
    batch[i]->t_run = t0;
    batch[i]->t_ran = t1;
  }
  /* Batch sizes and where their wall time went, for latency profiles
   * (OSR_LOG_LEVEL=trace; bench/README.md "Control plane"). */
  OSR_LOG_TRACE("store", "batch %zu%s at %" PRIu64 " in %" PRIu64 " us (cpu %" PRIu64
                " us, runqueue %" PRIu64 " us)", n, batch[0]->relaxed ? " relaxed" : "", t0 / 1000,
                (t1 - t0) / 1000, (c1 - c0) / 1000, (w1 - w0) / 1000);

  atomic_fetch_add(&st->n_req, n);
  uv_mutex_lock(&st->mu);
  for (i = 0; i < n; i++)
    req_append(&st->done_head, &st->done_tail, batch[i]);
  uv_mutex_unlock(&st->mu);
  uv_async_send(&st->async);
}

/* Background reads. The reaper lists every live binding a page at a time
 * and counts them by state on each pass: reads of hundreds of rows, a few
 * milliseconds each. In the foreground queue such a page shared a
 * transaction (and with SQLite the only worker) with the creates queued
 * beside it, which all waited for it: during a pass over 40,000 live
 * sandboxes the gateway answered ~1,600 creates/s instead of ~9,000. So
 * requests marked background (osr_store_query_t.background, and every count)
 * go to a queue of their own, served by one more worker with its own
 * connection (SQLite: a read-only one, which WAL lets read while the writer
 * writes; PostgreSQL: one more connection) at a low CPU priority, so on a
 * busy CPU the loop and the writers go first. Each runs in a transaction of
 * its own. Backends without a reader connection (SQLite :memory:) keep
 * everything in the foreground queue. */
#define BG_NICE 10

/* Take up to OSR__STORE_BATCH_MAX requests from a queue; 0 when stopping
 * with the queue empty. */
static size_t take_batch(osr_store_t *st, int bg, osr__req_t **batch)
{
  osr__req_t **head = bg ? &st->bg_head : &st->q_head, **tail = bg ? &st->bg_tail : &st->q_tail;
  size_t *len = bg ? &st->bg_len : &st->q_len, n, max = bg ? 1 : OSR__STORE_BATCH_MAX;

  uv_mutex_lock(&st->mu);
  while (*head == NULL && !st->stopping)
    uv_cond_wait(bg ? &st->bg_cv : &st->cv, &st->mu);
  for (n = 0; n < max && *head != NULL; n++) {
    batch[n] = *head;
    *head = (*head)->next;
    batch[n]->next = NULL;
  }
  if (*head == NULL)
    *tail = NULL;
  *len -= n;
  uv_mutex_unlock(&st->mu);
  return n;
}

static void worker_exit(osr_store_t *st, osr__db_t *db)
{
  /* The connection is this thread's: close it here, before saying we left. */
  st->be->db_free(db);
  uv_mutex_lock(&st->mu);
  st->exited++;
  uv_mutex_unlock(&st->mu);
  uv_async_send(&st->async);
}

static void bg_worker_main(void *arg)
{
  osr_store_t *st = arg;
  osr__db_t *db = st->be->db_new_reader(st);
  osr__req_t *r;

  (void)pthread_setname_np(pthread_self(), "osr-store-bg");
  /* This thread only (a Linux thread's nice value is its own); failing
   * leaves it at the default. */
  (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), BG_NICE);
  while (take_batch(st, 1, &r) > 0)
    run_and_deliver(st, db, &r, 1);
  worker_exit(st, db);
}

static void worker_main(void *arg)
{
  osr_store_t *st = arg;
  osr__db_t *db = st->be->db_new(st);
  osr__req_t *batch[OSR__STORE_BATCH_MAX];
  size_t n, nrel, i;

  /* Named for top -H, strace and bench/create_pg_syncs.py. */
  (void)pthread_setname_np(pthread_self(), "osr-store");

  while ((n = take_batch(st, 0, batch)) > 0) {
    /* Relaxed requests (osr_store_update_opts_t.relaxed) first, in their
     * own transaction: its commit does not wait for the disk, so their
     * answers go out before the strict transaction's flush, and a strict
     * request never commits without one. Stable partition: order within
     * each part is kept, but a relaxed request may commit before a strict
     * one queued ahead of it in the same turn. Nothing relies on that order:
     * the only relaxed write is the create's compare-and-set on a creating
     * row, whose competitors (recovery, the reaper) are compare-and-sets
     * too, so exactly one wins whichever commits first. */
    osr__req_t *strict[OSR__STORE_BATCH_MAX];
    size_t nstrict = 0;
    nrel = 0;
    for (i = 0; i < n; i++) {
      if (batch[i]->relaxed)
        batch[nrel++] = batch[i];
      else
        strict[nstrict++] = batch[i];
    }
    if (nrel > 0)
      run_and_deliver(st, db, batch, nrel);
    if (nstrict > 0)
      run_and_deliver(st, db, strict, nstrict);
    if (st->be->after_batch != NULL)
      st->be->after_batch(db);
  }
  worker_exit(st, db);
}

/* ---- public API --------------------------------------------------------------------------- */

int osr_store_open(uv_loop_t *loop, const char *url, osr_store_open_cb cb, void *data,
                   osr_store_t **out)
{
  const osr__db_vtbl_t *be;
  osr_store_t *st;
  osr__req_t *r;
  int rv, i;

  if (out != NULL)
    *out = NULL;
  if (loop == NULL || url == NULL || out == NULL || strnlen(url, 4097) > 4096)
    return OSR_EINVAL;
  if (strncmp(url, "sqlite:", 7) == 0)
    be = &osr__store_sqlite;
  else if (strncmp(url, "postgres://", 11) == 0 || strncmp(url, "postgresql://", 13) == 0)
    be = &osr__store_pg;
  else
    return OSR_EINVAL;

  st = osr_xcalloc(1, sizeof(*st));
  st->loop = loop;
  st->be = be;
  rv = be->configure(st, url);
  if (rv != 0) {
    if (be->unconfigure != NULL)
      be->unconfigure(st);
    osr_free(st->cfg.target);
    osr_free(st);
    return rv;
  }
  if (st->cfg.pool < 1)
    st->cfg.pool = 1;
  if (uv_mutex_init(&st->mu) != 0 || uv_cond_init(&st->cv) != 0 || uv_cond_init(&st->bg_cv) != 0 ||
      uv_mutex_init(&st->migrate_mu) != 0)
    abort(); /* only fails on resource exhaustion at start-up */
  atomic_init(&st->migrated, 0);
  atomic_init(&st->circuit_until_ms, 0);
  atomic_init(&st->n_tx, 0);
  atomic_init(&st->n_req, 0);
  atomic_init(&st->n_rowstmt, 0);
  atomic_init(&st->n_rows, 0);
  atomic_init(&st->n_split, 0);
  atomic_init(&st->n_flush, 0);
  atomic_init(&st->n_wal_restart, 0);
  atomic_init(&st->n_wal_miss, 0);
  rv = uv_async_init(loop, &st->async, on_async);
  if (rv != 0) {
    uv_mutex_destroy(&st->mu);
    uv_cond_destroy(&st->cv);
    uv_cond_destroy(&st->bg_cv);
    uv_mutex_destroy(&st->migrate_mu);
    if (be->unconfigure != NULL)
      be->unconfigure(st);
    osr_free(st->cfg.target);
    osr_free(st);
    return rv;
  }
  uv_unref((uv_handle_t *)&st->async);
  st->async.data = st;
  /* Neither keeps the loop alive: a submitted request refs the async handle. */
  uv_prepare_init(loop, &st->flush_prepare);
  uv_check_init(loop, &st->flush_check);
  st->flush_prepare.data = st;
  st->flush_check.data = st;
  uv_prepare_start(&st->flush_prepare, on_flush_prepare);
  uv_check_start(&st->flush_check, on_flush_check);
  uv_unref((uv_handle_t *)&st->flush_prepare);
  uv_unref((uv_handle_t *)&st->flush_check);
  st->open_handles = 3;

  /* The open request goes first in the queue: whichever worker takes it
   * connects and migrates before answering. */
  r = req_new(OP_OPEN, (any_cb_t)cb, data);
  submit(st, r);
  flush(st);

  st->threads = osr_xcalloc((size_t)st->cfg.pool + 1, sizeof(uv_thread_t));
  for (i = 0; i < st->cfg.pool; i++) {
    rv = uv_thread_create(&st->threads[i], worker_main, st);
    if (rv != 0)
      break;
    st->nworkers++;
  }
  /* The background worker, once the foreground has one. Its flag is read
   * by flush() on this thread only. */
  if (st->nworkers > 0 && be->db_new_reader != NULL && be->has_reader(st) &&
      uv_thread_create(&st->threads[st->nworkers], bg_worker_main, st) == 0) {
    st->nworkers++;
    st->has_bg = 1;
  }
  if (st->nworkers == 0) {
    /* No thread to run anything: answer the open from here through the
     * async handle (never inline), then close. */
    uv_mutex_lock(&st->mu);
    st->no_workers = 1;
    st->q_head = st->q_tail = NULL;
    st->q_len = 0;
    r->status = rv;
    st->done_head = st->done_tail = r;
    uv_mutex_unlock(&st->mu);
    uv_async_send(&st->async);
  } else if (rv != 0) {
    OSR_LOG_WARN("store", "started %d of %d store workers", st->nworkers, st->cfg.pool);
  }
  *out = st;
  return 0;
}

void osr_store_close(osr_store_t *st, void (*cb)(void *data), void *data)
{
  if (st == NULL || st->closing)
    return;
  st->closing = 1;
  st->close_cb = cb;
  st->close_data = data;
  flush(st); /* what was submitted this turn runs before the workers stop */
  uv_ref((uv_handle_t *)&st->async);
  uv_mutex_lock(&st->mu);
  st->stopping = 1;
  uv_cond_broadcast(&st->cv);
  uv_cond_broadcast(&st->bg_cv);
  uv_mutex_unlock(&st->mu);
  /* With no workers (they failed to start) nothing else would wake us. */
  uv_async_send(&st->async);
}

const char *osr_store_backend(const osr_store_t *st)
{
  return st->be->name;
}

uint64_t osr_store_last_latency_us(const osr_store_t *st)
{
  return st->last_latency_us;
}

const osr_store_timing_t *osr_store_last_timing(const osr_store_t *st)
{
  return &st->last_timing;
}

void osr_store_stats(const osr_store_t *st, osr_store_stats_t *out)
{
  /* The atomics are only read; the cast drops const for C11's atomic_load. */
  osr_store_t *m = (osr_store_t *)st;
  out->transactions = atomic_load(&m->n_tx);
  out->requests = atomic_load(&m->n_req);
  out->row_statements = atomic_load(&m->n_rowstmt);
  out->rows = atomic_load(&m->n_rows);
  out->split_batches = atomic_load(&m->n_split);
  out->one_flush = atomic_load(&m->n_flush);
  out->wal_restarts = atomic_load(&m->n_wal_restart);
  out->wal_restart_misses = atomic_load(&m->n_wal_miss);
}

void osr__store_count(osr_store_t *st, osr__store_ev_t ev)
{
  atomic_fetch_add(ev == OSR__EV_WAL_RESTART ? &st->n_wal_restart : &st->n_wal_miss, 1);
}

int osr_store_create_intent(osr_store_t *st, const osr_binding_t *b, osr_store_binding_cb cb,
                            void *data)
{
  osr__req_t *r;
  meta_kv_t *meta;
  size_t nmeta;
  int rv;

  if (st == NULL || b == NULL || !binding_strings_ok(b) || b->id[0] == '\0' || b->tenant[0] == '\0')
    return OSR_EINVAL;
  if (st->closing)
    return OSR_ECLOSED;
  rv = meta_parse(b->metadata_json, &meta, &nmeta);
  if (rv != 0)
    return rv;
  r = req_new(OP_CREATE, (any_cb_t)cb, data);
  osr_binding_copy(&r->u.bind.b, b);
  r->u.bind.meta = meta;
  r->u.bind.nmeta = nmeta;
  r->u.bind.b.state = OSR_BINDING_CREATING;
  if (r->u.bind.b.created_ms == 0)
    r->u.bind.b.created_ms = wall_ms();
  if (r->u.bind.b.updated_ms == 0)
    r->u.bind.b.updated_ms = r->u.bind.b.created_ms;
  return submit(st, r);
}

static int audit_event_ok(const osr_audit_event_t *ev)
{
  return fits(ev->tenant, sizeof(ev->tenant)) && fits(ev->actor, sizeof(ev->actor)) &&
         fits(ev->action, sizeof(ev->action)) && ev->action[0] != '\0' &&
         fits(ev->sandbox_id, sizeof(ev->sandbox_id)) && fits(ev->outcome, sizeof(ev->outcome)) &&
         json_ok(ev->detail_json);
}

int osr_store_update(osr_store_t *st, const osr_binding_t *b, osr_store_done_cb cb, void *data)
{
  return osr_store_update_ex(st, b, NULL, cb, data);
}

int osr_store_update_ex(osr_store_t *st, const osr_binding_t *b, const osr_store_update_opts_t *o,
                        osr_store_done_cb cb, void *data)
{
  osr__req_t *r;

  if (st == NULL || b == NULL || !binding_strings_ok(b) || b->id[0] == '\0' ||
      b->state < OSR_BINDING_CREATING || b->state > OSR_BINDING_LOST)
    return OSR_EINVAL;
  if (o != NULL && (o->if_state < 0 || o->if_state > OSR_BINDING_LOST || o->if_updated_ms < 0 ||
                    (o->audit != NULL && !audit_event_ok(o->audit))))
    return OSR_EINVAL;
  if (st->closing)
    return OSR_ECLOSED;
  r = req_new(OP_UPDATE, (any_cb_t)cb, data);
  if (o != NULL) {
    r->u.bind.if_state = o->if_state;
    r->u.bind.if_updated_ms = o->if_updated_ms;
    r->relaxed = o->relaxed != 0 && st->be->relax_sql != NULL && !st->cfg.strict_bindings;
    if (o->audit != NULL) {
      r->u.bind.has_audit = 1;
      r->u.bind.ev = *o->audit;
      r->u.bind.ev.seq = 0;
      r->u.bind.ev.detail_json = dup_or_null(o->audit->detail_json);
      if (r->u.bind.ev.at_ms == 0)
        r->u.bind.ev.at_ms = wall_ms();
    }
  }
  osr_binding_copy(&r->u.bind.b, b);
  /* Metadata and the request are immutable after create; not sent. */
  osr_freep(&r->u.bind.b.request_json);
  osr_freep(&r->u.bind.b.metadata_json);
  if (r->u.bind.b.updated_ms == 0)
    r->u.bind.b.updated_ms = wall_ms();
  return submit(st, r);
}

int osr_store_get(osr_store_t *st, const char *tenant, const char *id, osr_store_binding_cb cb,
                  void *data)
{
  osr__req_t *r;

  if (st == NULL || id == NULL || id[0] == '\0' || !fits(id, OSR_ID_MAX) ||
      (tenant != NULL && !fits(tenant, OSR_TENANT_MAX)))
    return OSR_EINVAL;
  if (st->closing)
    return OSR_ECLOSED;
  r = req_new(OP_GET, (any_cb_t)cb, data);
  scpy(r->u.bind.b.id, sizeof(r->u.bind.b.id), id);
  r->u.bind.any_tenant = tenant == NULL;
  scpy(r->u.bind.tenant, sizeof(r->u.bind.tenant), tenant);
  return submit(st, r);
}

/* Cursor "<created_ms>:<id>": opaque to callers, checked strictly here. */
static int parse_list_cursor(const char *c, int64_t *created, char *id, size_t idcap)
{
  char *end;
  long long v;
  size_t i, n;

  if (c == NULL || strnlen(c, 80) >= 80)
    return OSR_EINVAL;
  errno = 0;
  v = strtoll(c, &end, 10);
  if (errno != 0 || end == c || *end != ':' || v < 0)
    return OSR_EINVAL;
  end++;
  n = strlen(end);
  if (n == 0 || n >= idcap)
    return OSR_EINVAL;
  for (i = 0; i < n; i++) {
    char ch = end[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '_' || ch == '-'))
      return OSR_EINVAL;
  }
  *created = v;
  memcpy(id, end, n + 1);
  return 0;
}

int osr_store_list(osr_store_t *st, const osr_store_query_t *q, osr_store_list_cb cb, void *data)
{
  osr__req_t *r;
  size_t i;

  if (st == NULL || q == NULL || (q->tenant != NULL && !fits(q->tenant, OSR_TENANT_MAX)) ||
      q->nmeta > OSR__STORE_META_FILTERS_MAX || (q->owner != NULL && !fits(q->owner, OSR_OWNER_MAX)) ||
      q->created_before_ms < 0 ||
      (q->nmeta > 0 && (q->meta_keys == NULL || q->meta_values == NULL)))
    return OSR_EINVAL;
  for (i = 0; i < q->nmeta; i++)
    if (q->meta_keys[i] == NULL || q->meta_values[i] == NULL ||
        strnlen(q->meta_keys[i], OSR__STORE_META_STR_MAX + 1) > OSR__STORE_META_STR_MAX ||
        strnlen(q->meta_values[i], OSR__STORE_META_STR_MAX + 1) > OSR__STORE_META_STR_MAX)
      return OSR_EINVAL;
  if (st->closing)
    return OSR_ECLOSED;
  r = req_new(OP_LIST, (any_cb_t)cb, data);
  r->background = q->background != 0;
  if (q->cursor != NULL) {
    if (parse_list_cursor(q->cursor, &r->u.list.cur_created, r->u.list.cur_id,
                          sizeof(r->u.list.cur_id)) != 0) {
      req_free(r);
      return OSR_EINVAL;
    }
    r->u.list.has_cursor = 1;
  }
  r->u.list.has_tenant = q->tenant != NULL;
  scpy(r->u.list.tenant, sizeof(r->u.list.tenant), q->tenant);
  r->u.list.state_mask = q->state_mask;
  r->u.list.limit = q->limit == 0 ? 100 : q->limit > OSR__STORE_LIST_MAX ? OSR__STORE_LIST_MAX : q->limit;
  r->u.list.expires_before_ms = q->expires_before_ms;
  r->u.list.due_at_ms = q->due_at_ms;
  r->u.list.has_owner = q->owner != NULL;
  scpy(r->u.list.owner, sizeof(r->u.list.owner), q->owner);
  r->u.list.created_before_ms = q->created_before_ms;
  if (q->nmeta > 0) {
    r->u.list.filters = osr_xcalloc(q->nmeta, sizeof(meta_kv_t));
    for (i = 0; i < q->nmeta; i++) {
      r->u.list.filters[i].k = osr_xstrdup(q->meta_keys[i]);
      r->u.list.filters[i].v = osr_xstrdup(q->meta_values[i]);
    }
    r->u.list.nfilters = q->nmeta;
  }
  return submit(st, r);
}

int osr_store_count_by_state(osr_store_t *st, const char *tenant, osr_store_counts_cb cb,
                             void *data)
{
  osr__req_t *r;

  if (st == NULL || (tenant != NULL && !fits(tenant, OSR_TENANT_MAX)))
    return OSR_EINVAL;
  if (st->closing)
    return OSR_ECLOSED;
  r = req_new(OP_COUNT, (any_cb_t)cb, data);
  r->background = 1;
  r->u.count.has_tenant = tenant != NULL;
  scpy(r->u.count.tenant, sizeof(r->u.count.tenant), tenant);
  return submit(st, r);
}

int osr_store_touch(osr_store_t *st, const char *id, int64_t at_ms, osr_store_done_cb cb, void *data)
{
  osr__req_t *r;

  if (st == NULL || id == NULL || id[0] == '\0' || !fits(id, OSR_ID_MAX))
    return OSR_EINVAL;
  if (st->closing)
    return OSR_ECLOSED;
  r = req_new(OP_TOUCH, (any_cb_t)cb, data);
  scpy(r->u.touch.id, sizeof(r->u.touch.id), id);
  r->u.touch.at_ms = at_ms != 0 ? at_ms : wall_ms();
  return submit(st, r);
}

int osr_store_key_put(osr_store_t *st, const osr_api_key_t *k, osr_store_done_cb cb, void *data)
{
  osr__req_t *r;

  if (st == NULL || k == NULL || !fits(k->key_id, sizeof(k->key_id)) || k->key_id[0] == '\0' ||
      !fits(k->tenant, sizeof(k->tenant)) || !fits(k->hash, sizeof(k->hash)) || k->hash[0] == '\0' ||
      !fits(k->name, sizeof(k->name)) || (k->role != OSR_ROLE_TENANT && k->role != OSR_ROLE_ADMIN))
    return OSR_EINVAL;
  if (st->closing)
    return OSR_ECLOSED;
  r = req_new(OP_KEY_PUT, (any_cb_t)cb, data);
  r->u.key.k = *k;
  if (r->u.key.k.created_ms == 0)
    r->u.key.k.created_ms = wall_ms();
  return submit(st, r);
}

int osr_store_key_lookup(osr_store_t *st, const char *hash, osr_store_key_cb cb, void *data)
{
  osr__req_t *r;

  if (st == NULL || hash == NULL || hash[0] == '\0' || !fits(hash, sizeof(r->u.key.k.hash)))
    return OSR_EINVAL;
  if (st->closing)
    return OSR_ECLOSED;
  r = req_new(OP_KEY_LOOKUP, (any_cb_t)cb, data);
  scpy(r->u.key.k.hash, sizeof(r->u.key.k.hash), hash);
  return submit(st, r);
}

int osr_store_key_list(osr_store_t *st, const char *tenant, osr_store_keys_cb cb, void *data)
{
  osr__req_t *r;

  if (st == NULL || (tenant != NULL && !fits(tenant, OSR_TENANT_MAX)))
    return OSR_EINVAL;
  if (st->closing)
    return OSR_ECLOSED;
  r = req_new(OP_KEY_LIST, (any_cb_t)cb, data);
  r->u.keys.has_tenant = tenant != NULL;
  scpy(r->u.keys.tenant, sizeof(r->u.keys.tenant), tenant);
  return submit(st, r);
}

int osr_store_key_revoke(osr_store_t *st, const char *key_id, int64_t at_ms, osr_store_done_cb cb,
                         void *data)
{
  osr__req_t *r;

  if (st == NULL || key_id == NULL || key_id[0] == '\0' || !fits(key_id, sizeof(r->u.key.k.key_id)))
    return OSR_EINVAL;
  if (st->closing)
    return OSR_ECLOSED;
  r = req_new(OP_KEY_REVOKE, (any_cb_t)cb, data);
  scpy(r->u.key.k.key_id, sizeof(r->u.key.k.key_id), key_id);
  r->u.key.at_ms = at_ms != 0 ? at_ms : wall_ms();
  return submit(st, r);
}

int osr_store_audit_append(osr_store_t *st, const osr_audit_event_t *ev, osr_store_done_cb cb,
                           void *data)
{
  osr__req_t *r;

  if (st == NULL || ev == NULL || !audit_event_ok(ev))
    return OSR_EINVAL;
  if (st->closing)
    return OSR_ECLOSED;
  r = req_new(OP_AUDIT_APPEND, (any_cb_t)cb, data);
  r->u.audit.ev = *ev;
  r->u.audit.ev.seq = 0;
  r->u.audit.ev.detail_json = dup_or_null(ev->detail_json);
  if (r->u.audit.ev.at_ms == 0)
    r->u.audit.ev.at_ms = wall_ms();
  return submit(st, r);
}

int osr_store_audit_list(osr_store_t *st, const char *tenant, const char *cursor, size_t limit,
                         osr_store_audit_cb cb, void *data)
{
  osr__req_t *r;
  int64_t before = 0;

  if (st == NULL || (tenant != NULL && !fits(tenant, OSR_TENANT_MAX)))
    return OSR_EINVAL;
  if (cursor != NULL) {
    char *end;
    if (strnlen(cursor, 21) > 20)
      return OSR_EINVAL;
    errno = 0;
    before = strtoll(cursor, &end, 10);
    if (errno != 0 || end == cursor || *end != '\0' || before <= 0)
      return OSR_EINVAL;
  }
  if (st->closing)
    return OSR_ECLOSED;
  r = req_new(OP_AUDIT_LIST, (any_cb_t)cb, data);
  r->u.alist.has_tenant = tenant != NULL;
  scpy(r->u.alist.tenant, sizeof(r->u.alist.tenant), tenant);
  r->u.alist.before_seq = before;
  r->u.alist.limit = limit == 0 ? 100 : limit > OSR__STORE_LIST_MAX ? OSR__STORE_LIST_MAX : limit;
  return submit(st, r);
}
