/*
 * The one schema of the binding store, its versioned migrations and the text
 * of every fixed statement, shared by the SQLite and PostgreSQL backends.
 *
 * Portability rules kept here so both databases run the same text:
 *  - types are TEXT, INTEGER and BIGINT only; the auto-increment key of the
 *    audit log is the one spelling that differs (@SERIAL_PK@);
 *  - parameters are $1..$N (PostgreSQL's syntax; SQLite reads "$1" as a named
 *    parameter, and the SQLite backend binds by name, so order of appearance
 *    does not matter);
 *  - ON CONFLICT DO NOTHING without a target (SQLite >= 3.24, PostgreSQL
 *    >= 9.5) covers every unique index, including the partial one on
 *    (tenant, idem_key);
 *  - CASE instead of max()/GREATEST(), which the two spell differently.
 *
 * Metadata filtering: bindings.metadata_json keeps the document as given, and
 * binding_metadata(binding_id, k, v) holds one row per entry, written in the
 * same transaction as the binding (metadata is immutable after create). A
 * filter k=v is an indexed lookup on (k, v) in either database; JSON
 * functions would have needed two dialects and an expression index per key.
 *
 * Migrations only ever append: a released version is never edited. Each runs
 * in one transaction with schema_migrations updated in it, under a lock that
 * keeps two gateways starting at once from racing (see store.c migrate()).
 */
#include "store/store_int.h"

#define OSR__B_COLS                                                                           \
  "id, tenant, idem_key, request_hash, template_id, provider, provider_id, region, isolation, " \
  "agent_endpoint, state, attempt, created_ms, updated_ms, expires_ms, idle_timeout_ms, "       \
  "last_activity_ms, ended_ms, end_reason, request_json, granted_json, metadata_json, "         \
  "error_json, owner"

#define OSR__A_COLS "seq, at_ms, tenant, actor, action, sandbox_id, outcome, detail_json"
#define OSR__K_COLS "key_id, tenant, role, hash, name, created_ms, revoked_ms"

const char osr__sql_binding_select[] = "SELECT " OSR__B_COLS " FROM bindings";
const char osr__sql_audit_select[] = "SELECT " OSR__A_COLS " FROM audit";

/* Texts used by more than one statement below. */
#define B_UPDATE_IF_SQL \
  "UPDATE bindings SET provider = $2, provider_id = $3, region = $4, isolation = $5, " \
  "agent_endpoint = $6, state = $7, attempt = $8, updated_ms = $9, expires_ms = $10, " \
  "idle_timeout_ms = $11, last_activity_ms = CASE WHEN last_activity_ms > $12 THEN " \
  "last_activity_ms ELSE $12 END, ended_ms = $13, end_reason = $14, granted_json = $15, " \
  "error_json = $16, owner = CASE WHEN CAST($17 AS TEXT) = '' THEN owner ELSE CAST($17 AS TEXT) " \
  "END WHERE id = $1 AND (CAST($18 AS INTEGER) = 0 OR state = CAST($18 AS INTEGER)) AND " \
  "(CAST($19 AS BIGINT) = 0 OR updated_ms = CAST($19 AS BIGINT))"
#define B_INSERT_ROWS_SQL \
  "INSERT INTO bindings (" OSR__B_COLS ") SELECT * FROM unnest($1::text[], $2::text[], " \
  "$3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::integer[], " \
  "$10::text[], $11::integer[], $12::integer[], $13::bigint[], $14::bigint[], $15::bigint[], " \
  "$16::bigint[], $17::bigint[], $18::bigint[], $19::text[], $20::text[], $21::text[], " \
  "$22::text[], $23::text[], $24::text[]) AS v ON CONFLICT DO NOTHING RETURNING id"
#define B_UPDATE_ROWS_SQL \
  "UPDATE bindings AS b SET provider = v.provider, provider_id = v.provider_id, region = " \
  "v.region, isolation = v.isolation, agent_endpoint = v.agent_endpoint, state = v.state, " \
  "attempt = v.attempt, updated_ms = v.updated_ms, expires_ms = v.expires_ms, idle_timeout_ms = " \
  "v.idle_timeout_ms, last_activity_ms = CASE WHEN b.last_activity_ms > v.last_activity_ms THEN " \
  "b.last_activity_ms ELSE v.last_activity_ms END, ended_ms = v.ended_ms, end_reason = " \
  "v.end_reason, granted_json = v.granted_json, error_json = v.error_json, owner = CASE WHEN " \
  "v.owner = '' THEN b.owner ELSE v.owner END FROM unnest($1::text[], $2::text[], $3::text[], " \
  "$4::text[], $5::integer[], $6::text[], $7::integer[], $8::integer[], $9::bigint[], " \
  "$10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[], $14::text[], $15::text[], " \
  "$16::text[], $17::text[], $18::integer[], $19::bigint[]) AS v (id, provider, provider_id, " \
  "region, isolation, agent_endpoint, state, attempt, updated_ms, expires_ms, idle_timeout_ms, " \
  "last_activity_ms, ended_ms, end_reason, granted_json, error_json, owner, if_state, " \
  "if_updated_ms) WHERE b.id = v.id AND (v.if_state = 0 OR b.state = v.if_state) AND " \
  "(v.if_updated_ms = 0 OR b.updated_ms = v.if_updated_ms) RETURNING b.id"

const char *const osr__stmt_sql[OSR__ST_COUNT] = {
  [OSR__ST_BEGIN] = NULL, /* backend's begin_sql */
  [OSR__ST_COMMIT] = "COMMIT",
  [OSR__ST_ROLLBACK] = "ROLLBACK",
  [OSR__ST_RELAX] = NULL, /* backend's relax_sql */
  [OSR__ST_B_INSERT] =
    "INSERT INTO bindings (" OSR__B_COLS ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, "
    "$12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24) ON CONFLICT DO NOTHING",
  /* idem_key <> '' repeats the partial index's predicate so the planner may
   * use that index whatever the parameter's value. */
  [OSR__ST_B_BY_KEY] = "SELECT " OSR__B_COLS
                       " FROM bindings WHERE tenant = $1 AND idem_key = $2 AND idem_key <> ''",
  [OSR__ST_B_BY_ID] = "SELECT " OSR__B_COLS " FROM bindings WHERE id = $1",
  /* last_activity_ms only moves forward: an update built from a stale copy
   * must not undo touches that landed in between. An empty owner keeps the
   * stored one, so updaters that never heard of owners (a copy made from a
   * struct without it) cannot erase it. */
  [OSR__ST_B_UPDATE] =
    "UPDATE bindings SET provider = $2, provider_id = $3, region = $4, isolation = $5, "
    "agent_endpoint = $6, state = $7, attempt = $8, updated_ms = $9, expires_ms = $10, "
    "idle_timeout_ms = $11, last_activity_ms = CASE WHEN last_activity_ms > $12 THEN "
    "last_activity_ms ELSE $12 END, ended_ms = $13, end_reason = $14, granted_json = $15, "
    "error_json = $16, owner = CASE WHEN CAST($17 AS TEXT) = '' THEN owner ELSE CAST($17 AS TEXT) "
    "END WHERE id = $1",
  /* The same, as a compare-and-set: the row changes only while it is still
   * in the state (and, unless $19 is 0, at the version) the caller read.
   * One statement, so the database's row lock decides races between
   * gateways; the affected-row count tells the caller whether it won. */
  [OSR__ST_B_UPDATE_IF] = B_UPDATE_IF_SQL,
  /* After a conditional update changed nothing: lost race or no row? */
  [OSR__ST_B_EXISTS] = "SELECT 1 FROM bindings WHERE id = $1",
  [OSR__ST_B_TOUCH] =
    "UPDATE bindings SET last_activity_ms = $2 WHERE id = $1 AND last_activity_ms < $2",
  [OSR__ST_META_INSERT] =
    "INSERT INTO binding_metadata (binding_id, k, v) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
  [OSR__ST_KEY_INSERT] = "INSERT INTO api_keys (" OSR__K_COLS
                         ") VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
  [OSR__ST_KEY_LOOKUP] = "SELECT " OSR__K_COLS " FROM api_keys WHERE hash = $1 AND revoked_ms = 0",
  [OSR__ST_KEY_LIST_ALL] = "SELECT " OSR__K_COLS " FROM api_keys ORDER BY created_ms, key_id LIMIT $1",
  [OSR__ST_KEY_LIST_TENANT] = "SELECT " OSR__K_COLS
                              " FROM api_keys WHERE tenant = $1 ORDER BY created_ms, key_id LIMIT $2",
  /* Revoking twice keeps the first revocation time (idempotent). */
  [OSR__ST_KEY_REVOKE] = "UPDATE api_keys SET revoked_ms = CASE WHEN revoked_ms = 0 THEN $2 ELSE "
                         "revoked_ms END WHERE key_id = $1",
  [OSR__ST_AUDIT_INSERT] = "INSERT INTO audit (at_ms, tenant, actor, action, sandbox_id, outcome, "
                           "detail_json) VALUES ($1, $2, $3, $4, $5, $6, $7)",
  /* PostgreSQL only (osr__db_vtbl_t.array_params): the three statements
   * above for many rows at once, parameter $k being the array of every
   * row's $k. Rows go in array order. ON CONFLICT DO NOTHING also skips a
   * row that conflicts with an earlier row of the same statement; RETURNING
   * names the rows that were written, the others are resolved one by one
   * (store.c op_create_rows, op_update_rows). */
  [OSR__ST_B_INSERT_ROWS] = B_INSERT_ROWS_SQL,
  /* B_UPDATE_IF per row ($18 = 0 and $19 = 0: B_UPDATE). The join probes
   * the primary key once per row. */
  [OSR__ST_B_UPDATE_ROWS] = B_UPDATE_ROWS_SQL,
  [OSR__ST_AUDIT_INSERT_ROWS] =
    "INSERT INTO audit (at_ms, tenant, actor, action, sandbox_id, outcome, detail_json) SELECT * "
    "FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], "
    "$7::text[]) AS v",
  /* PostgreSQL only: the statement and the rows that ride with it as one
   * statement (data-modifying WITH; the outer SELECT names the rows the
   * first part wrote), so a transaction of them needs no answer before its
   * COMMIT (store.c "a transaction in one flush"). The second part reads
   * the first's RETURNING, so it writes exactly the rows whose binding it
   * describes. */
  [OSR__ST_B_UPDATE_AUDIT] =
    "WITH u AS (" B_UPDATE_IF_SQL " RETURNING id), a AS (INSERT INTO audit (at_ms, tenant, actor, "
    "action, sandbox_id, outcome, detail_json) SELECT CAST($21 AS BIGINT), CAST($22 AS TEXT), "
    "CAST($23 AS TEXT), CAST($24 AS TEXT), CAST($25 AS TEXT), CAST($26 AS TEXT), CAST($27 AS TEXT) "
    "FROM u WHERE CAST($20 AS INTEGER) = 1) SELECT id FROM u",
  /* Audit row k belongs to the update of binding $20[k]; rows keep their
   * array order (the order of the requests). */
  [OSR__ST_B_UPDATE_ROWS_AUDIT] =
    "WITH u AS (" B_UPDATE_ROWS_SQL "), a AS (INSERT INTO audit (at_ms, tenant, actor, action, "
    "sandbox_id, outcome, detail_json) SELECT e.at_ms, e.tenant, e.actor, e.action, e.sandbox_id, "
    "e.outcome, e.detail_json FROM unnest($20::text[], $21::bigint[], $22::text[], $23::text[], "
    "$24::text[], $25::text[], $26::text[], $27::text[]) WITH ORDINALITY AS e (bid, at_ms, tenant, "
    "actor, action, sandbox_id, outcome, detail_json, ord) WHERE e.bid IN (SELECT id FROM u) ORDER "
    "BY e.ord) SELECT id FROM u",
  [OSR__ST_B_INSERT_ROWS_META] =
    "WITH w AS (" B_INSERT_ROWS_SQL "), m AS (INSERT INTO binding_metadata (binding_id, k, v) "
    "SELECT * FROM unnest($25::text[], $26::text[], $27::text[]) AS e (binding_id, k, v) WHERE "
    "e.binding_id IN (SELECT id FROM w) ON CONFLICT DO NOTHING) SELECT id FROM w",
};

static const char migration_1[] =
  "CREATE TABLE bindings ("
  " id TEXT PRIMARY KEY,"
  " tenant TEXT NOT NULL,"
  " idem_key TEXT NOT NULL DEFAULT '',"
  " request_hash TEXT NOT NULL DEFAULT '',"
  " template_id TEXT NOT NULL DEFAULT '',"
  " provider TEXT NOT NULL DEFAULT '',"
  " provider_id TEXT NOT NULL DEFAULT '',"
  " region TEXT NOT NULL DEFAULT '',"
  " isolation INTEGER NOT NULL DEFAULT 0,"
  " agent_endpoint TEXT NOT NULL DEFAULT '',"
  " state INTEGER NOT NULL,"
  " attempt INTEGER NOT NULL DEFAULT 0,"
  " created_ms BIGINT NOT NULL,"
  " updated_ms BIGINT NOT NULL,"
  " expires_ms BIGINT NOT NULL DEFAULT 0,"
  " idle_timeout_ms BIGINT NOT NULL DEFAULT 0,"
  " last_activity_ms BIGINT NOT NULL DEFAULT 0,"
  " ended_ms BIGINT NOT NULL DEFAULT 0,"
  " end_reason TEXT NOT NULL DEFAULT '',"
  " request_json TEXT,"
  " granted_json TEXT,"
  " metadata_json TEXT,"
  " error_json TEXT);"
  /* Exactly one row per (tenant, key) from any number of gateways. */
  "CREATE UNIQUE INDEX bindings_idem ON bindings (tenant, idem_key) WHERE idem_key <> '';"
  /* Pagination is by (created_ms, id), per tenant or across tenants. */
  "CREATE INDEX bindings_tenant_created ON bindings (tenant, created_ms, id);"
  "CREATE INDEX bindings_created ON bindings (created_ms, id);"
  "CREATE INDEX bindings_state ON bindings (state);"
  "CREATE INDEX bindings_expires ON bindings (expires_ms) WHERE expires_ms <> 0;"
  "CREATE TABLE binding_metadata ("
  " binding_id TEXT NOT NULL REFERENCES bindings (id) ON DELETE CASCADE,"
  " k TEXT NOT NULL,"
  " v TEXT NOT NULL,"
  " PRIMARY KEY (binding_id, k));"
  "CREATE INDEX binding_metadata_kv ON binding_metadata (k, v, binding_id);"
  "CREATE TABLE api_keys ("
  " key_id TEXT PRIMARY KEY,"
  " tenant TEXT NOT NULL,"
  " role INTEGER NOT NULL,"
  " hash TEXT NOT NULL UNIQUE,"
  " name TEXT NOT NULL DEFAULT '',"
  " created_ms BIGINT NOT NULL,"
  " revoked_ms BIGINT NOT NULL DEFAULT 0);"
  "CREATE INDEX api_keys_tenant ON api_keys (tenant, created_ms);"
  /* Append-only: the store never updates or deletes audit rows. */
  "CREATE TABLE audit ("
  " seq @SERIAL_PK@,"
  " at_ms BIGINT NOT NULL,"
  " tenant TEXT NOT NULL,"
  " actor TEXT NOT NULL,"
  " action TEXT NOT NULL,"
  " sandbox_id TEXT NOT NULL DEFAULT '',"
  " outcome TEXT NOT NULL,"
  " detail_json TEXT);"
  "CREATE INDEX audit_tenant_seq ON audit (tenant, seq)";

/* Migration 2: which gateway instance owns a row's create, so recovery at
 * start resolves only its own interrupted creates and leaves those another
 * live gateway on the same database is still running. Rows written before
 * this migration get owner '' and are resolved only once stale. The partial
 * index serves both recovery queries (own rows; any row older than the
 * stale age) without scanning finished bindings. Concurrent starts are
 * serialised by migrate() like migration 1: ALTER TABLE runs once. */
static const char migration_2[] =
  "ALTER TABLE bindings ADD COLUMN owner TEXT NOT NULL DEFAULT '';"
  "CREATE INDEX bindings_creating ON bindings (owner, created_ms) WHERE state = 1";

const osr__migration_t osr__migrations[] = {
  {1, migration_1},
  {2, migration_2},
};
const size_t osr__nmigrations = OSR_ARRAY_SIZE(osr__migrations);
