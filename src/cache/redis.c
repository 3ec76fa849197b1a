/*
 * Redis binding cache and invalidation bus on hiredis 0.14 and its libuv
 * adapter. The contract is in redis.h; this file is about lifetimes.
 *
 * Two connections per client: `cmd` carries GET/SET/DEL/PUBLISH, `sub` (only
 * after osr_redis_subscribe) sits in SUBSCRIBE mode, because a subscribed
 * connection cannot issue ordinary commands in RESP2.
 *
 * Lifetimes, which is where hiredis bites:
 *  - hiredis owns the redisAsyncContext. It is freed synchronously by
 *    redisAsyncFree() (or deferred to the end of the running reply callback),
 *    or by hiredis itself after an I/O error or a failed connect. Every one of
 *    those paths runs the adapter's cleanup hook exactly once, whereas the
 *    disconnect callback only runs for contexts that had connected. So the
 *    cleanup hook (hook_cleanup) is our single "this context is gone" signal.
 *  - Every command hands hiredis a small cmd_t as privdata. hiredis calls back
 *    for every queued command exactly once, with NULL when the context is
 *    torn down. The cmd_t therefore lives until that call even when the
 *    caller was answered earlier (timeout, close): it is then an "orphan" and
 *    its late reply is dropped. hiredis never sees freed memory.
 *  - osr_redis_t is freed only in the last close callback of our own uv
 *    timers, which we close only once both contexts are gone and no
 *    uv_getaddrinfo is in flight; by then hiredis holds no pointer to us.
 *
 * Reply size: hiredis 0.14's reader has no maxelements and its maxbuf only
 * governs when an idle buffer is released; a bulk reply is buffered whole
 * before it is handed to us. We therefore poll through our own uv_poll
 * callback (hook_poll_cb) which, after hiredis consumed what it could,
 * drops the connection when more than OSR_REDIS_REPLY_BUF_MAX bytes of a
 * partial reply are buffered, and we wrap the reader's object functions to
 * refuse arrays and strings above our caps.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/adapters/libuv.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <hiredis/sds.h>
#include <jansson.h>

#include "cache/redis.h"
#include "util/log.h"
#include "util/mem.h"

#define MOD "redis"

/* Buffered bytes of one partial reply before the connection is dropped. */
#define OSR_REDIS_REPLY_BUF_MAX (OSR_BINDING_JSON_MAX + 64 * 1024)
/* Our replies are status/integer/bulk, pub/sub arrays of 3, or an activity
 * drain (id, ms pairs, at most OSR_REDIS_ACTIVITY_BATCH_MAX of them). */
#define OSR_REDIS_MAX_ELEMENTS (2 * OSR_REDIS_ACTIVITY_BATCH_MAX)
/* hiredis's output buffer is unbounded; refuse new commands above this. */
#define OSR_REDIS_OBUF_MAX (32u * 1024 * 1024)
/* Release an idle reader buffer above this (hiredis's own maxbuf knob). */
#define OSR_REDIS_READER_MAXBUF (64 * 1024)
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define PREFIX_MAX 64
#define KEY_MAX (PREFIX_MAX + 2 + OSR_REDIS_ID_MAX + 1)

typedef enum conn_phase_e {
  CONN_IDLE = 0,   /* no context: waiting for the backoff timer (or closed) */
  CONN_RESOLVING,  /* uv_getaddrinfo in flight */
  CONN_CONNECTING, /* context exists, handshake not finished */
  CONN_UP,         /* handshake done: commands may be sent */
} conn_phase_t;

typedef struct conn_s {
  osr_redis_t *r;
  int is_sub;
  redisAsyncContext *ac; /* NULL when no context exists */
  conn_phase_t phase;
  int dying;          /* teardown of `ac` started: send nothing more */
  int dropped;        /* we started that teardown (already logged) */
  int over_cap;       /* the reader refused a reply above our caps */
  int ever_up;        /* sub: a reconnect means messages may have been missed */
  int handshake_left; /* AUTH/SELECT/PING replies still expected */
  int enabled;        /* sub: only after osr_redis_subscribe */
  uv_getaddrinfo_t gai;
  int gai_active;
  uv_timer_t timer; /* connect timeout, then reconnect backoff */
  uint64_t backoff_ms;
  unsigned failures; /* consecutive failed attempts: picks the next address */
} conn_t;

typedef enum cmd_kind_e {
  CMD_PUT = 1,
  CMD_GET,
  CMD_INVALIDATE,
  CMD_ACT_ADD,
  CMD_ACT_DRAIN
} cmd_kind_t;

typedef struct cmd_s {
  struct cmd_s *prev, *next; /* r->pending, in send order, while the caller waits */
  osr_redis_t *r;
  cmd_kind_t kind;
  int linked;
  int orphan;       /* the caller was answered already (timeout, close) */
  int replies_left; /* hiredis callbacks still to come for this cmd */
  int status;       /* first error among several replies (invalidate) */
  uint64_t sent_ns;
  uint64_t deadline_ms;
  union {
    osr_redis_done_cb done;
    osr_redis_binding_cb binding;
    osr_redis_activity_cb activity;
  } cb;
  void *data;
} cmd_t;

struct osr_redis_s {
  uv_loop_t *loop;
  /* target */
  char *host;
  int port;
  char *unix_path;
  int db;
  char *user;
  char *password;
  char prefix[PREFIX_MAX + 1];
  size_t prefix_len;
  char channel[PREFIX_MAX + sizeof("invalidate")];
  /* options */
  uint64_t connect_timeout_ms;
  uint64_t command_timeout_ms;
  uint64_t stall_ms;
  uint64_t binding_ttl_ms;
  size_t max_inflight;
  /* connections */
  conn_t cmd;
  conn_t sub;
  /* commands on `cmd` whose caller waits; FIFO = deadline order */
  cmd_t *head, *tail;
  size_t inflight; /* hiredis callbacks outstanding on `cmd`, orphans included */
  uv_timer_t cmd_timer;
  uint64_t last_rx_ms; /* last reply on `cmd` (stall detection) */
  uint64_t last_latency_us;
  /* subscriber */
  osr_redis_invalidate_cb sub_cb;
  void *sub_data;
  /* close */
  int closing;
  int handles_left;
  void (*close_cb)(void *data);
  void *close_data;
};

static void conn_start(conn_t *c);
static void conn_retry(conn_t *c);
static void maybe_finish_close(osr_redis_t *r);

/* ---- binding <-> JSON ------------------------------------------------------
 * The cache format is ours (the data plane reads it with the same code): a
 * flat object, "v":1, every field of osr_binding_t, enums by name, the four
 * JSON documents as strings so their bytes survive exactly. Parsing treats
 * the input as hostile: it came over the network. */

static const char *const state_names[] = {
  [OSR_BINDING_CREATING] = "creating", [OSR_BINDING_RUNNING] = "running",
  [OSR_BINDING_PAUSED] = "paused",     [OSR_BINDING_ENDED] = "ended",
  [OSR_BINDING_FAILED] = "failed",     [OSR_BINDING_LOST] = "lost",
};

static const char *const iso_names[] = {
  [OSR_ISO_NONE] = "none",
  [OSR_ISO_CONTAINER] = "container",
  [OSR_ISO_GVISOR] = "gvisor",
  [OSR_ISO_FIRECRACKER] = "firecracker",
};

static int name_lookup(const char *const *names, size_t n, const char *s)
{
  for (size_t i = 0; i < n; i++)
    if (names[i] != NULL && strcmp(names[i], s) == 0)
      return (int)i;
  return -1;
}

int osr_redis_id_is_valid(const char *id, size_t len)
{
  if (len == 0 || len > OSR_REDIS_ID_MAX)
    return 0;
  for (size_t i = 0; i < len; i++) {
    char ch = id[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' ||
          ch == '*'))
      return 0;
  }
  return 1;
}

static int put_fixed(json_t *o, const char *name, const char *s, size_t cap)
{
  size_t n = strnlen(s, cap);
  json_t *v;
  if (n == cap)
    return OSR_EINVAL; /* not NUL-terminated inside its array */
  v = json_stringn(s, n);
  if (v == NULL)
    return OSR_EINVAL; /* not UTF-8 */
  return json_object_set_new(o, name, v) == 0 ? 0 : OSR_ENOMEM;
}

static int put_doc(json_t *o, const char *name, const char *s)
{
  json_t *v;
  if (s == NULL) {
    v = json_null();
  } else {
    size_t n = strlen(s);
    if (n > OSR_BINDING_DOC_MAX)
      return OSR_ETOOLARGE;
    v = json_stringn(s, n);
    if (v == NULL)
      return OSR_EINVAL;
  }
  return json_object_set_new(o, name, v) == 0 ? 0 : OSR_ENOMEM;
}

static int put_int(json_t *o, const char *name, int64_t x)
{
  json_t *v = json_integer((json_int_t)x);
  if (v == NULL)
    return OSR_ENOMEM;
  return json_object_set_new(o, name, v) == 0 ? 0 : OSR_ENOMEM;
}

int osr_binding_to_json(const osr_binding_t *b, char **out)
{
  json_t *o = NULL;
  char *buf = NULL;
  size_t size;
  int rv;

  if (out == NULL)
    return OSR_EINVAL;
  *out = NULL;
  if (b == NULL)
    return OSR_EINVAL;
  if ((unsigned)b->state >= OSR_ARRAY_SIZE(state_names) || state_names[b->state] == NULL)
    return OSR_EINVAL;
  if ((unsigned)b->isolation >= OSR_ARRAY_SIZE(iso_names))
    return OSR_EINVAL;
  if (!osr_redis_id_is_valid(b->id, strnlen(b->id, sizeof(b->id))) || strchr(b->id, '*') != NULL)
    return OSR_EINVAL;

  o = json_object();
  if (o == NULL)
    return OSR_ENOMEM;
#define PUT(expr)          \
  do {                     \
    if ((rv = (expr)) != 0) \
      goto out;            \
  } while (0)
#define PUT_FIXED(name, field) PUT(put_fixed(o, name, b->field, sizeof(b->field)))
  PUT(put_int(o, "v", 1));
  PUT_FIXED("id", id);
  PUT_FIXED("tenant", tenant);
  PUT_FIXED("idem_key", idem_key);
  PUT_FIXED("request_hash", request_hash);
  PUT_FIXED("template", template_id);
  PUT_FIXED("provider", provider);
  PUT_FIXED("provider_id", provider_id);
  PUT_FIXED("region", region);
  PUT(json_object_set_new(o, "isolation", json_string(iso_names[b->isolation])) == 0 ? 0
                                                                                       : OSR_ENOMEM);
  PUT_FIXED("agent_endpoint", agent_endpoint);
  PUT(json_object_set_new(o, "state", json_string(state_names[b->state])) == 0 ? 0 : OSR_ENOMEM);
  PUT(put_int(o, "attempt", b->attempt));
  PUT(put_int(o, "created_ms", b->created_ms));
  PUT(put_int(o, "updated_ms", b->updated_ms));
  PUT(put_int(o, "expires_ms", b->expires_ms));
  PUT(put_int(o, "idle_timeout_ms", b->idle_timeout_ms));
  PUT(put_int(o, "last_activity_ms", b->last_activity_ms));
  PUT(put_int(o, "ended_ms", b->ended_ms));
  PUT_FIXED("end_reason", end_reason);
  PUT(put_doc(o, "request", b->request_json));
  PUT(put_doc(o, "granted", b->granted_json));
  PUT(put_doc(o, "metadata", b->metadata_json));
  PUT(put_doc(o, "error", b->error_json));
#undef PUT_FIXED
#undef PUT

  size = json_dumpb(o, NULL, 0, JSON_COMPACT);
  if (size == 0) {
    rv = OSR_ENOMEM;
    goto out;
  }
  /* Never write what osr_binding_from_json would refuse to read back. */
  if (size > OSR_BINDING_JSON_MAX) {
    rv = OSR_ETOOLARGE;
    goto out;
  }
  buf = osr_try_malloc(size + 1);
  if (buf == NULL) {
    rv = OSR_ENOMEM;
    goto out;
  }
  if (json_dumpb(o, buf, size, JSON_COMPACT) != size) {
    rv = OSR_ENOMEM;
    goto out;
  }
  buf[size] = '\0';
  *out = buf;
  buf = NULL;
  rv = 0;
out:
  osr_free(buf);
  json_decref(o);
  return rv;
}

static int get_fixed(json_t *o, const char *name, char *dst, size_t cap)
{
  json_t *v = json_object_get(o, name);
  size_t n;
  if (!json_is_string(v))
    return OSR_EINVAL;
  n = json_string_length(v);
  /* Room for the NUL, and no NUL inside (jansson rejects \u0000 by default,
   * but do not rely on a parser flag for a memory-safety property). */
  if (n >= cap || memchr(json_string_value(v), '\0', n) != NULL)
    return OSR_EINVAL;
  memcpy(dst, json_string_value(v), n);
  dst[n] = '\0';
  return 0;
}

static int get_doc(json_t *o, const char *name, char **dst)
{
  json_t *v = json_object_get(o, name);
  size_t n;
  char *s;
  if (json_is_null(v))
    return 0;
  if (!json_is_string(v))
    return OSR_EINVAL;
  n = json_string_length(v);
  if (n > OSR_BINDING_DOC_MAX || memchr(json_string_value(v), '\0', n) != NULL)
    return OSR_EINVAL;
  s = osr_try_malloc(n + 1);
  if (s == NULL)
    return OSR_ENOMEM;
  memcpy(s, json_string_value(v), n);
  s[n] = '\0';
  *dst = s;
  return 0;
}

static int get_int(json_t *o, const char *name, int64_t lo, int64_t hi, int64_t *dst)
{
  json_t *v = json_object_get(o, name);
  json_int_t x;
  if (!json_is_integer(v))
    return OSR_EINVAL;
  x = json_integer_value(v);
  if (x < lo || x > hi)
    return OSR_EINVAL;
  *dst = (int64_t)x;
  return 0;
}

static int get_enum(json_t *o, const char *name, const char *const *names, size_t n, int *dst)
{
  json_t *v = json_object_get(o, name);
  int i;
  if (!json_is_string(v))
    return OSR_EINVAL;
  i = name_lookup(names, n, json_string_value(v));
  if (i < 0)
    return OSR_EINVAL;
  *dst = i;
  return 0;
}

static void binding_free_docs(osr_binding_t *b)
{
  osr_freep(&b->request_json);
  osr_freep(&b->granted_json);
  osr_freep(&b->metadata_json);
  osr_freep(&b->error_json);
}

int osr_binding_from_json(const char *json, size_t len, osr_binding_t *b)
{
  json_t *o = NULL;
  json_error_t jerr;
  int64_t x;
  int e;
  int rv = OSR_EINVAL;

  if (b == NULL)
    return OSR_EINVAL;
  memset(b, 0, sizeof(*b));
  if (json == NULL || len == 0 || len > OSR_BINDING_JSON_MAX)
    return OSR_EINVAL;
  o = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!json_is_object(o))
    goto out;

#define GET(expr)           \
  do {                      \
    if ((rv = (expr)) != 0) \
      goto out;             \
  } while (0)
#define GET_FIXED(name, field) GET(get_fixed(o, name, b->field, sizeof(b->field)))
  GET(get_int(o, "v", 1, 1, &x));
  GET_FIXED("id", id);
  if (!osr_redis_id_is_valid(b->id, strlen(b->id)) || strchr(b->id, '*') != NULL) {
    rv = OSR_EINVAL;
    goto out;
  }
  GET_FIXED("tenant", tenant);
  GET_FIXED("idem_key", idem_key);
  GET_FIXED("request_hash", request_hash);
  GET_FIXED("template", template_id);
  GET_FIXED("provider", provider);
  GET_FIXED("provider_id", provider_id);
  GET_FIXED("region", region);
  GET(get_enum(o, "isolation", iso_names, OSR_ARRAY_SIZE(iso_names), &e));
  b->isolation = (osr_isolation_t)e;
  GET_FIXED("agent_endpoint", agent_endpoint);
  GET(get_enum(o, "state", state_names, OSR_ARRAY_SIZE(state_names), &e));
  b->state = (osr_binding_state_t)e;
  GET(get_int(o, "attempt", 0, 1000000, &x));
  b->attempt = (int)x;
  GET(get_int(o, "created_ms", 0, INT64_MAX, &b->created_ms));
  GET(get_int(o, "updated_ms", 0, INT64_MAX, &b->updated_ms));
  GET(get_int(o, "expires_ms", 0, INT64_MAX, &b->expires_ms));
  GET(get_int(o, "idle_timeout_ms", 0, INT64_MAX, &b->idle_timeout_ms));
  GET(get_int(o, "last_activity_ms", 0, INT64_MAX, &b->last_activity_ms));
  GET(get_int(o, "ended_ms", 0, INT64_MAX, &b->ended_ms));
  GET_FIXED("end_reason", end_reason);
  GET(get_doc(o, "request", &b->request_json));
  GET(get_doc(o, "granted", &b->granted_json));
  GET(get_doc(o, "metadata", &b->metadata_json));
  GET(get_doc(o, "error", &b->error_json));
#undef GET_FIXED
#undef GET
  /* Unknown members are ignored on purpose: during a rolling upgrade a newer
   * gateway may cache a field this one does not know yet. */
  rv = 0;
out:
  json_decref(o);
  if (rv != 0) {
    binding_free_docs(b);
    memset(b, 0, sizeof(*b));
    if (rv != OSR_ENOMEM)
      rv = OSR_EINVAL;
  }
  return rv;
}

/* ---- reply caps ------------------------------------------------------------ */

static redisReplyObjectFunctions capped_fns;
static redisReplyObjectFunctions orig_fns;
static uv_once_t capped_once = UV_ONCE_INIT;

/* Returning NULL makes the reader fail with "Out of memory" and hiredis
 * drop the connection; over_cap (the reader's privdata is our conn_t) lets
 * the log say what really happened. */
static void *capped_create_string(const redisReadTask *task, char *str, size_t len)
{
  if (len > OSR_BINDING_JSON_MAX) {
    ((conn_t *)task->privdata)->over_cap = 1;
    return NULL;
  }
  return orig_fns.createString(task, str, len);
}

static void *capped_create_array(const redisReadTask *task, int elements)
{
  /* Checked before hiredis callocs `elements` pointers on the peer's word. */
  if (elements > OSR_REDIS_MAX_ELEMENTS) {
    ((conn_t *)task->privdata)->over_cap = 1;
    return NULL;
  }
  return orig_fns.createArray(task, elements);
}

static void capped_init(void)
{
  /* hiredis keeps its default object functions private; borrow them from a
   * throw-away reader. */
  redisReader *rd = redisReaderCreate();
  if (rd == NULL)
    abort(); /* start-up OOM: nothing sensible to do */
  orig_fns = *rd->fn;
  redisReaderFree(rd);
  capped_fns = orig_fns;
  capped_fns.createString = capped_create_string;
  capped_fns.createArray = capped_create_array;
}

/* ---- event hooks over hiredis's libuv adapter ------------------------------
 * The adapter's struct, attach and cleanup are used as they are; only the
 * poll callback is ours, so that after hiredis handled an event we can look
 * at how much of an unfinished reply it buffered. */

static void conn_drop(conn_t *c, const char *why);

static void hook_poll_cb(uv_poll_t *h, int status, int events)
{
  redisLibuvEvents *p = h->data;
  redisAsyncContext *ac;

  if (status < 0) {
    /* libuv reports POLLERR (a refused connect, a reset) as UV_EBADF and
     * stops the handle; the adapter ignores it, so hiredis would wait on a
     * dead fd forever. */
    if (p->context != NULL) {
      conn_t *c = p->context->data;
      if (c->phase == CONN_UP)
        conn_drop(c, "socket error");
      else
        conn_drop(c, NULL); /* a refused connect: the retry is logged at debug */
    }
    return;
  }
  redisLibuvPoll(h, status, events);
  /* p outlives the context: the adapter frees it in its uv_close callback,
   * and a context freed during this event set p->context to NULL. */
  ac = p->context;
  if (ac != NULL && ac->c.reader != NULL &&
      ac->c.reader->len - ac->c.reader->pos > OSR_REDIS_REPLY_BUF_MAX)
    conn_drop(ac->data, "reply larger than the cap");
}

static void hook_set(void *privdata, int add, int flag)
{
  redisLibuvEvents *p = privdata;
  if (add)
    p->events |= flag;
  else
    p->events &= ~flag;
  if (p->events)
    uv_poll_start(&p->handle, p->events, hook_poll_cb);
  else
    uv_poll_stop(&p->handle);
}

static void hook_add_read(void *privdata) { hook_set(privdata, 1, UV_READABLE); }
static void hook_del_read(void *privdata) { hook_set(privdata, 0, UV_READABLE); }
static void hook_add_write(void *privdata) { hook_set(privdata, 1, UV_WRITABLE); }
static void hook_del_write(void *privdata) { hook_set(privdata, 0, UV_WRITABLE); }

/* Called by hiredis exactly once per attached context, on every free path,
 * after the last reply callback and before the disconnect callback and the
 * final free. From here on hiredis calls nothing of ours except the
 * disconnect callback, which only logs. */
static void conn_gone(conn_t *c, const char *err);

static void hook_cleanup(void *privdata)
{
  redisLibuvEvents *p = privdata;
  redisAsyncContext *ac = p->context;
  conn_t *c = ac->data;
  redisLibuvCleanup(p);
  conn_gone(c, c->over_cap                     ? "reply larger than the cap"
               : ac->err && ac->errstr != NULL ? ac->errstr
                                                : "closed by the server");
}

/* ---- connections ------------------------------------------------------------ */

static int conn_is_up(const conn_t *c)
{
  return c->ac != NULL && !c->dying && c->phase == CONN_UP;
}

/* Start tearing the context down. Synchronous unless hiredis is inside one
 * of its callbacks for this context, in which case it frees it when that
 * callback returns; either way hook_cleanup reports the end. */
static void conn_drop(conn_t *c, const char *why)
{
  if (c->ac == NULL || c->dying)
    return;
  if (why != NULL)
    OSR_LOG_WARN(MOD, "%s connection dropped: %s", c->is_sub ? "subscriber" : "command", why);
  c->dying = 1;
  c->dropped = 1;
  redisAsyncFree(c->ac);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
  conn_t *c = ac->data;
  /* On failure hiredis frees the context right after we return (no freeing
   * from here: hiredis would touch it afterwards). */
  if (status != REDIS_OK)
    OSR_LOG_DEBUG(MOD, "connect failed: %s", ac->errstr != NULL ? ac->errstr : "?");
  else
    OSR_LOG_DEBUG(MOD, "%s connection established", c->is_sub ? "subscriber" : "command");
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
  (void)status;
  OSR_LOG_DEBUG(MOD, "disconnected: %s", ac->errstr != NULL && ac->err ? ac->errstr : "closed");
}

static void conn_up(conn_t *c)
{
  osr_redis_t *r = c->r;
  int was_up = c->ever_up;
  c->phase = CONN_UP;
  c->backoff_ms = BACKOFF_MIN_MS;
  c->failures = 0;
  c->ever_up = 1;
  uv_timer_stop(&c->timer);
  if (!c->is_sub) {
    r->last_rx_ms = uv_now(r->loop);
    OSR_LOG_INFO(MOD, "connected");
    return;
  }
  /* Messages published while we were away are lost: tell the subscriber to
   * drop everything it cached. */
  if (was_up && r->sub_cb != NULL && !r->closing)
    r->sub_cb("*", r->sub_data);
}

static void handshake_cb(redisAsyncContext *ac, void *reply_, void *privdata)
{
  conn_t *c = privdata;
  redisReply *reply = reply_;
  (void)ac;
  if (reply == NULL || c->dying)
    return; /* teardown */
  if (reply->type == REDIS_REPLY_ERROR) {
    OSR_LOG_WARN(MOD, "handshake refused: %.*s", (int)reply->len, reply->str);
    conn_drop(c, NULL);
    return;
  }
  if (--c->handshake_left == 0 && !c->is_sub)
    conn_up(c);
}

static void sub_cb(redisAsyncContext *ac, void *reply_, void *privdata)
{
  conn_t *c = privdata;
  osr_redis_t *r = c->r;
  redisReply *reply = reply_;
  redisReply **el;
  (void)ac;
  if (reply == NULL || c->dying || r->closing)
    return;
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 3)
    return;
  el = reply->element;
  if (el[0]->type != REDIS_REPLY_STRING || el[1]->type != REDIS_REPLY_STRING)
    return;
  if (el[1]->len != strlen(r->channel) || memcmp(el[1]->str, r->channel, el[1]->len) != 0)
    return;
  if (el[0]->len == 9 && memcmp(el[0]->str, "subscribe", 9) == 0) {
    if (c->handshake_left == 0)
      conn_up(c);
    return;
  }
  if (el[0]->len == 7 && memcmp(el[0]->str, "message", 7) == 0) {
    char id[OSR_REDIS_ID_MAX + 1];
    if (el[2]->type != REDIS_REPLY_STRING || !osr_redis_id_is_valid(el[2]->str, el[2]->len)) {
      OSR_LOG_WARN(MOD, "ignoring malformed invalidation");
      return;
    }
    memcpy(id, el[2]->str, el[2]->len);
    id[el[2]->len] = '\0';
    r->sub_cb(id, r->sub_data);
  }
}

static int send_argv(conn_t *c, redisCallbackFn *fn, void *priv, int argc, const char **argv,
                     const size_t *lens)
{
  return redisAsyncCommandArgv(c->ac, fn, priv, argc, argv, lens) == REDIS_OK ? 0 : -1;
}

/* Create the context for `ip` (NULL: unix socket), attach it and queue the
 * handshake. hiredis queues commands before the connect completes. */
static void conn_connect(conn_t *c, const char *ip)
{
  osr_redis_t *r = c->r;
  redisAsyncContext *ac;
  const char *argv[3];
  size_t lens[3];
  int fail = 0;

  uv_once(&capped_once, capped_init);
  c->phase = CONN_CONNECTING;
  ac = r->unix_path != NULL ? redisAsyncConnectUnix(r->unix_path) : redisAsyncConnect(ip, r->port);
  if (ac == NULL) {
    conn_retry(c);
    return;
  }
  if (ac->err) {
    OSR_LOG_DEBUG(MOD, "connect: %s", ac->errstr);
    redisAsyncFree(ac); /* no adapter yet: freed synchronously, no hooks run */
    conn_retry(c);
    return;
  }
  if (redisLibuvAttach(ac, r->loop) != REDIS_OK) {
    /* The adapter installs its hooks before it can fail; without ev.data its
     * cleanup would dereference NULL. */
    ac->ev.cleanup = NULL;
    redisAsyncFree(ac);
    conn_retry(c);
    return;
  }
  ac->ev.addRead = hook_add_read;
  ac->ev.delRead = hook_del_read;
  ac->ev.addWrite = hook_add_write;
  ac->ev.delWrite = hook_del_write;
  ac->ev.cleanup = hook_cleanup;
  ac->data = c;
  ac->c.reader->maxbuf = OSR_REDIS_READER_MAXBUF;
  ac->c.reader->fn = &capped_fns;
  ac->c.reader->privdata = c;
  redisAsyncSetConnectCallback(ac, on_connect);
  redisAsyncSetDisconnectCallback(ac, on_disconnect);
  if (r->unix_path == NULL)
    (void)redisEnableKeepAlive(&ac->c); /* find half-open peers eventually */
  c->ac = ac;
  c->dying = 0;
  c->handshake_left = 0;

  if (r->password != NULL) {
    int n = 0;
    argv[n] = "AUTH";
    lens[n++] = 4;
    if (r->user != NULL) {
      argv[n] = r->user;
      lens[n++] = strlen(r->user);
    }
    argv[n] = r->password;
    lens[n++] = strlen(r->password);
    fail |= send_argv(c, handshake_cb, c, n, argv, lens);
    c->handshake_left++;
  }
  if (c->is_sub) {
    argv[0] = "SUBSCRIBE";
    lens[0] = 9;
    argv[1] = r->channel;
    lens[1] = strlen(r->channel);
    fail |= send_argv(c, sub_cb, c, 2, argv, lens);
  } else {
    char dbs[16];
    if (r->db != 0) {
      snprintf(dbs, sizeof(dbs), "%d", r->db);
      argv[0] = "SELECT";
      lens[0] = 6;
      argv[1] = dbs;
      lens[1] = strlen(dbs);
      fail |= send_argv(c, handshake_cb, c, 2, argv, lens);
      c->handshake_left++;
    }
    /* PING last: TCP accepting is not Redis answering (a stopped server
     * still completes handshakes from its backlog). */
    argv[0] = "PING";
    lens[0] = 4;
    fail |= send_argv(c, handshake_cb, c, 1, argv, lens);
    c->handshake_left++;
  }
  if (fail)
    conn_drop(c, "could not queue the handshake");
}

static void gai_cb(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
  conn_t *c = osr_container_of(req, conn_t, gai);
  osr_redis_t *r = c->r;
  char ip[64];
  int ok = 0;
  unsigned n = 0;
  struct addrinfo *ai;

  c->gai_active = 0;
  if (r->closing || c->phase != CONN_RESOLVING) {
    /* closed, or the connect timeout fired and already scheduled a retry */
    uv_freeaddrinfo(res);
    maybe_finish_close(r);
    return;
  }
  /* A name with several addresses (localhost: ::1 and 127.0.0.1) where
   * only one listens: each failed attempt moves on to the next address. */
  for (ai = status == 0 ? res : NULL; ai != NULL; ai = ai->ai_next)
    n++;
  if (n > 0) {
    ai = res;
    for (unsigned i = c->failures % n; i > 0; i--)
      ai = ai->ai_next;
    if (ai->ai_family == AF_INET)
      ok = uv_ip4_name((const struct sockaddr_in *)(const void *)ai->ai_addr, ip, sizeof(ip)) == 0;
    else if (ai->ai_family == AF_INET6)
      ok = uv_ip6_name((const struct sockaddr_in6 *)(const void *)ai->ai_addr, ip, sizeof(ip)) == 0;
  }
  uv_freeaddrinfo(res);
  if (!ok) {
    OSR_LOG_WARN(MOD, "cannot resolve %s: %s", r->host, status ? uv_strerror(status) : "no address");
    conn_retry(c);
    return;
  }
  conn_connect(c, ip);
}

static void connect_timeout_cb(uv_timer_t *t)
{
  conn_t *c = osr_container_of(t, conn_t, timer);
  if (c->phase == CONN_RESOLVING) {
    /* The resolver thread cannot be interrupted; its answer is ignored. */
    (void)uv_cancel((uv_req_t *)&c->gai);
    conn_retry(c);
  } else if (c->phase == CONN_CONNECTING) {
    conn_drop(c, "connect timeout"); /* hook_cleanup schedules the retry */
  }
}

static void backoff_cb(uv_timer_t *t)
{
  conn_start(osr_container_of(t, conn_t, timer));
}

static void conn_start(conn_t *c)
{
  osr_redis_t *r = c->r;
  struct addrinfo hints;
  struct in6_addr a6;
  int rv;

  if (r->closing || c->ac != NULL)
    return;
  if (c->gai_active) {
    /* a timed-out resolve has not come back yet */
    uv_timer_start(&c->timer, backoff_cb, c->backoff_ms, 0);
    return;
  }
  uv_timer_start(&c->timer, connect_timeout_cb, r->connect_timeout_ms, 0);
  if (r->unix_path != NULL || uv_inet_pton(AF_INET, r->host, &a6) == 0 ||
      uv_inet_pton(AF_INET6, r->host, &a6) == 0) {
    conn_connect(c, r->host);
    return;
  }
  /* Never let hiredis resolve: its getaddrinfo() blocks the loop. */
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  c->phase = CONN_RESOLVING;
  rv = uv_getaddrinfo(r->loop, &c->gai, gai_cb, r->host, NULL, &hints);
  if (rv != 0) {
    OSR_LOG_WARN(MOD, "cannot resolve %s: %s", r->host, uv_strerror(rv));
    conn_retry(c);
    return;
  }
  c->gai_active = 1;
}

/* No context exists: wait, then try again (capped exponential backoff). */
static void conn_retry(conn_t *c)
{
  c->phase = CONN_IDLE;
  c->failures++;
  uv_timer_stop(&c->timer);
  if (c->r->closing) {
    maybe_finish_close(c->r);
    return;
  }
  uv_timer_start(&c->timer, backoff_cb, c->backoff_ms, 0);
  c->backoff_ms = c->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : c->backoff_ms * 2;
}

static void conn_gone(conn_t *c, const char *err)
{
  if (c->phase == CONN_UP && !c->dropped && !c->r->closing)
    OSR_LOG_WARN(MOD, "%s connection lost: %s", c->is_sub ? "subscriber" : "command", err);
  c->ac = NULL;
  c->dying = 0;
  c->dropped = 0;
  c->over_cap = 0;
  c->handshake_left = 0;
  conn_retry(c);
}

/* ---- commands --------------------------------------------------------------- */

static void cmd_unlink(osr_redis_t *r, cmd_t *cmd)
{
  if (!cmd->linked)
    return;
  if (cmd->prev != NULL)
    cmd->prev->next = cmd->next;
  else
    r->head = cmd->next;
  if (cmd->next != NULL)
    cmd->next->prev = cmd->prev;
  else
    r->tail = cmd->prev;
  cmd->prev = cmd->next = NULL;
  cmd->linked = 0;
}

/* Answer the caller once; the cmd_t itself stays with hiredis if replies are
 * still due. `b` only for CMD_GET with status 0. */
static void cmd_answer(cmd_t *cmd, int status, const osr_binding_t *b)
{
  osr_redis_t *r = cmd->r;
  cmd_unlink(r, cmd);
  cmd->orphan = 1;
  if (cmd->kind == CMD_GET)
    cmd->cb.binding(status, status == 0 ? b : NULL, cmd->data);
  else if (cmd->kind == CMD_ACT_DRAIN)
    cmd->cb.activity(status, NULL, NULL, 0, cmd->data); /* errors only: see drain_answer */
  else
    cmd->cb.done(status, cmd->data);
}

static void cmd_timer_cb(uv_timer_t *t);

static void cmd_timer_arm(osr_redis_t *r)
{
  uint64_t now = uv_now(r->loop);
  uint64_t next = UINT64_MAX;
  if (r->closing) {
    uv_timer_stop(&r->cmd_timer);
    return;
  }
  if (r->head != NULL)
    next = r->head->deadline_ms;
  if (r->inflight > 0 && r->last_rx_ms + r->stall_ms < next)
    next = r->last_rx_ms + r->stall_ms;
  if (next == UINT64_MAX)
    uv_timer_stop(&r->cmd_timer);
  else
    uv_timer_start(&r->cmd_timer, cmd_timer_cb, next > now ? next - now : 0, 0);
}

/* Commands on one connection are answered in order and share one timeout,
 * so deadlines are in list order and one timer serves them all. */
static void cmd_timer_cb(uv_timer_t *t)
{
  osr_redis_t *r = osr_container_of(t, osr_redis_t, cmd_timer);
  uint64_t now = uv_now(r->loop);

  /* Re-read the head each time: a callback may close the client. */
  while (!r->closing && r->head != NULL && r->head->deadline_ms <= now)
    cmd_answer(r->head, OSR_ETIMEDOUT, NULL);
  if (r->closing)
    return;
  /* Replies owed but nothing heard for a long while: a hung server or a
   * half-open connection. Late replies would be dropped anyway, and the
   * orphans would pin max_inflight, so start over on a new connection. */
  if (r->inflight > 0 && now - r->last_rx_ms >= r->stall_ms)
    conn_drop(&r->cmd, "no reply within the stall limit");
  cmd_timer_arm(r);
}

static int reply_status(cmd_t *cmd, const redisReply *reply)
{
  switch (reply->type) {
  case REDIS_REPLY_ERROR:
    /* -LOADING, -OOM, -READONLY, -MISCONF...: Redis cannot serve us now. */
    return OSR_EUNAVAILABLE;
  case REDIS_REPLY_STATUS:
    return cmd->kind == CMD_PUT ? 0 : OSR_EPROTO;
  case REDIS_REPLY_INTEGER:
    return cmd->kind == CMD_INVALIDATE || cmd->kind == CMD_ACT_ADD ? 0 : OSR_EPROTO;
  case REDIS_REPLY_ARRAY:
    return cmd->kind == CMD_ACT_DRAIN ? 0 : OSR_EPROTO;
  case REDIS_REPLY_NIL:
    return cmd->kind == CMD_GET ? OSR_ENOTFOUND : OSR_EPROTO;
  case REDIS_REPLY_STRING:
    return cmd->kind == CMD_GET ? 0 : OSR_EPROTO;
  default:
    return OSR_EPROTO;
  }
}

static void drain_answer(cmd_t *cmd, const redisReply *reply);

static void reply_cb(redisAsyncContext *ac, void *reply_, void *privdata)
{
  cmd_t *cmd = privdata;
  osr_redis_t *r = cmd->r;
  redisReply *reply = reply_;
  osr_binding_t b;
  int st;
  (void)ac;

  r->inflight--;
  if (reply == NULL) {
    /* hiredis is tearing the context down: nothing may be sent on it any
     * more, even by the callbacks we are about to run. */
    r->cmd.dying = 1;
    st = r->closing ? OSR_ECANCELED : OSR_EUNAVAILABLE;
  } else {
    r->last_rx_ms = uv_now(r->loop);
    r->last_latency_us = (uv_hrtime() - cmd->sent_ns) / 1000;
    st = reply_status(cmd, reply);
  }
  if (cmd->status == 0)
    cmd->status = st;
  if (--cmd->replies_left > 0)
    return;
  if (cmd->orphan) {
    osr_free(cmd); /* late reply of a timed-out or cancelled command */
    return;
  }
  st = cmd->status;
  if (cmd->kind == CMD_GET && st == 0) {
    st = osr_binding_from_json(reply->str, reply->len, &b);
    if (st == OSR_EINVAL) {
      OSR_LOG_WARN(MOD, "ignoring a malformed cached binding");
      st = OSR_EPROTO;
    }
    cmd_answer(cmd, st, &b);
    if (st == 0)
      binding_free_docs(&b);
  } else if (cmd->kind == CMD_ACT_DRAIN && st == 0) {
    drain_answer(cmd, reply);
  } else {
    cmd_answer(cmd, st, NULL);
  }
  osr_free(cmd);
}

/* Checks shared by every command; `need` = hiredis replies it will cost. */
static int cmd_check(osr_redis_t *r, size_t need)
{
  if (r->closing)
    return OSR_ECLOSED;
  if (!conn_is_up(&r->cmd))
    return OSR_EUNAVAILABLE;
  if (r->inflight + need > r->max_inflight || sdslen(r->cmd.ac->c.obuf) > OSR_REDIS_OBUF_MAX)
    return OSR_EAGAIN;
  return 0;
}

static cmd_t *cmd_new(osr_redis_t *r, cmd_kind_t kind, void *data)
{
  cmd_t *cmd = osr_xcalloc(1, sizeof(*cmd));
  cmd->r = r;
  cmd->kind = kind;
  cmd->data = data;
  cmd->sent_ns = uv_hrtime();
  cmd->deadline_ms = uv_now(r->loop) + r->command_timeout_ms;
  return cmd;
}

/* Hand `cmd` to the caller's wait list once hiredis accepted `sent` commands. */
static void cmd_track(osr_redis_t *r, cmd_t *cmd, int sent)
{
  if (r->inflight == 0)
    r->last_rx_ms = uv_now(r->loop); /* the stall clock starts now */
  r->inflight += (size_t)sent;
  cmd->replies_left = sent;
  cmd->prev = r->tail;
  cmd->next = NULL;
  if (r->tail != NULL)
    r->tail->next = cmd;
  else
    r->head = cmd;
  r->tail = cmd;
  cmd->linked = 1;
  if (!uv_is_active((uv_handle_t *)&r->cmd_timer))
    cmd_timer_arm(r);
}

static size_t make_key(const osr_redis_t *r, const char *id, size_t id_len, char *key)
{
  memcpy(key, r->prefix, r->prefix_len);
  memcpy(key + r->prefix_len, "b:", 2);
  memcpy(key + r->prefix_len + 2, id, id_len);
  key[r->prefix_len + 2 + id_len] = '\0';
  return r->prefix_len + 2 + id_len;
}

int osr_redis_put_binding(osr_redis_t *r, const osr_binding_t *b, osr_redis_done_cb cb, void *data)
{
  char key[KEY_MAX];
  char ttl[24];
  const char *argv[5];
  size_t lens[5];
  char *json = NULL;
  cmd_t *cmd;
  int rv;

  if (r == NULL || b == NULL || cb == NULL)
    return OSR_EINVAL;
  if ((rv = cmd_check(r, 1)) != 0)
    return rv;
  if ((rv = osr_binding_to_json(b, &json)) != 0)
    return rv;
  snprintf(ttl, sizeof(ttl), "%llu", (unsigned long long)r->binding_ttl_ms);
  argv[0] = "SET";
  lens[0] = 3;
  argv[1] = key;
  lens[1] = make_key(r, b->id, strlen(b->id), key);
  argv[2] = json;
  lens[2] = strlen(json);
  argv[3] = "PX";
  lens[3] = 2;
  argv[4] = ttl;
  lens[4] = strlen(ttl);
  cmd = cmd_new(r, CMD_PUT, data);
  cmd->cb.done = cb;
  rv = send_argv(&r->cmd, reply_cb, cmd, 5, argv, lens);
  osr_free(json); /* hiredis copied the formatted command */
  if (rv != 0) {
    osr_free(cmd);
    return OSR_EUNAVAILABLE;
  }
  cmd_track(r, cmd, 1);
  return 0;
}

int osr_redis_get_binding(osr_redis_t *r, const char *id, osr_redis_binding_cb cb, void *data)
{
  char key[KEY_MAX];
  const char *argv[2];
  size_t lens[2];
  size_t n;
  cmd_t *cmd;
  int rv;

  if (r == NULL || id == NULL || cb == NULL)
    return OSR_EINVAL;
  n = strnlen(id, OSR_REDIS_ID_MAX + 1);
  if (!osr_redis_id_is_valid(id, n) || memchr(id, '*', n) != NULL)
    return OSR_EINVAL;
  if ((rv = cmd_check(r, 1)) != 0)
    return rv;
  argv[0] = "GET";
  lens[0] = 3;
  argv[1] = key;
  lens[1] = make_key(r, id, n, key);
  cmd = cmd_new(r, CMD_GET, data);
  cmd->cb.binding = cb;
  if (send_argv(&r->cmd, reply_cb, cmd, 2, argv, lens) != 0) {
    osr_free(cmd);
    return OSR_EUNAVAILABLE;
  }
  cmd_track(r, cmd, 1);
  return 0;
}

int osr_redis_invalidate(osr_redis_t *r, const char *id, osr_redis_done_cb cb, void *data)
{
  char key[KEY_MAX];
  const char *argv[3];
  size_t lens[3];
  size_t n;
  int all, sent = 0;
  cmd_t *cmd;
  int rv;

  if (r == NULL || id == NULL || cb == NULL)
    return OSR_EINVAL;
  n = strnlen(id, OSR_REDIS_ID_MAX + 1);
  if (!osr_redis_id_is_valid(id, n))
    return OSR_EINVAL;
  all = n == 1 && id[0] == '*';
  if ((rv = cmd_check(r, all ? 1 : 2)) != 0)
    return rv;
  cmd = cmd_new(r, CMD_INVALIDATE, data);
  cmd->cb.done = cb;
  /* "*" has no key of its own: it only tells every subscriber to flush. */
  if (!all) {
    argv[0] = "DEL";
    lens[0] = 3;
    argv[1] = key;
    lens[1] = make_key(r, id, n, key);
    if (send_argv(&r->cmd, reply_cb, cmd, 2, argv, lens) != 0) {
      osr_free(cmd);
      return OSR_EUNAVAILABLE;
    }
    sent++;
  }
  argv[0] = "PUBLISH";
  lens[0] = 7;
  argv[1] = r->channel;
  lens[1] = strlen(r->channel);
  argv[2] = id;
  lens[2] = n;
  if (send_argv(&r->cmd, reply_cb, cmd, 3, argv, lens) != 0) {
    if (sent == 0) {
      osr_free(cmd);
      return OSR_EUNAVAILABLE;
    }
    /* DEL is queued, so the callback is owed: report the lost PUBLISH. */
    cmd->status = OSR_EUNAVAILABLE;
  } else {
    sent++;
  }
  cmd_track(r, cmd, sent);
  return 0;
}

/* ---- activity (data plane -> gateway, docs/dataplane.md) -------------------
 * One hash, "<prefix>activity", field = sandbox id, value = unix ms of the
 * latest traffic. Both sides are Lua scripts so each is one atomic command:
 * the add keeps the larger value (several data planes report the same
 * sandbox; a late retry must not move time backwards) and the drain reads
 * and deletes at most `max` fields in one step, so two gateways draining at
 * once never both apply, nor both lose, a field. */

static const char act_add_lua[] =
    "for i=1,#ARGV,2 do "
    "local c=tonumber(redis.call('HGET',KEYS[1],ARGV[i]) or '0') "
    "if tonumber(ARGV[i+1])>c then redis.call('HSET',KEYS[1],ARGV[i],ARGV[i+1]) end "
    "end return #ARGV";
static const char act_drain_lua[] =
    "local a=redis.call('HGETALL',KEYS[1]) local n=math.min(#a,2*tonumber(ARGV[1])) "
    "local o={} for i=1,n,2 do o[#o+1]=a[i] o[#o+1]=a[i+1] redis.call('HDEL',KEYS[1],a[i]) end "
    "return o";

/* Cached bindings (SET by osr_redis_put_binding) get the new time too, so
 * a GET answered from the cache shows it: decoded and re-encoded with
 * Redis's cjson (the binding codec accepts any member order and escaping),
 * TTL kept, never moved backwards. The keys are built from ARGV[1], which
 * is fine on a single Redis (not on Redis Cluster, which OSR does not use). */
static const char act_cached_lua[] =
    "local n=0 for i=2,#ARGV,2 do "
    "local k=ARGV[1]..ARGV[i] local v=redis.call('GET',k) "
    "if v then local ok,o=pcall(cjson.decode,v) "
    "if ok and type(o)=='table' and type(o.last_activity_ms)=='number' "
    "and tonumber(ARGV[i+1])>o.last_activity_ms then "
    "o.last_activity_ms=tonumber(ARGV[i+1]) redis.call('SET',k,cjson.encode(o),'KEEPTTL') n=n+1 "
    "end end end return n";

static size_t act_key(const osr_redis_t *r, char *key)
{
  memcpy(key, r->prefix, r->prefix_len);
  memcpy(key + r->prefix_len, "activity", sizeof("activity"));
  return r->prefix_len + sizeof("activity") - 1;
}

static int act_send(osr_redis_t *r, int cached, const char *const *ids, const int64_t *ms, size_t n,
                    osr_redis_done_cb cb, void *data);

int osr_redis_activity_add(osr_redis_t *r, const char *const *ids, const int64_t *ms, size_t n,
                           osr_redis_done_cb cb, void *data)
{
  return act_send(r, 0, ids, ms, n, cb, data);
}

int osr_redis_activity_cached(osr_redis_t *r, const char *const *ids, const int64_t *ms, size_t n,
                              osr_redis_done_cb cb, void *data)
{
  return act_send(r, 1, ids, ms, n, cb, data);
}

static int act_send(osr_redis_t *r, int cached, const char *const *ids, const int64_t *ms, size_t n,
                    osr_redis_done_cb cb, void *data)
{
  if (r == NULL || ids == NULL || ms == NULL || cb == NULL || n == 0 ||
      n > OSR_REDIS_ACTIVITY_BATCH_MAX)
    return OSR_EINVAL;
  for (size_t i = 0; i < n; i++) {
    size_t l = strnlen(ids[i], OSR_REDIS_ID_MAX + 1);
    if (!osr_redis_id_is_valid(ids[i], l) || memchr(ids[i], '*', l) != NULL || ms[i] <= 0)
      return OSR_EINVAL;
  }
  int rv = cmd_check(r, 1);
  if (rv != 0)
    return rv;
  size_t argc = 4 + 2 * n;
  const char **argv = osr_xmalloc(argc * sizeof(*argv));
  size_t *lens = osr_xmalloc(argc * sizeof(*lens));
  char(*nums)[24] = osr_xmalloc(n * sizeof(*nums));
  char key[KEY_MAX];
  argv[0] = "EVAL";
  lens[0] = 4;
  if (cached) {
    /* No KEYS: ARGV[1] is the key prefix of cached bindings. */
    argv[1] = act_cached_lua;
    lens[1] = sizeof(act_cached_lua) - 1;
    argv[2] = "0";
    memcpy(key, r->prefix, r->prefix_len);
    memcpy(key + r->prefix_len, "b:", 3);
    lens[3] = r->prefix_len + 2;
  } else {
    argv[1] = act_add_lua;
    lens[1] = sizeof(act_add_lua) - 1;
    argv[2] = "1";
    lens[3] = act_key(r, key);
  }
  lens[2] = 1;
  argv[3] = key;
  for (size_t i = 0; i < n; i++) {
    snprintf(nums[i], sizeof(nums[i]), "%lld", (long long)ms[i]);
    argv[4 + 2 * i] = ids[i];
    lens[4 + 2 * i] = strlen(ids[i]);
    argv[5 + 2 * i] = nums[i];
    lens[5 + 2 * i] = strlen(nums[i]);
  }
  cmd_t *cmd = cmd_new(r, CMD_ACT_ADD, data);
  cmd->cb.done = cb;
  rv = send_argv(&r->cmd, reply_cb, cmd, (int)argc, argv, lens);
  osr_free(argv); /* hiredis copied the formatted command */
  osr_free(lens);
  osr_free(nums);
  if (rv != 0) {
    osr_free(cmd);
    return OSR_EUNAVAILABLE;
  }
  cmd_track(r, cmd, 1);
  return 0;
}

int osr_redis_activity_drain(osr_redis_t *r, size_t max, osr_redis_activity_cb cb, void *data)
{
  if (r == NULL || cb == NULL || max == 0 || max > OSR_REDIS_ACTIVITY_BATCH_MAX)
    return OSR_EINVAL;
  int rv = cmd_check(r, 1);
  if (rv != 0)
    return rv;
  char key[KEY_MAX], num[24];
  snprintf(num, sizeof(num), "%zu", max);
  const char *argv[5] = {"EVAL", act_drain_lua, "1", key, num};
  size_t lens[5] = {4, sizeof(act_drain_lua) - 1, 1, act_key(r, key), strlen(num)};
  cmd_t *cmd = cmd_new(r, CMD_ACT_DRAIN, data);
  cmd->cb.activity = cb;
  if (send_argv(&r->cmd, reply_cb, cmd, 5, argv, lens) != 0) {
    osr_free(cmd);
    return OSR_EUNAVAILABLE;
  }
  cmd_track(r, cmd, 1);
  return 0;
}

/* A successful drain: pairs of (id, ms), checked like everything that
 * comes over the network; bad pairs are skipped, not fatal. */
static void drain_answer(cmd_t *cmd, const redisReply *reply)
{
  size_t n = reply->elements / 2, k = 0;
  const char **ids = osr_xcalloc(n + 1, sizeof(*ids));
  int64_t *ms = osr_xcalloc(n + 1, sizeof(*ms));
  char(*store)[OSR_REDIS_ID_MAX + 1] = osr_xcalloc(n + 1, sizeof(*store));
  for (size_t i = 0; i < n; i++) {
    const redisReply *id = reply->element[2 * i], *v = reply->element[2 * i + 1];
    if (id->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING ||
        !osr_redis_id_is_valid(id->str, id->len) || v->len == 0 || v->len > 19)
      continue;
    char tmp[24], *end;
    memcpy(tmp, v->str, v->len);
    tmp[v->len] = '\0';
    long long x = strtoll(tmp, &end, 10);
    if (*end != '\0' || x <= 0)
      continue;
    memcpy(store[k], id->str, id->len);
    store[k][id->len] = '\0';
    ids[k] = store[k];
    ms[k] = x;
    k++;
  }
  cmd_unlink(cmd->r, cmd);
  cmd->orphan = 1;
  cmd->cb.activity(0, ids, ms, k, cmd->data);
  osr_free(ids);
  osr_free(ms);
  osr_free(store);
}

int osr_redis_subscribe(osr_redis_t *r, osr_redis_invalidate_cb cb, void *data)
{
  if (r == NULL || cb == NULL)
    return OSR_EINVAL;
  if (r->closing)
    return OSR_ECLOSED;
  if (r->sub_cb != NULL)
    return OSR_EBUSY;
  r->sub_cb = cb;
  r->sub_data = data;
  r->sub.enabled = 1;
  conn_start(&r->sub);
  return 0;
}

int osr_redis_is_connected(const osr_redis_t *r)
{
  return r != NULL && !r->closing && conn_is_up(&r->cmd);
}

uint64_t osr_redis_last_latency_us(const osr_redis_t *r)
{
  return r != NULL ? r->last_latency_us : 0;
}

/* ---- URL ------------------------------------------------------------------- */

static int parse_uint(const char *s, size_t n, unsigned long max, unsigned long *out)
{
  unsigned long v = 0;
  if (n == 0 || n > 10)
    return -1;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return -1;
    v = v * 10 + (unsigned long)(s[i] - '0');
  }
  if (v > max)
    return -1;
  *out = v;
  return 0;
}

/* redis://[[user]:password@]host[:port][/db] (host may be [v6]) or
 * unix:/path. No percent-decoding; rediss:// (TLS) is not supported. */
static int parse_url(osr_redis_t *r, const char *url)
{
  const char *p, *end, *at, *hs, *he, *ps = NULL;
  unsigned long v;

  if (strncmp(url, "unix:", 5) == 0) {
    p = url + 5;
    if (strncmp(p, "//", 2) == 0)
      p += 2;
    if (p[0] != '/' || strlen(p) >= 108) /* sun_path */
      return OSR_EINVAL;
    r->unix_path = osr_xstrdup(p);
    return 0;
  }
  if (strncmp(url, "redis://", 8) != 0)
    return OSR_EINVAL;
  p = url + 8;
  end = p + strcspn(p, "/");
  at = memchr(p, '@', (size_t)(end - p));
  if (at != NULL) {
    const char *colon = memchr(p, ':', (size_t)(at - p));
    if (colon == NULL || at == colon + 1)
      return OSR_EINVAL; /* "user@" alone is ambiguous */
    if (colon > p)
      r->user = osr_xstrndup(p, (size_t)(colon - p));
    r->password = osr_xstrndup(colon + 1, (size_t)(at - colon - 1));
    p = at + 1;
  }
  if (*p == '[') {
    hs = p + 1;
    he = memchr(hs, ']', (size_t)(end - hs));
    if (he == NULL)
      return OSR_EINVAL;
    p = he + 1;
  } else {
    hs = p;
    he = hs + strcspn(hs, ":/");
    if (he > end)
      he = end;
    p = he;
  }
  if (he == hs || (size_t)(he - hs) > 255)
    return OSR_EINVAL;
  r->port = 6379;
  if (p < end && *p == ':') {
    ps = p + 1;
    if (parse_uint(ps, (size_t)(end - ps), 65535, &v) != 0 || v == 0)
      return OSR_EINVAL;
    r->port = (int)v;
  } else if (p != end) {
    return OSR_EINVAL;
  }
  r->host = osr_xstrndup(hs, (size_t)(he - hs));
  if (*end == '/' && end[1] != '\0') {
    if (parse_uint(end + 1, strlen(end + 1), 100000, &v) != 0)
      return OSR_EINVAL;
    r->db = (int)v;
  }
  return 0;
}

/* ---- lifecycle ------------------------------------------------------------- */

static void redis_free(osr_redis_t *r)
{
  osr_free(r->host);
  osr_free(r->unix_path);
  osr_free(r->user);
  osr_free(r->password);
  osr_free(r);
}

static void conn_init(osr_redis_t *r, conn_t *c, int is_sub)
{
  c->r = r;
  c->is_sub = is_sub;
  c->phase = CONN_IDLE;
  c->backoff_ms = BACKOFF_MIN_MS;
  uv_timer_init(r->loop, &c->timer);
}

int osr_redis_new(uv_loop_t *loop, const osr_redis_opts_t *opts, osr_redis_t **out)
{
  osr_redis_t *r;
  const char *prefix;

  if (out == NULL)
    return OSR_EINVAL;
  *out = NULL;
  if (loop == NULL || opts == NULL || opts->url == NULL)
    return OSR_EINVAL;
  prefix = opts->prefix != NULL ? opts->prefix : "osr:";
  if (strlen(prefix) > PREFIX_MAX)
    return OSR_EINVAL;

  r = osr_xcalloc(1, sizeof(*r));
  r->loop = loop;
  if (parse_url(r, opts->url) != 0) {
    redis_free(r);
    return OSR_EINVAL;
  }
  r->prefix_len = strlen(prefix);
  memcpy(r->prefix, prefix, r->prefix_len + 1);
  snprintf(r->channel, sizeof(r->channel), "%sinvalidate", prefix);
  r->connect_timeout_ms = opts->connect_timeout_ms ? opts->connect_timeout_ms : 1000;
  r->command_timeout_ms = opts->command_timeout_ms ? opts->command_timeout_ms : 500;
  r->max_inflight = opts->max_inflight ? opts->max_inflight : 10000;
  r->binding_ttl_ms = opts->binding_ttl_ms ? opts->binding_ttl_ms : 300000;
  r->stall_ms = r->command_timeout_ms * 4 > 2000 ? r->command_timeout_ms * 4 : 2000;
  conn_init(r, &r->cmd, 0);
  conn_init(r, &r->sub, 1);
  uv_timer_init(loop, &r->cmd_timer);
  conn_start(&r->cmd);
  *out = r;
  return 0;
}

static void handle_closed(uv_handle_t *h)
{
  osr_redis_t *r = h->data;
  void (*cb)(void *data);
  void *data;
  if (--r->handles_left > 0)
    return;
  cb = r->close_cb;
  data = r->close_data;
  redis_free(r);
  if (cb != NULL)
    cb(data);
}

/* The last step: only once hiredis let go of both contexts and no resolver
 * request is out do we close our own handles, and free in the last callback. */
static void maybe_finish_close(osr_redis_t *r)
{
  if (!r->closing || r->handles_left > 0)
    return;
  if (r->cmd.ac != NULL || r->sub.ac != NULL || r->cmd.gai_active || r->sub.gai_active)
    return;
  r->handles_left = 3;
  r->cmd.timer.data = r;
  r->sub.timer.data = r;
  r->cmd_timer.data = r;
  uv_close((uv_handle_t *)&r->cmd.timer, handle_closed);
  uv_close((uv_handle_t *)&r->sub.timer, handle_closed);
  uv_close((uv_handle_t *)&r->cmd_timer, handle_closed);
}

void osr_redis_close(osr_redis_t *r, void (*cb)(void *data), void *data)
{
  conn_t *conns[2];
  if (r == NULL || r->closing)
    return;
  r->closing = 1;
  r->close_cb = cb;
  r->close_data = data;
  /* Callers first: their callbacks run before anything is torn down, and a
   * callback that calls back in gets OSR_ECLOSED. */
  while (r->head != NULL)
    cmd_answer(r->head, OSR_ECANCELED, NULL);
  uv_timer_stop(&r->cmd_timer);
  conns[0] = &r->cmd;
  conns[1] = &r->sub;
  for (int i = 0; i < 2; i++) {
    conn_t *c = conns[i];
    uv_timer_stop(&c->timer);
    if (c->gai_active)
      (void)uv_cancel((uv_req_t *)&c->gai);
    /* Orphans still queued in hiredis get their NULL replies here and are
     * freed; hook_cleanup then clears c->ac. */
    conn_drop(c, NULL);
  }
  maybe_finish_close(r);
}
