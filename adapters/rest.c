/*
 * A queue of JSON-over-HTTP calls to one provider API (rest.h): the op list,
 * one deadline timer per op (which then delivers the result, so a callback
 * never runs inside the call that set it), one HTTP/1.1 connection per op
 * or one shared HTTP/2 connection, and close with ops in flight. An op is freed when its timer is closed, its
 * request has ended and no connect is in flight; the api is freed when
 * closing and no op is left.
 */
#include "adapters/rest.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "osr/adapter.h"
#include "util/buf.h"
#include "util/log.h"
#include "util/mem.h"

#define MOD "rest"
/* Longest request target (path + query) an adapter may send. */
#define REST_MAX_TARGET 4096

struct osr_rest_op_s {
  osr_rest_op_t *prev, *next; /* api->ops: every op not yet freed */
  osr_rest_t *api;
  int kind;
  uv_timer_t timer; /* the deadline, then the deferred delivery */
  int delivered, finishing, timer_closed, connecting, creq_live;
  int working;     /* cfg.on_work runs on the thread pool: the op stays */
  int work_status; /* what it returned */
  uv_work_t work;
  int waiting;  /* shared: queued for the connection */
  int attempts; /* shared: requests sent (a never-sent one is retried once) */
  int status;
  osr_http_client_t *http;
  osr_http_creq_t *creq;
  int http_status;
  osr_buf_t resp;
  char method[8];
  char *target;     /* osr_xmalloc'd */
  const char *body; /* the adapter's, borrowed until the op ends */
  _Alignas(max_align_t) unsigned char user[];
};

struct osr_rest_s {
  uv_loop_t *loop;
  osr_rest_config_t cfg;
  char name[64];
  char addr[300];
  char authority[300];
  void *owner;
  osr_rest_op_t *ops_head, *ops_tail;
  size_t nops;
  /* shared_h2 */
  osr_http_client_t *http;
  int http_dead, connecting;
  int closing, close_done;
  uv_timer_t close_timer;
  void (*close_cb)(void *owner);
};

int osr_rest_cfg_err(char *err, size_t errlen, const char *key, const char *what)
{
  snprintf(err, errlen, "key '%s': %s", key, what);
  return OSR_EINVAL;
}

int osr_rest_num_in(const json_t *v, double lo, double hi, double *out)
{
  if (!json_is_number(v))
    return -1;
  double d = json_number_value(v);
  if (!(d >= lo && d <= hi))
    return -1;
  *out = d;
  return 0;
}

int osr_rest_map_status(int http_status)
{
  switch (http_status) {
  case 400:
  case 422:
    return OSR_PERR_INVALID;
  case 401:
  case 403:
    return OSR_PERR_AUTH;
  case 404:
    return OSR_PERR_NOT_FOUND;
  case 408:
  case 504:
    return OSR_PERR_TIMEOUT;
  case 429:
    return OSR_PERR_RATE_LIMITED;
  case 507:
    return OSR_PERR_CAPACITY;
  default:
    return OSR_PERR_UNAVAILABLE;
  }
}

osr_rest_t *osr_rest_new(uv_loop_t *loop, const osr_rest_config_t *cfg, void *owner)
{
  osr_rest_t *api = osr_xcalloc(1, sizeof(*api));
  api->loop = loop;
  api->cfg = *cfg;
  if (api->cfg.nheaders > sizeof(api->cfg.headers) / sizeof(api->cfg.headers[0]))
    api->cfg.nheaders = sizeof(api->cfg.headers) / sizeof(api->cfg.headers[0]);
  snprintf(api->name, sizeof(api->name), "%s", cfg->name != NULL ? cfg->name : "");
  snprintf(api->addr, sizeof(api->addr), "%s", cfg->addr);
  snprintf(api->authority, sizeof(api->authority), "%s",
           cfg->authority != NULL ? cfg->authority : cfg->addr);
  api->owner = owner;
  return api;
}

void *osr_rest_owner(const osr_rest_t *api)
{
  return api->owner;
}

int osr_rest_closing(const osr_rest_t *api)
{
  return api->closing;
}

size_t osr_rest_nops(const osr_rest_t *api)
{
  return api->nops;
}

void *osr_rest_user(osr_rest_op_t *op)
{
  return op->user;
}

int osr_rest_kind(const osr_rest_op_t *op)
{
  return op->kind;
}

osr_rest_t *osr_rest_api(const osr_rest_op_t *op)
{
  return op->api;
}

const char *osr_rest_method(const osr_rest_op_t *op)
{
  return op->method;
}

const char *osr_rest_target(const osr_rest_op_t *op)
{
  return op->target != NULL ? op->target : "";
}

/* ---- op lifetime -------------------------------------------------------------- */

static void try_finish_close(osr_rest_t *api);

static void op_free(osr_rest_op_t *op)
{
  osr_rest_t *api = op->api;
  if (op->prev != NULL)
    op->prev->next = op->next;
  else
    api->ops_head = op->next;
  if (op->next != NULL)
    op->next->prev = op->prev;
  else
    api->ops_tail = op->prev;
  api->nops--;
  if (api->cfg.on_release != NULL)
    api->cfg.on_release(op);
  osr_buf_dispose(&op->resp);
  osr_free(op->target);
  osr_free(op);
  if (api->closing)
    try_finish_close(api);
}

static void maybe_free(osr_rest_op_t *op)
{
  if (op->timer_closed && !op->creq_live && !op->connecting && op->http == NULL && !op->working)
    op_free(op);
}

static void on_timer_closed(uv_handle_t *h)
{
  osr_rest_op_t *op = h->data;
  op->timer_closed = 1;
  maybe_free(op);
}

static void op_send(osr_rest_op_t *op);

static void on_deliver_timer(uv_timer_t *t)
{
  osr_rest_op_t *op = t->data;
  op->delivered = 1;
  op->api->cfg.on_deliver(op, op->status);
  uv_close((uv_handle_t *)&op->timer, on_timer_closed);
}

static void drop_http(osr_rest_op_t *op)
{
  if (op->http != NULL) {
    /* Outstanding requests end with OSR_ECANCELED in on_body. */
    osr_http_client_t *c = op->http;
    op->http = NULL;
    osr_http_client_close(c);
  }
}

void osr_rest_finish(osr_rest_op_t *op, int status)
{
  if (op->finishing || op->delivered)
    return;
  op->finishing = 1;
  op->status = status;
  op->waiting = 0;
  if (op->creq_live && op->creq != NULL)
    osr_http_creq_cancel(op->creq);
  drop_http(op);
  uv_timer_stop(&op->timer);
  /* on_work may still be writing the state on_deliver reads: after_work
   * starts the delivery then. */
  if (!op->working)
    uv_timer_start(&op->timer, on_deliver_timer, 0, 0);
}

static void on_deadline(uv_timer_t *t)
{
  osr_rest_op_t *op = t->data;
  OSR_LOG_DEBUG(MOD, "%s: %s %s: no answer in %llu ms", op->api->name, op->method,
                osr_rest_target(op), (unsigned long long)op->api->cfg.timeout_ms);
  osr_rest_finish(op, OSR_PERR_TIMEOUT);
}

osr_rest_op_t *osr_rest_op_new(osr_rest_t *api, int kind)
{
  osr_rest_op_t *op = osr_xcalloc(1, sizeof(*op) + api->cfg.user_size);
  op->api = api;
  op->kind = kind;
  uv_timer_init(api->loop, &op->timer);
  op->timer.data = op;
  osr_buf_init(&op->resp, api->cfg.max_response);
  op->prev = api->ops_tail;
  if (api->ops_tail != NULL)
    api->ops_tail->next = op;
  else
    api->ops_head = op;
  api->ops_tail = op;
  api->nops++;
  /* The whole operation (every request it sends) has one deadline. */
  if (api->cfg.timeout_ms > 0)
    uv_timer_start(&op->timer, on_deadline, api->cfg.timeout_ms, 0);
  return op;
}

/* ---- the HTTP exchange -------------------------------------------------------- */

static void on_response(osr_http_creq_t *r, int status, const osr_http_header_t *h, size_t nh,
                        void *data)
{
  osr_rest_op_t *op = data;
  (void)r;
  op->http_status = status;
  if (op->api->cfg.on_head != NULL && !op->finishing)
    op->api->cfg.on_head(op, status, h, nh);
}

static void on_resend_timer(uv_timer_t *t)
{
  osr_rest_op_t *op = t->data;
  if (op->api->cfg.timeout_ms > 0)
    uv_timer_start(&op->timer, on_deadline, op->api->cfg.timeout_ms, 0);
  op_send(op);
}

/* ---- answers off the loop (cfg.on_work) ---------------------------------------- */

static void work_run(uv_work_t *w)
{
  osr_rest_op_t *op = w->data;
  op->work_status =
      op->api->cfg.on_work(op, op->http_status, osr_buf_data(&op->resp), op->resp.len);
}

static void work_done(uv_work_t *w, int status)
{
  osr_rest_op_t *op = w->data;
  op->working = 0;
  if (op->finishing) {
    /* A deadline or close came first: its result stands, delivered now. */
    uv_timer_start(&op->timer, on_deliver_timer, 0, 0);
  } else if (status == 0 && op->work_status == OSR_EAGAIN) {
    op->api->cfg.on_answer(op, op->http_status, osr_buf_data(&op->resp), op->resp.len);
  } else {
    osr_rest_finish(op, status != 0 ? OSR_ECANCELED : op->work_status);
  }
  maybe_free(op);
}

/* Hand a whole answer to cfg.on_work on the thread pool; 0 if it went. */
static int work_start(osr_rest_op_t *op)
{
  const osr_rest_config_t *cfg = &op->api->cfg;
  if (cfg->on_work == NULL || op->resp.len < cfg->work_min_bytes)
    return -1;
  op->work.data = op;
  op->working = 1;
  if (uv_queue_work(op->api->loop, &op->work, work_run, work_done) != 0) {
    op->working = 0;
    return -1;
  }
  return 0;
}

static void on_body(osr_http_creq_t *r, const osr_iovec_t *chunk, int status, void *data)
{
  osr_rest_op_t *op = data;
  if (status == 0) {
    if (osr_buf_append(&op->resp, chunk->base, chunk->len) != 0)
      osr_http_creq_cancel(r); /* the final on_body follows with OSR_ECANCELED */
    return;
  }
  /* The final callback: the request is freed after it returns. */
  op->creq = NULL;
  op->creq_live = 0;
  if (op->finishing) {
    maybe_free(op);
    return;
  }
  osr_rest_t *api = op->api;
  if (status == OSR_EOF) {
    if (work_start(op) != 0)
      api->cfg.on_answer(op, op->http_status, osr_buf_data(&op->resp), op->resp.len);
  } else if (api->cfg.shared_h2 && status == OSR_ECLOSED && !api->closing && op->attempts < 2) {
    /* Never reached the wire (the shared connection had died): safe to
     * send again on a new connection, from the timer (not inside the
     * client's callback). The deadline restarts. */
    api->http_dead = 1;
    uv_timer_stop(&op->timer);
    uv_timer_start(&op->timer, on_resend_timer, 0, 0);
  } else {
    if (api->cfg.shared_h2 && status != OSR_ECANCELED)
      api->http_dead = 1;
    osr_rest_finish(op, op->api->closing          ? OSR_ECANCELED
                        : status == OSR_ETIMEDOUT ? OSR_PERR_TIMEOUT
                                                  : OSR_PERR_UNAVAILABLE);
  }
  maybe_free(op);
}

static const osr_http_client_events_t http_events = {
    .on_response = on_response,
    .on_body = on_body,
};

static void on_written(osr_http_creq_t *r, int status, void *arg)
{
  /* Nothing to do: the body lives in the op until the request ends. */
  (void)r;
  (void)status;
  (void)arg;
}

static void on_connect(osr_http_client_t *c, int status, void *data);
static void on_shared_connect(osr_http_client_t *c, int status, void *data);

static void client_opts(const osr_rest_t *api, osr_http_client_opts_t *o)
{
  memset(o, 0, sizeof(*o));
  o->tls = api->cfg.tls;
  o->h2_prior_knowledge = api->cfg.shared_h2;
  o->connect_timeout_ms =
      api->cfg.connect_timeout_ms ? api->cfg.connect_timeout_ms : api->cfg.timeout_ms;
  o->idle_timeout_ms = api->cfg.idle_timeout_ms ? api->cfg.idle_timeout_ms : api->cfg.timeout_ms;
  o->limits.max_body = api->cfg.max_response;
}

static void fail_waiting(osr_rest_t *api, int status)
{
  for (osr_rest_op_t *op = api->ops_head; op != NULL; op = op->next)
    if (op->waiting)
      osr_rest_finish(op, status); /* clears waiting */
}

static void start_shared_connect(osr_rest_t *api)
{
  osr_http_client_opts_t o;
  client_opts(api, &o);
  if (osr_http_client_connect(api->loop, api->addr, &o, on_shared_connect, api) != 0) {
    fail_waiting(api, OSR_PERR_UNAVAILABLE);
    return;
  }
  api->connecting = 1;
}

static void op_send(osr_rest_op_t *op)
{
  osr_rest_t *api = op->api;
  if (api->closing) {
    osr_rest_finish(op, OSR_ECANCELED);
    return;
  }
  if (api->cfg.shared_h2) {
    if (api->http != NULL && api->http_dead) {
      osr_http_client_close(api->http);
      api->http = NULL;
      api->http_dead = 0;
    }
    if (api->http == NULL) {
      op->waiting = 1;
      if (!api->connecting)
        start_shared_connect(api);
      return;
    }
  } else if (op->http == NULL) {
    osr_http_client_opts_t o;
    client_opts(api, &o);
    int rv = osr_http_client_connect(api->loop, api->addr, &o, on_connect, op);
    if (rv != 0) {
      osr_rest_finish(op, OSR_PERR_UNAVAILABLE);
      return;
    }
    op->connecting = 1;
    return;
  }
  osr_http_client_t *http = api->cfg.shared_h2 ? api->http : op->http;
  op->attempts++;
  osr_buf_consume(&op->resp, op->resp.len);
  size_t blen = op->body != NULL ? strlen(op->body) : 0;
  osr_http_header_t hdr[sizeof(api->cfg.headers) / sizeof(api->cfg.headers[0]) + 1];
  size_t nh = api->cfg.nheaders;
  memcpy(hdr, api->cfg.headers, nh * sizeof(hdr[0]));
  if (blen > 0)
    hdr[nh++] = (osr_http_header_t){OSR_IOV_LIT("content-type"), OSR_IOV_LIT("application/json")};
  osr_http_client_req_t req = {
      .method = op->method,
      .target = op->target,
      .authority = api->authority,
      .headers = hdr,
      .nheaders = nh,
      .content_length = (int64_t)blen,
  };
  int rv = osr_http_client_request(http, &req, &http_events, op, &op->creq);
  if (rv == OSR_ECLOSED && api->cfg.shared_h2 && op->attempts < 2) {
    api->http_dead = 1;
    op_send(op); /* once more, on a new connection */
    return;
  }
  if (rv != 0) {
    if (api->cfg.shared_h2)
      api->http_dead = 1;
    osr_rest_finish(op, OSR_PERR_UNAVAILABLE);
    return;
  }
  op->creq_live = 1;
  if (blen > 0) {
    osr_iovec_t iov = osr_iov(op->body, blen);
    if (osr_http_creq_write(op->creq, &iov, 1, 1, on_written, op) != 0)
      osr_http_creq_cancel(op->creq); /* its final on_body reports the failure */
  }
}

static void on_connect(osr_http_client_t *c, int status, void *data)
{
  osr_rest_op_t *op = data;
  op->connecting = 0;
  if (op->finishing || op->api->closing) {
    if (c != NULL)
      osr_http_client_close(c);
    osr_rest_finish(op, OSR_ECANCELED); /* no-op when a result was already set */
    maybe_free(op);
    return;
  }
  if (status != 0) {
    OSR_LOG_DEBUG(MOD, "%s: connect %s: %s", op->api->name, op->api->addr, osr_strerror(status));
    /* Refused, reset, unresolvable or timed out: the provider is down. */
    osr_rest_finish(op, status == OSR_ETIMEDOUT ? OSR_PERR_TIMEOUT : OSR_PERR_UNAVAILABLE);
    maybe_free(op);
    return;
  }
  op->http = c;
  op_send(op);
}

static void on_shared_connect(osr_http_client_t *c, int status, void *data)
{
  osr_rest_t *api = data;
  api->connecting = 0;
  if (api->closing) {
    if (c != NULL)
      osr_http_client_close(c);
    fail_waiting(api, OSR_ECANCELED);
    try_finish_close(api);
    return;
  }
  if (status != 0) {
    OSR_LOG_DEBUG(MOD, "%s: connect %s: %s", api->name, api->addr, osr_strerror(status));
    /* Refused, reset or timed out: the provider is down. */
    fail_waiting(api, status == OSR_ETIMEDOUT ? OSR_PERR_TIMEOUT : OSR_PERR_UNAVAILABLE);
    return;
  }
  api->http = c;
  api->http_dead = 0;
  /* op_send never unlinks ops (only freeing does, later), so walking the
   * list while sending is safe. */
  for (osr_rest_op_t *op = api->ops_head; op != NULL; op = op->next) {
    if (op->waiting) {
      op->waiting = 0;
      op_send(op);
    }
  }
}

void osr_rest_send(osr_rest_op_t *op, const char *method, const char *target, const char *body)
{
  if (op->finishing || op->delivered)
    return;
  size_t tn = strlen(target);
  if (tn >= REST_MAX_TARGET || strlen(method) >= sizeof(op->method)) {
    osr_rest_finish(op, OSR_EINVAL);
    return;
  }
  snprintf(op->method, sizeof(op->method), "%s", method);
  osr_free(op->target);
  op->target = osr_xmalloc(tn + 1);
  memcpy(op->target, target, tn + 1);
  op->body = body;
  op_send(op);
}

/* ---- close -------------------------------------------------------------------- */

static void on_close_timer_closed(uv_handle_t *h)
{
  osr_rest_t *api = h->data;
  void (*cb)(void *) = api->close_cb;
  void *owner = api->owner;
  osr_free(api);
  if (cb != NULL)
    cb(owner);
}

static void try_finish_close(osr_rest_t *api)
{
  if (api->close_done || api->nops > 0 || api->connecting)
    return;
  api->close_done = 1;
  /* A handle's close completes on a later loop turn: the close callback
   * never runs inside osr_rest_close(). */
  uv_close((uv_handle_t *)&api->close_timer, on_close_timer_closed);
}

void osr_rest_close(osr_rest_t *api, void (*cb)(void *owner))
{
  if (api->closing)
    return;
  api->closing = 1;
  api->close_cb = cb;
  uv_timer_init(api->loop, &api->close_timer);
  api->close_timer.data = api;
  /* Finishing never unlinks (only freeing does, from a close callback
   * later), so walking the list is safe. */
  for (osr_rest_op_t *op = api->ops_head; op != NULL; op = op->next)
    osr_rest_finish(op, OSR_ECANCELED);
  if (api->http != NULL) {
    /* Outstanding requests end with OSR_ECANCELED in on_body. */
    osr_http_client_t *c = api->http;
    api->http = NULL;
    osr_http_client_close(c);
  }
  try_finish_close(api);
}
