/*
 * Internals of the binding store shared by store.c (queue, workers, the
 * operations written once against a tiny SQL layer), schema.c (the one
 * schema, its migrations and every statement's text) and the two backends
 * (store_sqlite.c, store_pg.c), which implement that SQL layer.
 *
 * Why a SQL layer rather than two copies of every operation: the two
 * databases accept the same SQL for everything we need ($N parameters,
 * ON CONFLICT DO NOTHING, partial unique indexes, CASE), so the only
 * per-backend code is how to connect, run a statement with parameters and
 * read a row. The operations, the batching and the error handling exist once
 * and behave identically on both.
 *
 * Threading: an osr__db_t belongs to exactly one worker thread for its whole
 * life (created, used and freed there). Nothing in it is shared.
 */
#ifndef OSR_STORE_STORE_INT_H
#define OSR_STORE_STORE_INT_H

#include <stdatomic.h>

#include "store/store.h"

/* Caps on what callers (and through them, peers) hand us. */
#define OSR__STORE_JSON_MAX (64 * 1024) /* per JSON document, bytes */
#define OSR__STORE_META_FILTERS_MAX 16  /* metadata k=v filters per list */
#define OSR__STORE_META_KEYS_MAX 64     /* entries in one metadata object */
#define OSR__STORE_META_STR_MAX 256     /* bytes per metadata key or value */
#define OSR__STORE_LIST_MAX 1000        /* rows per page (bindings, audit) */
#define OSR__STORE_KEYS_MAX 1000        /* rows per key listing */
#define OSR__STORE_QUEUE_MAX 100000     /* queued requests before we shed load */
#define OSR__STORE_BATCH_MAX 512        /* requests per group-commit transaction */
/* Rows per multi-row statement (backends with array parameters): bounds the
 * array texts one statement carries, up to this many 64 KiB documents. */
#define OSR__STORE_ROWS_MAX 64
/* Statements one query_commit flush carries (a batch needing more takes the
 * round trip per statement path). */
#define OSR__STORE_FLUSH_MAX 64

/* Internal status: a statement failed in a way that poisons the current
 * transaction (PostgreSQL aborts it; we treat SQLite the same) but says
 * nothing about the connection. Callers see OSR_EUNAVAILABLE. */
#define OSR__EDB (-30090)

/* ---- statements ------------------------------------------------------------ */

/** Statements with a fixed text, prepared once per connection and cached. */
typedef enum osr__stmt_e {
  OSR__ST_BEGIN = 0,
  OSR__ST_COMMIT,
  OSR__ST_ROLLBACK,
  OSR__ST_RELAX,      /* backend's relax_sql: this transaction's commit need not wait for the disk */
  OSR__ST_B_INSERT,
  OSR__ST_B_BY_KEY,
  OSR__ST_B_BY_ID,
  OSR__ST_B_UPDATE,
  OSR__ST_B_UPDATE_IF,
  OSR__ST_B_EXISTS,
  OSR__ST_B_TOUCH,
  OSR__ST_META_INSERT,
  OSR__ST_KEY_INSERT,
  OSR__ST_KEY_LOOKUP,
  OSR__ST_KEY_LIST_ALL,
  OSR__ST_KEY_LIST_TENANT,
  OSR__ST_KEY_REVOKE,
  OSR__ST_AUDIT_INSERT,
  /* Multi-row forms of B_INSERT, B_UPDATE_IF and AUDIT_INSERT whose every
   * parameter is an array with one element per row (osr__sql_arg_t.elems):
   * only run on a backend whose vtbl sets array_params. */
  OSR__ST_B_INSERT_ROWS,
  OSR__ST_B_UPDATE_ROWS,
  OSR__ST_AUDIT_INSERT_ROWS,
  /* PostgreSQL only, one statement doing what two did, so that a
   * transaction of them needs no answer before its COMMIT (store.c "a
   * transaction in one flush"): B_UPDATE_IF with the audit row of the
   * update when it applied ($20 = 1), B_UPDATE_ROWS with the audit rows of
   * the rows it changed, B_INSERT_ROWS with the metadata rows of the rows
   * it wrote. Each returns the ids it wrote, like B_INSERT_ROWS. */
  OSR__ST_B_UPDATE_AUDIT,
  OSR__ST_B_UPDATE_ROWS_AUDIT,
  OSR__ST_B_INSERT_ROWS_META,
  OSR__ST_COUNT
} osr__stmt_t;

/** Columns selected for a binding, in this order (schema.c OSR__B_COLS). */
enum {
  OSR__BC_ID = 0, OSR__BC_TENANT, OSR__BC_IDEM, OSR__BC_HASH, OSR__BC_TEMPLATE, OSR__BC_PROVIDER,
  OSR__BC_PROVIDER_ID, OSR__BC_REGION, OSR__BC_ISOLATION, OSR__BC_ENDPOINT, OSR__BC_STATE,
  OSR__BC_ATTEMPT, OSR__BC_CREATED, OSR__BC_UPDATED, OSR__BC_EXPIRES, OSR__BC_IDLE,
  OSR__BC_ACTIVITY, OSR__BC_ENDED, OSR__BC_END_REASON, OSR__BC_REQUEST, OSR__BC_GRANTED,
  OSR__BC_METADATA, OSR__BC_ERROR, OSR__BC_OWNER
};

extern const char *const osr__stmt_sql[OSR__ST_COUNT];
/** "SELECT <binding columns> FROM bindings" for dynamic list queries. */
extern const char osr__sql_binding_select[];
extern const char osr__sql_audit_select[];

/** One versioned migration; `sql` holds statements separated by ';' and may
 *  contain @SERIAL_PK@, replaced by the backend's auto-increment key type. */
typedef struct osr__migration_s {
  int version;
  const char *sql;
} osr__migration_t;

extern const osr__migration_t osr__migrations[];
extern const size_t osr__nmigrations;

/* ---- the SQL layer each backend implements ---------------------------------- */

/** A statement parameter: text (s != NULL), integer (is_int) or NULL; or,
 *  when elems != NULL, an array of nelems such values (no nested arrays),
 *  for the *_ROWS statements. */
typedef struct osr__sql_arg_s {
  const char *s;
  int64_t i;
  int is_int;
  const struct osr__sql_arg_s *elems;
  int nelems;
} osr__sql_arg_t;

typedef struct osr__db_s osr__db_t;

/** One statement of a query_commit flush: cached statement `stmt` with its
 *  parameters (owned by the caller, read only during the call). */
typedef struct osr__sql_stmt_s {
  int stmt;
  const osr__sql_arg_t *args;
  int nargs;
} osr__sql_stmt_t;

typedef struct osr__db_vtbl_s {
  const char *name;       /* "sqlite" | "postgres" */
  const char *serial_pk;  /* auto-increment primary key column type */
  const char *begin_sql;  /* how a write transaction starts */
  /** Run right after BEGIN so that this transaction's COMMIT returns without
   *  waiting for the disk (osr_store_update_opts_t.relaxed), or NULL when
   *  the backend has no such thing (SQLite: sync=normal never waits per
   *  commit; sync=full always does). */
  const char *relax_sql;
  /** 1 when the backend takes array parameters and runs the *_ROWS
   *  statements: a batch's consecutive creates (and binding updates) then
   *  go to the server as one statement instead of one each (PostgreSQL,
   *  where each statement is a round trip and a backend wake-up). 0:
   *  every row is its own statement (SQLite, in process: nothing to save). */
  int array_params;
  /** Called by a foreground worker after each batch's answers were handed
   *  back (maintenance that must not delay them: SQLite's writer-side WAL
   *  checkpoint), or NULL. */
  void (*after_batch)(osr__db_t *db);
  /** Parse the URL and keep what the backend needs in st (osr__store_be_cfg).
   *  Runs on the loop thread in osr_store_open. 0 or OSR_EINVAL. */
  int (*configure)(osr_store_t *st, const char *url);
  void (*unconfigure)(osr_store_t *st);
  /** Worker-side connection object; never NULL (connecting is separate). */
  osr__db_t *(*db_new)(osr_store_t *st);
  /** 1 if this store can have a background reader connection as well
   *  (store.c "Background reads"; loop thread, after configure). */
  int (*has_reader)(const osr_store_t *st);
  /** The background worker's connection object: it only ever runs reads,
   *  each in a transaction of its own, and never migrates. */
  osr__db_t *(*db_new_reader)(osr_store_t *st);
  void (*db_free)(osr__db_t *db);
  /** Connect if not connected. 0, OSR_EUNAVAILABLE (server unreachable, file
   *  cannot be opened) or OSR_EINVAL (configuration is wrong for good). */
  int (*db_connect)(osr__db_t *db);
  int (*db_is_connected)(osr__db_t *db);
  /** Drop a connection found broken; the next db_connect makes a new one. */
  void (*db_disconnect)(osr__db_t *db);
  /** Run a statement (cached when stmt >= 0, else the dynamic `sql`).
   *  `changes` (may be NULL) gets the affected row count. Returns 0,
   *  OSR_ECONFLICT (unique violation), OSR_EAGAIN (deadlock/serialization:
   *  retry), OSR_EUNAVAILABLE (connection lost, disk full/IO) or OSR__EDB. */
  int (*exec)(osr__db_t *db, int stmt, const char *sql, const osr__sql_arg_t *args, int nargs,
              int64_t *changes);
  /** Like exec, then rows are read with row_next/col_* until row_next
   *  returns 0 (end) or < 0 (error code as above); query_end always after. */
  int (*query)(osr__db_t *db, int stmt, const char *sql, const osr__sql_arg_t *args, int nargs);
  /** Optional (NULL: not offered). Like query on each of the n (1 ..
   *  OSR__STORE_FLUSH_MAX) cached statements in order, then COMMIT of the
   *  open transaction, all in one round trip. On 0 the transaction is
   *  committed and statement 0's rows are read as after query; query_pick
   *  moves to another statement's rows (query_end always after, once).
   *  *sent says whether COMMIT went out. On an error the rows are gone:
   *  with OSR_EUNAVAILABLE and *sent the commit's outcome is unknown
   *  (without *sent nothing was committed); with any other code (the first
   *  failing statement's) nothing was committed and the caller sends
   *  ROLLBACK, as after a failed exec(COMMIT). */
  int (*query_commit)(osr__db_t *db, const osr__sql_stmt_t *stmts, int n, int *sent);
  /** After query_commit returned 0: statement i's rows become the ones
   *  row_next reads, from the first. */
  void (*query_pick)(osr__db_t *db, int i);
  int (*row_next)(osr__db_t *db);
  /** Text of column `col` of the current row; NULL for SQL NULL. */
  const char *(*col_text)(osr__db_t *db, int col);
  int64_t (*col_int)(osr__db_t *db, int col);
  void (*query_end)(osr__db_t *db);
  /** Serialise concurrent migrations across processes: called inside the
   *  migration transaction (PostgreSQL: pg_advisory_xact_lock; SQLite's
   *  BEGIN IMMEDIATE already holds the only write lock). */
  int (*migrate_lock)(osr__db_t *db);
} osr__db_vtbl_t;

extern const osr__db_vtbl_t osr__store_sqlite;
extern const osr__db_vtbl_t osr__store_pg;

/** Backend configuration parsed from the URL (owned by the store). */
typedef struct osr__store_cfg_s {
  char *target;        /* sqlite: file path; postgres: libpq conninfo URI */
  int sync_full;       /* sqlite ?sync=full */
  int pool;            /* worker threads / connections */
  int strict_bindings; /* postgres ?binding_commit=sync: never relax a commit */
  /* The backend's state shared by the store's connections (SQLite: the
   * writer and the background reader), or NULL: made by configure, freed by
   * unconfigure. */
  void *be_shared;
} osr__store_cfg_t;

/** The store's shared state the backends read (circuit, config). */
const osr__store_cfg_t *osr__store_cfg(const osr_store_t *st);
osr__store_cfg_t *osr__store_cfg_mut(osr_store_t *st);

/** Backend events counted in osr_store_stats (any worker thread). */
typedef enum osr__store_ev_e { OSR__EV_WAL_RESTART, OSR__EV_WAL_RESTART_MISS } osr__store_ev_t;
void osr__store_count(osr_store_t *st, osr__store_ev_t ev);

/** Milliseconds on a monotonic clock (worker threads, circuit timing). */
int64_t osr__store_mono_ms(void);

#endif
