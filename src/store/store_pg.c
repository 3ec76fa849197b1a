/*
 * PostgreSQL backend of the binding store: the SQL layer of store_int.h over
 * libpq, one connection per worker thread (the pool).
 *
 * URL: postgres://user[:pass]@host[:port]/db[?pool=N&binding_commit=relaxed|sync&<libpq
 * parameters>] (postgresql:// too). pool=N (1..16, default 2) and
 * binding_commit (default relaxed: see osr_store_update_opts_t.relaxed;
 * sync makes every commit wait for the disk) are ours and removed before
 * the URI reaches libpq; every other parameter is passed through. Unless the
 * URL says otherwise we add connect_timeout=2 (libpq's minimum) and TCP
 * keepalives, so a vanished server is noticed instead of hanging a worker.
 *
 * Failing fast while the server is down. Connecting is done with
 * PQconnectStart/PQconnectPoll under our own 1-second deadline (libpq's
 * connect_timeout cannot go below 2 s); a failed connect opens the store's
 * circuit (store.c), so requests queued behind it fail at once. On loopback a
 * stopped server refuses the connection immediately, so calls answer
 * OSR_EUNAVAILABLE in about a millisecond.
 *
 * Reconnecting: a connection found broken is dropped (db_disconnect) and the
 * next batch connects again, re-preparing statements lazily since prepared
 * statements belong to a connection.
 *
 * Round trips. A statement whose result nobody needs at once (BEGIN, and
 * every cached statement run without asking for its row count: the audit
 * insert, metadata rows) is sent in libpq pipeline mode and not waited for;
 * the next statement that needs an answer (or COMMIT) sends itself after
 * them, then one Sync collects every result in order. A transaction whose
 * statements' rows are read only after it commits (a batch of a create's
 * intents, BEGIN, INSERT ... RETURNING, COMMIT; or of its binding updates,
 * BEGIN, UPDATE ... RETURNING with the audit row inside, COMMIT: store.c "a
 * transaction in one flush") goes in one flush and costs one round trip
 * (pg_query_commit); any other costs one per statement whose answer is
 * needed, plus the COMMIT.
 * An error in a deferred statement surfaces at that collection; the
 * server has then skipped everything after it up to the Sync (COMMIT
 * included), so nothing was committed and the store core's per-request
 * retry isolates the bad request as before.
 *
 * Several gateways on one database: the partial unique index on (tenant,
 * idem_key) decides concurrent creates with one key; INSERT ... ON CONFLICT
 * DO NOTHING waits for the other transaction and then does nothing, and the
 * SELECT that follows (READ COMMITTED: a fresh snapshot per statement) sees
 * the winner's row. Migrations take a transaction-scoped advisory lock, so
 * two gateways starting together apply each version once.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "store/store_int.h"
#include "util/log.h"
#include "util/mem.h"

#define CONNECT_DEADLINE_MS 1000
#define MAX_ARGS 48
#define POOL_DEFAULT 2
#define POOL_MAX 16
/* Results outstanding in one pipeline before we collect anyway (bounds
 * what the server and libpq buffer for us, STYLE 13). */
#define PIPE_MAX 1024
/* Arbitrary but fixed: every OSR gateway must use the same key. */
#define MIGRATE_LOCK_KEY "7306151"

typedef struct pg_db_s {
  osr_store_t *st;
  PGconn *c;
  unsigned char prepared[OSR__ST_COUNT];
  PGresult *res;          /* result being read by row_next */
  int row;
  /* After pg_query_commit: every statement's result (res is one of them). */
  PGresult *kept[OSR__STORE_FLUSH_MAX];
  int nkept;
  /* Pipelining (see "Round trips" below): in libpq pipeline mode with
   * `pending` statements sent whose results are not read yet. */
  int pipe;
  int pending;
  short slot_prep[PIPE_MAX]; /* per pending result: the statement a Parse
                                prepares, or -1 for an execution */
} pg_db_t;

static pg_db_t *P(osr__db_t *db)
{
  return (pg_db_t *)(void *)db;
}

/* libpq's messages span lines ("...failed: Connection refused\n\tIs the
 * server running..."); one log line each is easier to read and grep. */
static void one_line(char *dst, size_t cap, const char *src)
{
  size_t n = 0;
  for (; src != NULL && *src != '\0' && n + 1 < cap; src++)
    dst[n++] = (*src == '\n' || *src == '\t') ? ' ' : *src;
  while (n > 0 && dst[n - 1] == ' ')
    n--;
  dst[n] = '\0';
}

/* Server notices ("relation already exists, skipping") are not errors. */
static void on_notice(void *arg, const char *message)
{
  (void)arg;
  (void)message;
}

/* ---- URL ------------------------------------------------------------------------ */

static int has_param(const char *params, const char *name)
{
  size_t n = strlen(name);
  const char *p = params;
  while (p != NULL && *p != '\0') {
    if (strncmp(p, name, n) == 0 && p[n] == '=')
      return 1;
    p = strchr(p, '&');
    if (p != NULL)
      p++;
  }
  return 0;
}

#if defined(OSR_TLS_BORINGSSL)
static int has_param_value(const char *params, const char *name, const char *value)
{
  size_t n = strlen(name), vn = strlen(value);
  const char *p = params;
  while (p != NULL && *p != '\0') {
    if (strncmp(p, name, n) == 0 && p[n] == '=' && strncmp(p + n + 1, value, vn) == 0 &&
        (p[n + 1 + vn] == '&' || p[n + 1 + vn] == '\0'))
      return 1;
    p = strchr(p, '&');
    if (p != NULL)
      p++;
  }
  return 0;
}
#endif

/* Append to a bounded buffer; once full, *len passes cap and stays there
 * (the caller checks len < cap) instead of writing past the end. */
static void kappend(char *buf, size_t cap, size_t *len, const char *fmt, ...) OSR_PRINTF(4, 5);
static void kappend(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
  va_list ap;
  int n;
  if (*len >= cap)
    return;
  va_start(ap, fmt);
  n = vsnprintf(buf + *len, cap - *len, fmt, ap);
  va_end(ap);
  *len = n < 0 ? cap : *len + (size_t)n;
}

static int pg_configure(osr_store_t *st, const char *url)
{
  osr__store_cfg_t *cfg = osr__store_cfg_mut(st);
  const char *q = strchr(url, '?');
  size_t base_len = q != NULL ? (size_t)(q - url) : strlen(url);
  size_t cap = strlen(url) + 512; /* our defaults add < 300 bytes */
  char *out = osr_xmalloc(cap), *kept = osr_xmalloc(cap);
  const char *p;
  size_t klen = 0;
  char *errmsg = NULL;
  PQconninfoOption *opts;
  int rv = 0;

  cfg->pool = POOL_DEFAULT;
  kept[0] = '\0';
  /* Keep every parameter but ours. */
  for (p = q != NULL ? q + 1 : NULL; p != NULL && *p != '\0';) {
    const char *amp = strchr(p, '&');
    size_t n = amp != NULL ? (size_t)(amp - p) : strlen(p);
    if (n > 5 && strncmp(p, "pool=", 5) == 0) {
      char num[8];
      char *end;
      long v;
      if (n - 5 >= sizeof(num)) {
        rv = OSR_EINVAL;
        break;
      }
      memcpy(num, p + 5, n - 5);
      num[n - 5] = '\0';
      v = strtol(num, &end, 10);
      if (*end != '\0' || v < 1 || v > POOL_MAX) {
        rv = OSR_EINVAL;
        break;
      }
      cfg->pool = (int)v;
    } else if (n > 15 && strncmp(p, "binding_commit=", 15) == 0) {
      if (n == 19 && strncmp(p + 15, "sync", 4) == 0) {
        cfg->strict_bindings = 1;
      } else if (n == 22 && strncmp(p + 15, "relaxed", 7) == 0) {
        cfg->strict_bindings = 0;
      } else {
        rv = OSR_EINVAL;
        break;
      }
    } else if (n > 0) {
      kappend(kept, cap, &klen, "%s%.*s", klen > 0 ? "&" : "", (int)n, p);
    }
    p = amp != NULL ? amp + 1 : NULL;
  }
  if (rv == 0) {
    static const char *const defaults[][2] = {
      {"connect_timeout", "2"}, {"keepalives", "1"}, {"keepalives_idle", "10"},
      {"keepalives_interval", "2"}, {"keepalives_count", "3"}, {"tcp_user_timeout", "10000"},
      {"application_name", "osr-gateway"},
      /* No statement of ours runs long; one that does is waiting on
       * something broken. "-c statement_timeout=10000", URI-encoded. */
      {"options", "-c%20statement_timeout%3D10000"},
    };
    size_t i;
#if defined(OSR_TLS_BORINGSSL)
    /* Debian's libpq links OpenSSL 3 while this build links BoringSSL: both
     * export the same SSL_* symbols into one process, so libpq's TLS code
     * would run against BoringSSL's. Keep libpq away from TLS entirely and
     * refuse URLs that demand it (build with -Dtls=openssl for TLS to
     * PostgreSQL, or reach it over a private network / unix socket). */
    if (has_param(kept, "sslmode") && !has_param_value(kept, "sslmode", "disable")) {
      OSR_LOG_WARN("store", "postgres: sslmode other than disable needs an OSR build with "
                            "-Dtls=openssl (libpq uses OpenSSL; this build uses BoringSSL)");
      osr_free(kept);
      osr_free(out);
      return OSR_EINVAL;
    }
    if (!has_param(kept, "sslmode"))
      kappend(kept, cap, &klen, "%ssslmode=disable", klen > 0 ? "&" : "");
#endif
    for (i = 0; i < OSR_ARRAY_SIZE(defaults); i++)
      if (!has_param(kept, defaults[i][0]))
        kappend(kept, cap, &klen, "%s%s=%s", klen > 0 ? "&" : "", defaults[i][0], defaults[i][1]);
    if (klen >= cap || (size_t)snprintf(out, cap, "%.*s?%s", (int)base_len, url, kept) >= cap) {
      osr_free(kept);
      osr_free(out);
      return OSR_EINVAL; /* cannot happen with the cap above; never pass a cut URI */
    }
    /* Let libpq judge the URI now, so a typo is OSR_EINVAL from open and
     * not an endless stream of "unavailable". */
    opts = PQconninfoParse(out, &errmsg);
    if (opts == NULL) {
      char msg[256];
      one_line(msg, sizeof(msg), errmsg != NULL ? errmsg : "out of memory");
      OSR_LOG_WARN("store", "postgres: bad URL: %s", msg);
      rv = OSR_EINVAL;
    } else {
      PQconninfoFree(opts);
    }
    if (errmsg != NULL)
      PQfreemem(errmsg);
  }
  osr_free(kept);
  if (rv != 0) {
    osr_free(out);
    return rv;
  }
  cfg->target = out;
  return 0;
}

/* ---- connections ----------------------------------------------------------------- */

static osr__db_t *pg_db_new(osr_store_t *st)
{
  pg_db_t *d = osr_xcalloc(1, sizeof(*d));
  d->st = st;
  return (osr__db_t *)(void *)d;
}

/* The background reader is one more connection like the others. */
static int pg_has_reader(const osr_store_t *st)
{
  (void)st;
  return 1;
}

/* Free the result being read and, after pg_query_commit, all of its
 * statements' results (res is one of them then). */
static void results_clear(pg_db_t *d)
{
  int i;
  if (d->nkept == 0 && d->res != NULL)
    PQclear(d->res);
  for (i = 0; i < d->nkept; i++)
    PQclear(d->kept[i]);
  d->nkept = 0;
  d->res = NULL;
  d->row = -1;
}

static void pg_disconnect(osr__db_t *db)
{
  pg_db_t *d = P(db);
  results_clear(d);
  if (d->c != NULL)
    PQfinish(d->c);
  d->c = NULL;
  d->pipe = 0;
  d->pending = 0;
  memset(d->prepared, 0, sizeof(d->prepared));
}

static void pg_db_free(osr__db_t *db)
{
  pg_disconnect(db);
  osr_free(db);
}

static int pg_is_connected(osr__db_t *db)
{
  return P(db)->c != NULL;
}

static int pg_connect(osr__db_t *db)
{
  pg_db_t *d = P(db);
  PostgresPollingStatusType ps = PGRES_POLLING_WRITING;
  int64_t deadline = osr__store_mono_ms() + CONNECT_DEADLINE_MS;
  const char *why = NULL;

  if (d->c != NULL)
    return 0;
  d->c = PQconnectStart(osr__store_cfg(d->st)->target);
  if (d->c == NULL)
    return OSR_EUNAVAILABLE;
  if (PQstatus(d->c) == CONNECTION_BAD)
    ps = PGRES_POLLING_FAILED;
  while (ps != PGRES_POLLING_OK) {
    struct pollfd pfd;
    int64_t left = deadline - osr__store_mono_ms();
    int n;
    if (ps == PGRES_POLLING_FAILED) {
      why = PQerrorMessage(d->c);
      break;
    }
    if (left <= 0) {
      why = "connect timed out";
      break;
    }
    pfd.fd = PQsocket(d->c);
    pfd.events = ps == PGRES_POLLING_READING ? POLLIN : POLLOUT;
    pfd.revents = 0;
    n = poll(&pfd, 1, (int)left);
    if (n < 0 && errno != EINTR) {
      why = "poll failed";
      break;
    }
    if (n > 0)
      ps = PQconnectPoll(d->c);
  }
  if (ps != PGRES_POLLING_OK) {
    char msg[256];
    one_line(msg, sizeof(msg), why);
    OSR_LOG_WARN("store", "postgres: connect failed: %s", msg);
    pg_disconnect(db);
    return OSR_EUNAVAILABLE;
  }
  PQsetNoticeProcessor(d->c, on_notice, NULL);
  memset(d->prepared, 0, sizeof(d->prepared));
  return 0;
}

/* ---- statements ----------------------------------------------------------------- */

static int classify(pg_db_t *d, PGresult *res, const char *what)
{
  const char *state = res != NULL ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

  if (d->c == NULL || PQstatus(d->c) == CONNECTION_BAD || state == NULL)
    return OSR_EUNAVAILABLE;
  if (strcmp(state, "23505") == 0)
    return OSR_ECONFLICT;
  if (strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0)
    return OSR_EAGAIN;
  /* Data exceptions (e.g. 22021: bytes that are not UTF-8) are about this
   * request's values: it alone fails, with OSR_EINVAL. */
  if (strncmp(state, "22", 2) == 0)
    return OSR_EINVAL;
  /* Connection exceptions, shutdown/crash of the server, resource limits. */
  if (strncmp(state, "08", 2) == 0 || strncmp(state, "57P", 3) == 0 || strncmp(state, "53", 2) == 0 ||
      strncmp(state, "58", 2) == 0)
    return OSR_EUNAVAILABLE;
  {
    char msg[256];
    one_line(msg, sizeof(msg), PQresultErrorMessage(res));
    OSR_LOG_WARN("store", "postgres: %s: %s %s", what, state, msg);
  }
  return OSR__EDB;
}

/* Enter pipeline mode unless already in it. */
static int pipe_enter(pg_db_t *d)
{
  if (d->pipe)
    return 0;
  if (PQenterPipelineMode(d->c) != 1)
    return OSR_EUNAVAILABLE;
  d->pipe = 1;
  d->pending = 0;
  return 0;
}

/* Sync and read every result sent since pipe_enter, in order, then leave
 * pipeline mode. The results in slots keep[0 .. nkeep-1] (0-based since
 * pipe_enter, ascending) are handed to the caller in out[] (which then owns
 * them) when every result is a success; all others are only checked. The
 * first failure is what counts: results after it are PGRES_PIPELINE_ABORTED
 * (the server skipped them). A result missing where one must be means the
 * connection is gone. */
static int pipe_collect_kept(pg_db_t *d, const int *keep, int nkeep, PGresult **out)
{
  int err = 0, i, j = 0, n = d->pending;

  for (i = 0; i < nkeep; i++)
    out[i] = NULL;
  if (PQpipelineSync(d->c) != 1) {
    d->pipe = 0;
    d->pending = 0;
    return OSR_EUNAVAILABLE;
  }
  for (i = 0; i < n; i++) {
    PGresult *res = PQgetResult(d->c), *end;
    if (res == NULL) {
      err = OSR_EUNAVAILABLE;
      break;
    }
    ExecStatusType st = PQresultStatus(res);
    int kept = j < nkeep && keep[j] == i;
    if (d->slot_prep[i] >= 0 && st != PGRES_COMMAND_OK)
      d->prepared[d->slot_prep[i]] = 0; /* failed or skipped: not there */
    if (kept && err == 0 && (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)) {
      out[j] = res;
    } else {
      if (err == 0 && st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
        err = st == PGRES_PIPELINE_ABORTED ? OSR__EDB : classify(d, res, "exec");
      PQclear(res);
    }
    j += kept;
    /* Each statement's results end with a NULL. */
    while ((end = PQgetResult(d->c)) != NULL)
      PQclear(end);
  }
  if (err != OSR_EUNAVAILABLE) {
    PGresult *sync = PQgetResult(d->c);
    if (sync == NULL || PQresultStatus(sync) != PGRES_PIPELINE_SYNC)
      err = OSR_EUNAVAILABLE;
    PQclear(sync);
  }
  if (err == OSR_EUNAVAILABLE || PQexitPipelineMode(d->c) != 1)
    err = OSR_EUNAVAILABLE; /* the caller drops the connection */
  d->pipe = 0;
  d->pending = 0;
  for (i = 0; err != 0 && i < nkeep; i++) {
    PQclear(out[i]);
    out[i] = NULL;
  }
  return err;
}

/* pipe_collect_kept keeping at most one result: slot `keep` (-1: the last
 * one) in *last, unless `last` is NULL. */
static int pipe_collect(pg_db_t *d, int keep, PGresult **last)
{
  int slot = keep < 0 ? d->pending - 1 : keep;
  PGresult *unused;
  return pipe_collect_kept(d, &slot, last != NULL ? 1 : 0, last != NULL ? last : &unused);
}

/* Send one statement into the pipeline (preparing it first if needed). */
static int pipe_send(pg_db_t *d, int stmt, const char *sql, int nargs, const char *const *vals)
{
  char name[16];
  int rv = 0;

  if (d->pipe && d->pending + 2 > PIPE_MAX)
    rv = pipe_collect(d, -1, NULL);
  if (rv == 0)
    rv = pipe_enter(d);
  if (rv != 0)
    return rv;
  if (stmt <= OSR__ST_RELAX && stmt >= 0) {
    const char *text = stmt == OSR__ST_BEGIN   ? osr__store_pg.begin_sql
                       : stmt == OSR__ST_RELAX ? osr__store_pg.relax_sql
                                               : osr__stmt_sql[stmt];
    if (PQsendQueryParams(d->c, text, 0, NULL, NULL, NULL, NULL, 0) != 1)
      return OSR_EUNAVAILABLE;
  } else if (stmt < 0 || stmt == OSR__ST_B_UPDATE_ROWS || stmt == OSR__ST_B_UPDATE_ROWS_AUDIT) {
    /* Planned at every execution, not prepared: the multi-row UPDATE is a
     * join, and a prepared statement's generic plan, made while the table
     * was small, joined by a sequential scan of bindings (hash join) and
     * kept doing so as the table grew (4.7 ms per batch at 6,000 rows).
     * Planned with the table's current size it probes the primary key per
     * row; one plan per batch is cheap next to that. */
    if (PQsendQueryParams(d->c, stmt < 0 ? sql : osr__stmt_sql[stmt], nargs, NULL, vals, NULL,
                          NULL, 0) != 1)
      return OSR_EUNAVAILABLE;
  } else {
    snprintf(name, sizeof(name), "osr_%d", stmt);
    if (!d->prepared[stmt]) {
      if (PQsendPrepare(d->c, name, osr__stmt_sql[stmt], nargs, NULL) != 1)
        return OSR_EUNAVAILABLE;
      /* Marked now, unmarked by pipe_collect if the Parse fails or is
       * skipped after an earlier error. */
      d->slot_prep[d->pending++] = (short)stmt;
      d->prepared[stmt] = 1;
    }
    if (PQsendQueryPrepared(d->c, name, nargs, vals, NULL, NULL, 0) != 1)
      return OSR_EUNAVAILABLE;
  }
  d->slot_prep[d->pending++] = -1;
  return 0;
}

/* An array parameter (osr__sql_arg_t.elems) in PostgreSQL's array input
 * syntax: text elements double-quoted with '"' and '\\' escaped (any other
 * byte, braces and commas included, stands for itself inside the quotes),
 * integers bare, NULL unquoted. Heap text, freed by the caller. */
static char *array_text(const osr__sql_arg_t *a)
{
  size_t cap = 3, len = 0;
  char *out;
  int i;

  for (i = 0; i < a->nelems; i++) {
    const osr__sql_arg_t *e = &a->elems[i];
    cap += 1 + (e->is_int ? 21 : e->s == NULL ? 4 : 2 + 2 * strlen(e->s));
  }
  out = osr_xmalloc(cap);
  out[len++] = '{';
  for (i = 0; i < a->nelems; i++) {
    const osr__sql_arg_t *e = &a->elems[i];
    const char *p;
    if (i > 0)
      out[len++] = ',';
    if (e->is_int) {
      len += (size_t)snprintf(out + len, cap - len, "%" PRId64, e->i);
    } else if (e->s == NULL) {
      memcpy(out + len, "NULL", 4);
      len += 4;
    } else {
      out[len++] = '"';
      for (p = e->s; *p != '\0'; p++) {
        if (*p == '"' || *p == '\\')
          out[len++] = '\\';
        out[len++] = *p;
      }
      out[len++] = '"';
    }
  }
  out[len++] = '}';
  out[len] = '\0';
  return out;
}

/* Run a statement: deferred into the pipeline when `defer` (no result
 * wanted now), else sent after whatever is pending and collected with it.
 * Returns the statement's result (NULL when deferred or on error). */
static PGresult *run(pg_db_t *d, int stmt, const char *sql, const osr__sql_arg_t *args, int nargs,
                     int defer, int *err)
{
  const char *vals[MAX_ARGS] = {NULL}; /* gcc -O3 warns otherwise (inlined, nargs unknown) */
  char nums[MAX_ARGS][24];
  char *arrays[MAX_ARGS];
  PGresult *res = NULL;
  int i, narrays = 0;

  *err = 0;
  if (d->c == NULL) {
    *err = OSR_EUNAVAILABLE;
    return NULL;
  }
  if (nargs > MAX_ARGS) {
    *err = OSR__EDB;
    return NULL;
  }
  for (i = 0; i < nargs; i++) {
    if (args[i].elems != NULL) {
      arrays[narrays] = array_text(&args[i]);
      vals[i] = arrays[narrays++];
    } else if (args[i].is_int) {
      snprintf(nums[i], sizeof(nums[i]), "%" PRId64, args[i].i);
      vals[i] = nums[i];
    } else {
      vals[i] = args[i].s; /* NULL is SQL NULL */
    }
  }
  if (stmt < 0 && !d->pipe) {
    /* Dynamic text outside a pipeline (migrations: possibly several
     * statements in one string, which only the simple protocol takes). */
    res = nargs == 0 ? PQexec(d->c, sql) : PQexecParams(d->c, sql, nargs, NULL, vals, NULL, NULL, 0);
  } else {
    /* libpq copies the values into its output buffer: the arrays' texts
     * may go as soon as the statement is sent. */
    *err = pipe_send(d, stmt, sql, nargs, vals);
    for (i = 0; i < narrays; i++)
      osr_free(arrays[i]);
    narrays = 0;
    if (*err == 0 && !defer)
      *err = pipe_collect(d, -1, &res);
    if (*err == OSR_EUNAVAILABLE)
      pg_disconnect((osr__db_t *)(void *)d);
  }
  for (i = 0; i < narrays; i++)
    osr_free(arrays[i]);
  return res;
}

static int pg_exec(osr__db_t *db, int stmt, const char *sql, const osr__sql_arg_t *args, int nargs,
                   int64_t *changes)
{
  pg_db_t *d = P(db);
  int err;
  /* Nothing to wait for: BEGIN, and cached statements whose row count
   * nobody asked for. COMMIT and ROLLBACK always collect. */
  int defer = stmt == OSR__ST_BEGIN || (stmt > OSR__ST_ROLLBACK && changes == NULL);
  PGresult *res = run(d, stmt, sql, args, nargs, defer, &err);
  ExecStatusType s;

  if (err != 0 || (defer && res == NULL))
    return err;
  s = res != NULL ? PQresultStatus(res) : PGRES_FATAL_ERROR;
  if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) {
    err = classify(d, res, "exec");
    PQclear(res);
    return err;
  }
  if (changes != NULL) {
    const char *t = PQcmdTuples(res);
    *changes = t != NULL && *t != '\0' ? strtoll(t, NULL, 10) : 0;
  }
  PQclear(res);
  return 0;
}

static int pg_query(osr__db_t *db, int stmt, const char *sql, const osr__sql_arg_t *args, int nargs)
{
  pg_db_t *d = P(db);
  int err;
  PGresult *res = run(d, stmt, sql, args, nargs, 0, &err);

  d->res = NULL;
  d->row = -1;
  if (err != 0)
    return err;
  if (res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK) {
    err = classify(d, res, "query");
    PQclear(res);
    return err;
  }
  d->res = res;
  return 0;
}

/* The statements, then COMMIT, in one flush and one Sync: one round trip
 * where a query each and exec(COMMIT) take one each. The statements' rows
 * are read after COMMIT's result; if one failed, the server skipped the
 * rest and the COMMIT (pipeline aborted), so nothing was committed and the
 * error is the failed statement's own, exactly as when they are sent apart. */
static int pg_query_commit(osr__db_t *db, const osr__sql_stmt_t *stmts, int n, int *sent)
{
  pg_db_t *d = P(db);
  int keep[OSR__STORE_FLUSH_MAX];
  int err = 0, i;

  *sent = 0;
  results_clear(d);
  if (n < 1 || n > OSR__STORE_FLUSH_MAX)
    return OSR__EDB;
  /* A connection the server closed while we were idle (a restart) says so
   * before we send: its FATAL message (which libpq takes as a notice) and
   * then the end of the stream are waiting to be read. Find that out now,
   * while nothing can have been committed and the store core may replay the
   * batch on a new connection (with the COMMIT sent, a lost connection
   * leaves the outcome unknown). Reading stops when nothing more is
   * waiting, so a healthy connection costs one poll (or a few, while the
   * answers to earlier statements arrive). */
  for (i = 0; d->c != NULL && i < 4; i++) {
    struct pollfd pfd = {.fd = PQsocket(d->c), .events = POLLIN, .revents = 0};
    if (poll(&pfd, 1, 0) <= 0)
      break;
    if (PQconsumeInput(d->c) != 1 || PQstatus(d->c) == CONNECTION_BAD) {
      pg_disconnect(db);
      return OSR_EUNAVAILABLE;
    }
  }
  /* Room for a Parse and an Execute each and COMMIT without an early
   * collect (which would read and drop the statements' results). */
  if (d->c != NULL && d->pipe && d->pending + 2 * n + 1 > PIPE_MAX)
    err = pipe_collect(d, -1, NULL);
  for (i = 0; err == 0 && i < n; i++) {
    run(d, stmts[i].stmt, NULL, stmts[i].args, stmts[i].nargs, 1, &err);
    keep[i] = d->pending - 1;
  }
  if (err != 0) {
    if (err == OSR_EUNAVAILABLE)
      pg_disconnect(db);
    return err;
  }
  *sent = 1;
  err = pipe_send(d, OSR__ST_COMMIT, NULL, 0, NULL);
  if (err == 0)
    err = pipe_collect_kept(d, keep, n, d->kept);
  if (err == OSR_EUNAVAILABLE)
    pg_disconnect(db);
  if (err != 0)
    return err;
  d->nkept = n;
  d->res = d->kept[0];
  return 0;
}

static void pg_query_pick(osr__db_t *db, int i)
{
  pg_db_t *d = P(db);
  d->res = i >= 0 && i < d->nkept ? d->kept[i] : NULL;
  d->row = -1;
}

static int pg_row_next(osr__db_t *db)
{
  pg_db_t *d = P(db);
  if (d->res == NULL)
    return OSR__EDB;
  d->row++;
  return d->row < PQntuples(d->res) ? 1 : 0;
}

static const char *pg_col_text(osr__db_t *db, int col)
{
  pg_db_t *d = P(db);
  if (PQgetisnull(d->res, d->row, col))
    return NULL;
  return PQgetvalue(d->res, d->row, col);
}

static int64_t pg_col_int(osr__db_t *db, int col)
{
  const char *t = pg_col_text(db, col);
  return t != NULL ? (int64_t)strtoll(t, NULL, 10) : 0;
}

static void pg_query_end(osr__db_t *db)
{
  results_clear(P(db));
}

static int pg_migrate_lock(osr__db_t *db)
{
  return pg_exec(db, -1, "SELECT pg_advisory_xact_lock(" MIGRATE_LOCK_KEY ")", NULL, 0, NULL);
}

const osr__db_vtbl_t osr__store_pg = {
  .name = "postgres",
  .serial_pk = "BIGSERIAL PRIMARY KEY",
  .begin_sql = "BEGIN",
  /* Only this transaction: the commit is acknowledged once it is in the
   * server's WAL buffers; the WAL writer flushes it within 3 x
   * wal_writer_delay, and any later synchronous commit flushes it first. */
  .relax_sql = "SET LOCAL synchronous_commit = off",
  .array_params = 1,
  .configure = pg_configure,
  .unconfigure = NULL,
  .db_new = pg_db_new,
  .has_reader = pg_has_reader,
  .db_new_reader = pg_db_new,
  .db_free = pg_db_free,
  .db_connect = pg_connect,
  .db_is_connected = pg_is_connected,
  .db_disconnect = pg_disconnect,
  .exec = pg_exec,
  .query = pg_query,
  .query_commit = pg_query_commit,
  .query_pick = pg_query_pick,
  .row_next = pg_row_next,
  .col_text = pg_col_text,
  .col_int = pg_col_int,
  .query_end = pg_query_end,
  .migrate_lock = pg_migrate_lock,
};
