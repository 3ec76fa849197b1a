/*
 * SQLite backend of the binding store: the SQL layer of store_int.h over one
 * sqlite3 connection owned by the store's single worker thread.
 *
 * URL: sqlite:PATH[?sync=normal|full]   (sqlite:///abs/path is accepted too)
 *
 * Durability choice. The database runs in WAL mode with synchronous=NORMAL:
 * a commit has been write()n to the WAL before COMMIT returns, so it survives
 * the gateway process crashing or being killed at any point, which is what
 * "crash-safe bindings" means here (the provider resource and our row must
 * agree after a gateway restart). What NORMAL gives up is the last few
 * commits on a power loss or kernel crash (the WAL is fsynced at checkpoints,
 * not at every commit). sync=full fsyncs the WAL on every commit and closes
 * that window at the cost of one fsync per group commit; group commit keeps
 * even that affordable, since one fsync covers a whole batch.
 *
 * One worker, one connection: SQLite has one writer at a time anyway, and
 * group commit turns many small writes into one transaction, so a second
 * writer thread would only add lock waits. Other processes may open the same
 * file (WAL lets them read while we write); busy_timeout makes brief write
 * lock contention wait rather than fail.
 *
 * Statements with a fixed text are prepared once (SQLITE_PREPARE_PERSISTENT)
 * and reused; parameters are bound by name ("$1".."$N") so one SQL text
 * serves both backends.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "store/store_int.h"
#include "util/log.h"
#include "util/mem.h"

#define BUSY_TIMEOUT_MS 5000

typedef struct sqlite_db_s {
  osr_store_t *st;
  sqlite3 *h;
  sqlite3_stmt *cache[OSR__ST_COUNT];
  sqlite3_stmt *cur;      /* statement being read by row_next */
  int cur_dynamic;        /* finalize cur at query_end */
} sqlite_db_t;

/* osr__db_t is opaque to store.c; here it is a sqlite_db_t. */
static sqlite_db_t *S(osr__db_t *db)
{
  return (sqlite_db_t *)(void *)db;
}

static int map_err(sqlite_db_t *d, int rc, const char *what)
{
  switch (rc & 0xff) {
  case SQLITE_CONSTRAINT:
    return OSR_ECONFLICT;
  /* After busy_timeout another process still holds the write lock, or the
   * disk/file is unusable: either way the store cannot serve us now. */
  case SQLITE_BUSY:
  case SQLITE_LOCKED:
  case SQLITE_FULL:
  case SQLITE_IOERR:
  case SQLITE_CANTOPEN:
  case SQLITE_NOMEM:
  case SQLITE_READONLY:
  case SQLITE_CORRUPT:
  case SQLITE_NOTADB:
  case SQLITE_PERM:
  case SQLITE_PROTOCOL:
    OSR_LOG_WARN("store", "sqlite: %s: %s", what, d->h != NULL ? sqlite3_errmsg(d->h) : sqlite3_errstr(rc));
    return OSR_EUNAVAILABLE;
  default:
    OSR_LOG_WARN("store", "sqlite: %s: %s", what, d->h != NULL ? sqlite3_errmsg(d->h) : sqlite3_errstr(rc));
    return OSR__EDB;
  }
}

static int sq_configure(osr_store_t *st, const char *url)
{
  osr__store_cfg_t *cfg = osr__store_cfg_mut(st);
  const char *p = url + strlen("sqlite:");
  const char *q;
  size_t n;

  if (strncmp(p, "//", 2) == 0)
    p += 2;
  q = strchr(p, '?');
  n = q != NULL ? (size_t)(q - p) : strlen(p);
  if (n == 0)
    return OSR_EINVAL;
  cfg->sync_full = 0;
  if (q != NULL) {
    /* The only option is sync=; anything else is a typo worth refusing. */
    if (strcmp(q + 1, "sync=full") == 0)
      cfg->sync_full = 1;
    else if (strcmp(q + 1, "sync=normal") != 0)
      return OSR_EINVAL;
  }
  cfg->target = osr_xstrndup(p, n);
  cfg->pool = 1;
  return 0;
}

static osr__db_t *sq_db_new(osr_store_t *st)
{
  sqlite_db_t *d = osr_xcalloc(1, sizeof(*d));
  d->st = st;
  return (osr__db_t *)(void *)d;
}

static void sq_disconnect(osr__db_t *db)
{
  sqlite_db_t *d = S(db);
  size_t i;

  if (d->cur != NULL && d->cur_dynamic)
    sqlite3_finalize(d->cur);
  d->cur = NULL;
  for (i = 0; i < OSR__ST_COUNT; i++) {
    if (d->cache[i] != NULL)
      sqlite3_finalize(d->cache[i]);
    d->cache[i] = NULL;
  }
  if (d->h != NULL)
    sqlite3_close_v2(d->h);
  d->h = NULL;
}

static void sq_db_free(osr__db_t *db)
{
  sq_disconnect(db);
  osr_free(db);
}

static int sq_is_connected(osr__db_t *db)
{
  return S(db)->h != NULL;
}

static int sq_connect(osr__db_t *db)
{
  sqlite_db_t *d = S(db);
  const osr__store_cfg_t *cfg = osr__store_cfg(d->st);
  char *err = NULL;
  char pragmas[160];
  int rc, fd;

  if (d->h != NULL)
    return 0;
  /* The file holds API key hashes: create it owner-only before SQLite does
   * (SQLite gives its -wal and -shm files the main file's mode). */
  if (strcmp(cfg->target, ":memory:") != 0) {
    fd = open(cfg->target, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      OSR_LOG_WARN("store", "sqlite: cannot open %s: %s", cfg->target, strerror(errno));
      return OSR_EUNAVAILABLE;
    }
    close(fd);
  }
  /* NOMUTEX: the connection is used by one thread only. */
  rc = sqlite3_open_v2(cfg->target, &d->h,
                       SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
  if (rc != SQLITE_OK) {
    rc = map_err(d, rc, "open");
    sq_disconnect(db);
    return rc == OSR_ECONFLICT ? OSR_EUNAVAILABLE : rc;
  }
  sqlite3_extended_result_codes(d->h, 1);
  sqlite3_busy_timeout(d->h, BUSY_TIMEOUT_MS);
  snprintf(pragmas, sizeof(pragmas),
           "PRAGMA journal_mode = WAL; PRAGMA synchronous = %s; PRAGMA foreign_keys = ON;",
           cfg->sync_full ? "FULL" : "NORMAL");
  rc = sqlite3_exec(d->h, pragmas, NULL, NULL, &err);
  if (rc != SQLITE_OK) {
    OSR_LOG_WARN("store", "sqlite: %s: %s", cfg->target, err != NULL ? err : sqlite3_errstr(rc));
    sqlite3_free(err);
    sq_disconnect(db);
    return OSR_EUNAVAILABLE;
  }
  return 0;
}

static int prepare(sqlite_db_t *d, int stmt, const char *sql, sqlite3_stmt **out)
{
  int rc;

  if (stmt >= 0) {
    if (d->cache[stmt] == NULL) {
      const char *text = stmt == OSR__ST_BEGIN ? osr__store_sqlite.begin_sql : osr__stmt_sql[stmt];
      rc = sqlite3_prepare_v3(d->h, text, -1, SQLITE_PREPARE_PERSISTENT, &d->cache[stmt], NULL);
      if (rc != SQLITE_OK)
        return map_err(d, rc, "prepare");
    }
    *out = d->cache[stmt];
    return 0;
  }
  rc = sqlite3_prepare_v2(d->h, sql, -1, out, NULL);
  if (rc != SQLITE_OK)
    return map_err(d, rc, "prepare");
  return 0;
}

static int bind_args(sqlite_db_t *d, sqlite3_stmt *s, const osr__sql_arg_t *args, int nargs)
{
  char name[16];
  int i, idx, rc;

  for (i = 0; i < nargs; i++) {
    snprintf(name, sizeof(name), "$%d", i + 1);
    idx = sqlite3_bind_parameter_index(s, name);
    if (idx == 0)
      continue; /* the text does not use this parameter */
    if (args[i].is_int)
      rc = sqlite3_bind_int64(s, idx, args[i].i);
    else if (args[i].s != NULL)
      /* STATIC: the strings live in the request until the statement is reset. */
      rc = sqlite3_bind_text(s, idx, args[i].s, -1, SQLITE_STATIC);
    else
      rc = sqlite3_bind_null(s, idx);
    if (rc != SQLITE_OK)
      return map_err(d, rc, "bind");
  }
  return 0;
}

static void finish(sqlite3_stmt *s, int dynamic)
{
  if (dynamic) {
    sqlite3_finalize(s);
  } else {
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
  }
}

static int sq_exec(osr__db_t *db, int stmt, const char *sql, const osr__sql_arg_t *args, int nargs,
                   int64_t *changes)
{
  sqlite_db_t *d = S(db);
  sqlite3_stmt *s = NULL;
  int rv, rc;

  if (d->h == NULL)
    return OSR_EUNAVAILABLE;
  rv = prepare(d, stmt, sql, &s);
  if (rv != 0)
    return rv;
  rv = bind_args(d, s, args, nargs);
  if (rv == 0) {
    /* Statements that return rows (pragmas) are stepped to the end. */
    while ((rc = sqlite3_step(s)) == SQLITE_ROW)
      ;
    if (rc != SQLITE_DONE)
      rv = map_err(d, rc, "step");
    else if (changes != NULL)
      *changes = sqlite3_changes64(d->h);
  }
  finish(s, stmt < 0);
  return rv;
}

static int sq_query(osr__db_t *db, int stmt, const char *sql, const osr__sql_arg_t *args, int nargs)
{
  sqlite_db_t *d = S(db);
  sqlite3_stmt *s = NULL;
  int rv;

  d->cur = NULL;
  if (d->h == NULL)
    return OSR_EUNAVAILABLE;
  rv = prepare(d, stmt, sql, &s);
  if (rv != 0)
    return rv;
  d->cur = s;
  d->cur_dynamic = stmt < 0;
  return bind_args(d, s, args, nargs);
}

static int sq_row_next(osr__db_t *db)
{
  sqlite_db_t *d = S(db);
  int rc;

  if (d->cur == NULL)
    return OSR__EDB;
  rc = sqlite3_step(d->cur);
  if (rc == SQLITE_ROW)
    return 1;
  if (rc == SQLITE_DONE)
    return 0;
  return map_err(d, rc, "step");
}

static const char *sq_col_text(osr__db_t *db, int col)
{
  sqlite_db_t *d = S(db);
  if (sqlite3_column_type(d->cur, col) == SQLITE_NULL)
    return NULL;
  return (const char *)sqlite3_column_text(d->cur, col);
}

static int64_t sq_col_int(osr__db_t *db, int col)
{
  return sqlite3_column_int64(S(db)->cur, col);
}

static void sq_query_end(osr__db_t *db)
{
  sqlite_db_t *d = S(db);
  if (d->cur != NULL)
    finish(d->cur, d->cur_dynamic);
  d->cur = NULL;
}

static int sq_migrate_lock(osr__db_t *db)
{
  (void)db;
  return 0; /* BEGIN IMMEDIATE already holds the database's only write lock */
}

const osr__db_vtbl_t osr__store_sqlite = {
  .name = "sqlite",
  .serial_pk = "INTEGER PRIMARY KEY AUTOINCREMENT",
  /* IMMEDIATE takes the write lock up front, so a batch never fails halfway
   * with SQLITE_BUSY when another process writes the same file. */
  .begin_sql = "BEGIN IMMEDIATE",
  .configure = sq_configure,
  .unconfigure = NULL,
  .db_new = sq_db_new,
  .db_free = sq_db_free,
  .db_connect = sq_connect,
  .db_is_connected = sq_is_connected,
  .db_disconnect = sq_disconnect,
  .exec = sq_exec,
  .query = sq_query,
  .row_next = sq_row_next,
  .col_text = sq_col_text,
  .col_int = sq_col_int,
  .query_end = sq_query_end,
  .migrate_lock = sq_migrate_lock,
};
