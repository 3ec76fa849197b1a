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
#include <inttypes.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "store/store_int.h"
#include "util/log.h"
#include "util/mem.h"

#define BUSY_TIMEOUT_MS 5000
/* Checkpoints, all on the checkpoint thread and all small. The writer's
 * wal_hook (on_wal) wakes the thread whenever the WAL has grown by
 * CKPT_STEP_BYTES since the last wake-up (and a CKPT_TICK_MS timer catches
 * whatever is left when writes stop), and the thread copies what is new
 * with a PASSIVE checkpoint, which never takes the write lock: commits go
 * on appending meanwhile. A step of 1 MiB is ~1,000 of our 1 KiB pages, a
 * few milliseconds of copying, and it keeps the copy close behind the
 * writer instead of 100,000-330,000 frames behind it.
 *
 * PASSIVE alone never lets the WAL start over under sustained load: SQLite
 * rewinds it only when a write transaction begins with every frame already
 * copied, and commits arrive while each copy runs. So once the WAL holds
 * CKPT_RESTART_BYTES and a PASSIVE copy of the thread reached the WAL's end
 * (no reader on an older snapshot held it back), the thread sets
 * restart_due, and the writer, after its next batch is answered
 * (sq_after_batch), copies the few frames committed since with a PASSIVE
 * checkpoint of its own: between two of its transactions nothing new
 * arrives, so that copy reaches the end and its next transaction writes
 * from the WAL's start. That is a stall of the store queue for the copy and
 * its two fsyncs (WAL, database), every CKPT_RESTART_BYTES of WAL; the
 * thread syncs the database just before it asks (sync_db), so the writer's
 * database fsync has only its own few pages to flush, and the writer holds
 * the background reader off so that its copy is not wasted (sq_shared_t).
 *
 * It used to be a RESTART checkpoint on the thread, which holds the write
 * lock through the same copy and fsyncs: at 8 MiB it was 16 stalls of ~4 ms
 * per 20,000 creates and most of their slowest 1 %, at 32 MiB four (bench/
 * README "SQLite checkpoints off the commit path"). On a loaded CPU those
 * holds took 23-35 ms: the thread runs at CKPT_NICE and waited for the CPU
 * with the write lock held while the writer waited for it (bench/README
 * "SQLite restart on the writer"). The writer runs at the loop's priority,
 * and a PASSIVE checkpoint waits for no lock (it answers BUSY instead, and
 * the thread asks again after its next copy).
 *
 * The writer also checkpoints itself as a last resort, when the WAL reaches
 * WRITER_CHECKPOINT_BYTES, four times the normal size: the thread is
 * starved or failing, and it logs a warning. That bounds the WAL however
 * long the thread lags, and
 * journal_size_limit truncates a WAL file that outgrew the normal size once
 * it starts over (not below it: a WAL file that keeps its size is
 * overwritten in place, cheaper to fsync than one that grows). */
#define CKPT_TICK_MS 50
#define CKPT_STEP_BYTES    (1024 * 1024)
#define CKPT_RESTART_BYTES (32 * 1024 * 1024)
#define CKPT_LOCK_WAIT_US  1000
#define CKPT_LOCK_POLL_US  50
#define CKPT_YIELD_MS      20
/* Below the loop thread and the store worker, but not so low that a busy
 * CPU starves it: at nice 19 the WAL reached the writer's 128 MiB under
 * load, and a RESTART it had begun held the write lock for 310 ms while it
 * waited for the CPU; nice 10, 37-45 ms. */
#define CKPT_NICE               5
#define SLOTS_MAX 32
#define CONNECT_RETRY_MS 20
#define WRITER_CHECKPOINT_BYTES (128 * 1024 * 1024)
#define JOURNAL_SIZE_LIMIT      (64 * 1024 * 1024)
/* on_busy: how long a lock wait sleeps at a time, first finely (another
 * process's commit holds the write lock for a few ms; SQLite's own
 * busy_timeout would sleep 1, 2, 5, 10 ms... and oversleep its end), then
 * coarsely. */
#define BUSY_FINE_US    100
#define BUSY_FINE_TRIES 50
#define BUSY_COARSE_US  2000

/* Why a checkpoint thread: SQLite's default auto-checkpoint runs inside the
 * COMMIT that crosses 1000 WAL pages, on the writer, with two fsyncs (WAL,
 * then database). That commit then takes tens of milliseconds, and every
 * request in its group-commit batch waits for it: it was most of the p99 of
 * creates. A second connection on its own thread checkpoints instead, so the
 * writer's commits only append to the WAL. */
typedef struct ckpt_s {
  uv_thread_t thread;
  uv_mutex_t mu;
  uv_cond_t cv;
  int stop;
  int running;
  int wake; /* on_wal asked for a checkpoint (under mu) */
  const char *path;
  int sync_full;
  int restart_frames; /* CKPT_RESTART_BYTES in this database's pages */
  uint64_t deadline;  /* ckpt_busy: give up after this uv_hrtime() */
  atomic_int restart_due; /* set by the thread, taken by the writer (sq_after_batch) */
} ckpt_t;

/* The reader gate (cfg->be_shared, one per store, shared by its writer and
 * its background reader). The WAL starts over at the writer's first write
 * after its copy in sq_after_batch reached the WAL's end, and only if no
 * reader then holds a snapshot that began before that copy ended: SQLite
 * needs every read mark but the first (readers of a fully copied WAL use
 * that one) free. The background reader reads the reaper's pages back to
 * back at a low CPU priority, so during a pass over 60,000 bindings it
 * nearly always held one: the writer's copy and its two fsyncs ran, the WAL
 * did not start over, and the thread asked again: 9 stalls of 4-7 ms in
 * 0.5 s instead of one (bench/README "SQLite start-over, synced
 * ahead"). So the writer first holds the reader off (hold_until) and
 * copies only when the reader has no transaction open (reader_in); a
 * reader that begins after the copy reads the fully copied WAL's first
 * mark and is no obstacle. While the writer copies, the hold has no end
 * (hold_until = UINT64_MAX): a hold that ran out during a slow copy (a
 * loaded machine, the copy's fsyncs) let the reader begin a snapshot that
 * wasted it. The copy is bounded work, and so is that wait. A writer that
 * finds the reader inside a transaction holds it off for HOLD_MAX_MS at
 * most (at its BEGIN, on its own thread, never the loop's) and tries again
 * after its next batch. reader_in and
 * hold_until are stored before the other is loaded, both sequentially
 * consistent: either the writer sees the reader inside, or the reader sees
 * the hold. */
#define HOLD_MAX_MS  100
#define HOLD_POLL_US 200
typedef struct sq_shared_s {
  atomic_int reader_in;     /* the background reader may have a transaction open */
  atomic_ullong hold_until; /* uv_hrtime(): the reader begins none before this; 0 = no hold */
} sq_shared_t;

typedef struct sqlite_db_s {
  osr_store_t *st;
  sqlite3 *h;
  sqlite3_stmt *cache[OSR__ST_COUNT];
  /* Which argument each parameter slot of a cached statement takes
   * (slot_arg[stmt][j - 1] = N for "$N", 0 for a slot that is not ours);
   * slot_n[stmt] = the statement's slot count, or -1 when it has more than
   * SLOTS_MAX (then bind_args reads the names each time). Built once, when
   * the statement is prepared. */
  int16_t slot_arg[OSR__ST_COUNT][SLOTS_MAX];
  int16_t slot_n[OSR__ST_COUNT];
  sqlite3_stmt *cur;      /* statement being read by row_next */
  int cur_dynamic;        /* finalize cur at query_end */
  int reader;             /* the background reader: query_only, deferred BEGIN, no checkpointer */
  int wal_frames;         /* frames in the WAL after our last commit (on_wal) */
  int woke_at;            /* wal_frames when on_wal last woke the checkpoint thread */
  int copied_all;         /* sq_after_batch copied the whole WAL: the next commit starts it over */
  int step_frames;        /* CKPT_STEP_BYTES in this database's pages */
  int ckpt_frames;        /* WRITER_CHECKPOINT_BYTES in this database's pages */
  uint64_t busy_since;    /* on_busy: when the current lock wait began */
  ckpt_t ckpt;
} sqlite_db_t;

static void ckpt_trace(uint64_t t0, int rc, int nckpt, int nlog, const char *mode)
{
  if (nckpt > 0 || rc == SQLITE_OK)
    OSR_LOG_TRACE(
        "store", "sqlite checkpoint at %" PRIu64 ": %d of %d WAL frames in %" PRIu64 " us (%s%s)",
        t0 / 1000, nckpt, nlog, (uv_hrtime() - t0) / 1000, mode, rc == SQLITE_BUSY ? ", busy" : "");
}

/* The thread's lock waits (opening the file, reading the schema): short
 * polls, CKPT_LOCK_WAIT_US in all per round; a PASSIVE checkpoint itself
 * never waits. */
static int ckpt_busy(void *arg, int count)
{
  ckpt_t *c = arg;
  (void)count;
  if (uv_hrtime() >= c->deadline)
    return 0;
  usleep(CKPT_LOCK_POLL_US);
  return 1;
}

/* Flush the database file before the thread asks the writer to start the
 * WAL over. SQLite fsyncs the database only after a copy that reached the
 * WAL's end as it is when the copy ends, which under non-stop commits is
 * seldom the thread's: it was the writer's own copy before the WAL starts
 * over (sq_after_batch), whose fdatasync then carried every page the thread
 * had copied since the last one (up to 32 MiB of WAL's worth) and the
 * file's growth, while the store queue waited (bench/README "SQLite
 * start-over, synced ahead"). Synced here first, off the commit path, the
 * writer's is left with the few pages it copied itself; once per start-over, not per copy, so a page copied again and
 * again is written back once. The file handle is SQLite's own
 * (SQLITE_FCNTL_FILE_POINTER): a descriptor of ours would break the
 * process's POSIX locks when closed (sq_connect). A failure is harmless:
 * SQLite's own fsync still comes before the WAL starts over. */
static void sync_db(ckpt_t *c, sqlite3 *h)
{
  sqlite3_file *f = NULL;
  if (sqlite3_file_control(h, "main", SQLITE_FCNTL_FILE_POINTER, &f) == SQLITE_OK && f != NULL &&
      f->pMethods != NULL)
    (void)f->pMethods->xSync(f, c->sync_full ? SQLITE_SYNC_FULL : SQLITE_SYNC_NORMAL);
}

/* One round of the thread: copy what is new, then, if the WAL is long and
 * the copy reached its end, ask the writer to let it start over. Answers 0,
 * or -1 when the connection should be reopened. */
static int ckpt_round(ckpt_t *c, sqlite3 *h)
{
  int nlog = 0, nckpt = 0, rc;
  uint64_t t0 = uv_hrtime();

  c->deadline = t0 + CKPT_LOCK_WAIT_US * 1000u;
  rc = sqlite3_wal_checkpoint_v2(h, NULL, SQLITE_CHECKPOINT_PASSIVE, &nlog, &nckpt);
  if (rc != SQLITE_OK && rc != SQLITE_BUSY)
    return -1;
  ckpt_trace(t0, rc, nckpt, nlog, "passive");
  /* A reader (the background reader's page of a reaper pass) on an older
   * snapshot kept the copy short of the WAL's end: the writer's copy would
   * stop there too, and the WAL could not start over. */
  if (rc == SQLITE_OK && nlog >= c->restart_frames && nckpt == nlog) {
    sync_db(c, h);
    atomic_store_explicit(&c->restart_due, 1, memory_order_relaxed);
  }
  return 0;
}

static void ckpt_main(void *arg)
{
  ckpt_t *c = arg;
  sqlite3 *h = NULL;

  /* A lower CPU priority for this thread only (Linux: a thread's nice value
   * is its own). At nice 0 on a busy CPU the scheduler gave the whole-WAL
   * checkpoints of old whole time slices while the store worker and the
   * loop thread waited (bench/README.md "Create tail"); at nice 19 it fell
   * behind (README "SQLite checkpoints off the commit path"). Failing
   * leaves it at nice 0. */
  (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), CKPT_NICE);
  (void)pthread_setname_np(pthread_self(), "osr-ckpt");

  uv_mutex_lock(&c->mu);
  while (!c->stop) {
    int held;
    if (!c->wake)
      uv_cond_timedwait(&c->cv, &c->mu, (uint64_t)CKPT_TICK_MS * 1000000u);
    /* The writer is about to copy the WAL's last frames itself
     * (restart_due, sq_after_batch): a copy of ours meanwhile would make
     * its checkpoint answer SQLITE_BUSY, and where commits come faster than
     * we copy (one release build writing non-stop, a loaded CPU) we were
     * always copying and the WAL never started over. So wait for the writer
     * to take the request, CKPT_YIELD_MS at most (it waits for the
     * background reader's transaction to end, or has no batch to run). */
    for (held = 0; held < CKPT_YIELD_MS && !c->stop &&
                   atomic_load_explicit(&c->restart_due, memory_order_relaxed);
         held++)
      uv_cond_timedwait(&c->cv, &c->mu, 1000000u);
    c->wake = 0;
    if (c->stop)
      break;
    uv_mutex_unlock(&c->mu);
    if (h == NULL) {
      if (sqlite3_open_v2(c->path, &h, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
              SQLITE_OK ||
          sqlite3_busy_handler(h, ckpt_busy, c) != SQLITE_OK ||
          sqlite3_exec(h,
                       c->sync_full ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL",
                       NULL, NULL, NULL) != SQLITE_OK) {
        sqlite3_close_v2(h);
        h = NULL;
      }
    }
    /* On an error: reopen next round; a checkpoint missed now is done later. */
    if (h != NULL && ckpt_round(c, h) != 0) {
      sqlite3_close_v2(h);
      h = NULL;
    }
    uv_mutex_lock(&c->mu);
  }
  uv_mutex_unlock(&c->mu);
  if (h != NULL)
    sqlite3_close_v2(h);
}

static void ckpt_start(sqlite_db_t *d, const osr__store_cfg_t *cfg, int page)
{
  ckpt_t *c = &d->ckpt;
  if (c->running || strcmp(cfg->target, ":memory:") == 0)
    return;
  c->path = cfg->target;
  c->sync_full = cfg->sync_full;
  c->restart_frames = CKPT_RESTART_BYTES / page;
  c->stop = 0;
  c->wake = 0;
  atomic_store(&c->restart_due, 0);
  if (uv_mutex_init(&c->mu) != 0)
    return;
  if (uv_cond_init(&c->cv) != 0) {
    uv_mutex_destroy(&c->mu);
    return;
  }
  if (uv_thread_create(&c->thread, ckpt_main, c) != 0) {
    /* Without it the writer's last-resort checkpoint still bounds the WAL. */
    uv_cond_destroy(&c->cv);
    uv_mutex_destroy(&c->mu);
    return;
  }
  c->running = 1;
}

/* Set one of the thread's flags (wake, stop) and wake it: a short lock, no
 * wait (the writer's wal_hook calls it). */
static void ckpt_tell(ckpt_t *c, int *flag)
{
  if (!c->running)
    return;
  uv_mutex_lock(&c->mu);
  *flag = 1;
  uv_cond_signal(&c->cv);
  uv_mutex_unlock(&c->mu);
}

static void ckpt_stop(sqlite_db_t *d)
{
  ckpt_t *c = &d->ckpt;
  if (!c->running)
    return;
  ckpt_tell(c, &c->stop);
  uv_thread_join(&c->thread);
  uv_cond_destroy(&c->cv);
  uv_mutex_destroy(&c->mu);
  c->running = 0;
}

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
  {
    sq_shared_t *sh = osr_xcalloc(1, sizeof(*sh));
    atomic_init(&sh->reader_in, 0);
    atomic_init(&sh->hold_until, 0);
    cfg->be_shared = sh;
  }
  return 0;
}

static void sq_unconfigure(osr_store_t *st)
{
  osr__store_cfg_t *cfg = osr__store_cfg_mut(st);
  osr_free(cfg->be_shared);
  cfg->be_shared = NULL;
}

static sq_shared_t *shared(sqlite_db_t *d)
{
  return osr__store_cfg(d->st)->be_shared;
}

/* The background reader, before its BEGIN: wait while the writer holds it
 * off (see sq_shared_t), at most until hold_until. */
static void reader_enter(sq_shared_t *sh)
{
  for (;;) {
    uint64_t until;
    atomic_store(&sh->reader_in, 1);
    until = atomic_load(&sh->hold_until);
    if (until == 0 || uv_hrtime() >= until)
      return;
    atomic_store(&sh->reader_in, 0);
    usleep(HOLD_POLL_US);
  }
}

static osr__db_t *sq_db_new(osr_store_t *st)
{
  sqlite_db_t *d = osr_xcalloc(1, sizeof(*d));
  d->st = st;
  return (osr__db_t *)(void *)d;
}

/* The writer's wal_hook, which replaces SQLite's auto-checkpoint (that one
 * ran inside the COMMIT that crossed its threshold, so its whole batch
 * waited): it notes the WAL's size and wakes the checkpoint thread every
 * step_frames. */
static int on_wal(void *arg, sqlite3 *h, const char *name, int nframes)
{
  sqlite_db_t *d = arg;
  (void)h;
  (void)name;
  if (nframes < d->wal_frames)
    osr__store_count(d->st, OSR__EV_WAL_RESTART);
  else if (d->copied_all)
    osr__store_count(d->st, OSR__EV_WAL_RESTART_MISS);
  d->copied_all = 0;
  d->wal_frames = nframes;
  if (nframes < d->woke_at)
    d->woke_at = 0; /* the WAL started over */
  if (nframes - d->woke_at >= d->step_frames) {
    d->woke_at = nframes;
    ckpt_tell(&d->ckpt, &d->ckpt.wake);
  }
  return SQLITE_OK;
}

/* After the batch's answers are on their way: the writer's own PASSIVE
 * checkpoint, which, run between its transactions, copies every frame, so
 * its next write starts the WAL over. Either the checkpoint thread asked
 * for it (restart_due: it copied all but the last few frames of a long
 * WAL), or, the last resort, the thread let the WAL reach
 * WRITER_CHECKPOINT_BYTES (starved of CPU, or failing). */
static void sq_after_batch(osr__db_t *db)
{
  sqlite_db_t *d = S(db);
  int nlog = 0, nckpt = 0, rc, due;
  sq_shared_t *sh;
  uint64_t t0;

  if (d->h == NULL || d->reader || d->ckpt_frames <= 0)
    return;
  due = atomic_load_explicit(&d->ckpt.restart_due, memory_order_relaxed) &&
        atomic_exchange_explicit(&d->ckpt.restart_due, 0, memory_order_relaxed);
  /* A request from before the WAL last started over (the thread's timer
   * copied the same long WAL again meanwhile): nothing to do. */
  due = due && d->wal_frames >= d->ckpt.restart_frames;
  if (!due && d->wal_frames < d->ckpt_frames)
    return;
  /* Hold the background reader off, and wait for its transaction to end
   * if it has one open: its snapshot would keep the WAL from starting over
   * after the copy (sq_shared_t). The last resort does not wait. */
  sh = shared(d);
  if (due && sh != NULL) {
    atomic_store(&sh->hold_until, UINT64_MAX);
    if (atomic_load(&sh->reader_in) && d->wal_frames < d->ckpt_frames) {
      atomic_store(&sh->hold_until, uv_hrtime() + (uint64_t)HOLD_MAX_MS * 1000000u);
      atomic_store_explicit(&d->ckpt.restart_due, 1, memory_order_relaxed);
      return;
    }
  }
  t0 = uv_hrtime();
  rc = sqlite3_wal_checkpoint_v2(d->h, NULL, SQLITE_CHECKPOINT_PASSIVE, &nlog, &nckpt);
  if (sh != NULL)
    atomic_store(&sh->hold_until, 0);
  d->copied_all = due && rc == SQLITE_OK && nckpt == nlog;
  /* SQLITE_BUSY: the checkpoint thread is copying (it waits CKPT_YIELD_MS
   * at most for us to take the request): try again after the next batch,
   * as the last resort is. */
  if (due) {
    ckpt_trace(t0, rc, nckpt, nlog, "writer, restart");
    if (rc == SQLITE_BUSY)
      atomic_store_explicit(&d->ckpt.restart_due, 1, memory_order_relaxed);
    if (d->wal_frames < d->ckpt_frames)
      return;
  }
  d->wal_frames = 0;
  if (rc == SQLITE_OK) {
    OSR_LOG_WARN("store",
                 "sqlite: the checkpoint thread fell behind (WAL of %d frames); the writer "
                 "checkpointed %d of them itself in %" PRIu64 " us",
                 nlog, nckpt, (uv_hrtime() - t0) / 1000);
    ckpt_trace(t0, rc, nckpt, nlog, "writer, after its batch");
  }
}

/* Lock waits (another process writing):
 * short sleeps first, up to BUSY_TIMEOUT_MS in all. */
static int on_busy(void *arg, int count)
{
  sqlite_db_t *d = arg;
  uint64_t now = uv_hrtime();
  if (count == 0)
    d->busy_since = now;
  if (now - d->busy_since >= (uint64_t)BUSY_TIMEOUT_MS * 1000000u)
    return 0;
  usleep(count < BUSY_FINE_TRIES ? BUSY_FINE_US : BUSY_COARSE_US);
  return 1;
}

/* The background reader (store.c "Background reads"): a second connection
 * to the file, which WAL lets read while the writer writes. Not for
 * :memory:, where a second connection would be another database. */
static int sq_has_reader(const osr_store_t *st)
{
  return strcmp(osr__store_cfg(st)->target, ":memory:") != 0;
}

static osr__db_t *sq_db_new_reader(osr_store_t *st)
{
  sqlite_db_t *d = S(sq_db_new(st));
  d->reader = 1;
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
  if (d->reader && shared(d) != NULL)
    atomic_store(&shared(d)->reader_in, 0);
}

static void sq_db_free(osr__db_t *db)
{
  ckpt_stop(S(db));
  sq_disconnect(db);
  osr_free(db);
}

static int sq_is_connected(osr__db_t *db)
{
  return S(db)->h != NULL;
}

static int on_mode_row(void *arg, int ncol, char **vals, char **names)
{
  (void)names;
  if (ncol >= 1 && vals[0] != NULL)
    snprintf(arg, 16, "%s", vals[0]);
  return 0;
}

/* The database's page size (1024 for the files we create, 4096 for older
 * ones), 4096 if it cannot be read. */
static int page_size(sqlite_db_t *d)
{
  sqlite3_stmt *s = NULL;
  int n = 0;
  if (sqlite3_prepare_v2(d->h, "PRAGMA page_size", -1, &s, NULL) == SQLITE_OK &&
      sqlite3_step(s) == SQLITE_ROW)
    n = sqlite3_column_int(s, 0);
  sqlite3_finalize(s);
  return n >= 512 && n <= 65536 ? n : 4096;
}

static int sq_connect(osr__db_t *db)
{
  sqlite_db_t *d = S(db);
  const osr__store_cfg_t *cfg = osr__store_cfg(d->st);
  char *err = NULL;
  char pragmas[200], mode[16];
  struct stat sb;
  int rc, tries, is_new;

  if (d->h != NULL)
    return 0;
  /* The file holds API key hashes: owner-only. We must not open() and
   * close() the file ourselves: closing any descriptor of a file drops every
   * POSIX lock this process holds on it, including those of SQLite
   * connections already open here (another store, the checkpointer), which
   * silently breaks SQLite's locking. So SQLite creates the file and we
   * chmod it before anything is written; the -wal and -shm files SQLite
   * makes later copy the main file's mode. */
  is_new = strcmp(cfg->target, ":memory:") != 0 && stat(cfg->target, &sb) != 0 && errno == ENOENT;
  /* NOMUTEX: the connection is used by one thread only. */
  rc = sqlite3_open_v2(cfg->target, &d->h,
                       SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
  if (rc != SQLITE_OK) {
    rc = map_err(d, rc, "open");
    sq_disconnect(db);
    return rc == OSR_ECONFLICT ? OSR_EUNAVAILABLE : rc;
  }
  if (is_new && chmod(cfg->target, 0600) != 0)
    OSR_LOG_WARN("store", "sqlite: chmod 0600 %s: %s", cfg->target, strerror(errno));
  sqlite3_extended_result_codes(d->h, 1);
  sqlite3_busy_handler(d->h, on_busy, d);
  /* A page size of 1 KiB instead of 4 KiB for databases created from now
   * on (an existing file keeps its own: SQLite fixes it at creation). Every
   * commit appends each page it touched to the WAL, whole, and a create
   * touches about seven (the binding's B-tree leaf and its index leaves,
   * then the audit row's): with 4 KiB pages that was ~30 KB written per
   * create, and at thousands of creates per second the WAL writes, their
   * checksums and the checkpoints copying them back were most of the store
   * thread's time and the disk's. Rows here are a few hundred bytes, so the
   * deeper B-trees of a smaller page cost little. Ignored for an existing
   * database and harmless before the first table exists. */
  if (is_new)
    sqlite3_exec(d->h, "PRAGMA page_size = 1024", NULL, NULL, NULL);
  snprintf(pragmas, sizeof(pragmas),
           "PRAGMA synchronous = %s; PRAGMA foreign_keys = ON; PRAGMA wal_autocheckpoint = %d; "
           "PRAGMA journal_size_limit = %d;",
           cfg->sync_full ? "FULL" : "NORMAL", WRITER_CHECKPOINT_BYTES / page_size(d),
           JOURNAL_SIZE_LIMIT);
  /* Switching a new file to WAL needs an exclusive lock and SQLite does not
   * always consult the busy handler for it (two gateways creating one
   * database at once get SQLITE_BUSY at once), and when it cannot switch it
   * may just answer the old mode. So: retry, and check the answer. */
  for (tries = 0;; tries++) {
    mode[0] = '\0';
    rc = sqlite3_exec(d->h, "PRAGMA journal_mode = WAL", on_mode_row, mode, &err);
    if (rc == SQLITE_OK && (strcmp(mode, "wal") == 0 || strcmp(mode, "memory") == 0))
      break;
    sqlite3_free(err);
    err = NULL;
    if ((rc != SQLITE_OK && (rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED) ||
        tries * CONNECT_RETRY_MS >= BUSY_TIMEOUT_MS) {
      OSR_LOG_WARN("store", "sqlite: %s: cannot enter WAL mode (%s)", cfg->target,
                   rc != SQLITE_OK ? sqlite3_errstr(rc) : mode);
      sq_disconnect(db);
      return OSR_EUNAVAILABLE;
    }
    usleep(CONNECT_RETRY_MS * 1000);
  }
  rc = sqlite3_exec(d->h, pragmas, NULL, NULL, &err);
  if (rc == SQLITE_OK && d->reader)
    rc = sqlite3_exec(d->h, "PRAGMA query_only = 1", NULL, NULL, &err);
  if (rc != SQLITE_OK) {
    OSR_LOG_WARN("store", "sqlite: %s: %s", cfg->target, err != NULL ? err : sqlite3_errstr(rc));
    sqlite3_free(err);
    sq_disconnect(db);
    return OSR_EUNAVAILABLE;
  }
  if (!d->reader) {
    int page = page_size(d);
    ckpt_start(d, cfg, page);
    d->ckpt_frames = WRITER_CHECKPOINT_BYTES / page;
    d->step_frames = CKPT_STEP_BYTES / page;
    d->wal_frames = 0;
    d->woke_at = 0;
    sqlite3_wal_hook(d->h, on_wal, d);
  }
  return 0;
}

/* The argument number parameter slot j of `s` takes: N for "$N", else 0
 * (not one of ours: stays NULL, as an unbound parameter). */
static int slot_arg(sqlite3_stmt *s, int j)
{
  const char *name = sqlite3_bind_parameter_name(s, j);
  int n = 0;
  if (name == NULL || name[0] != '$')
    return 0;
  for (name++; *name >= '0' && *name <= '9' && n < 1000; name++)
    n = n * 10 + (*name - '0');
  return *name == '\0' ? n : 0;
}

static void map_slots(sqlite_db_t *d, int stmt)
{
  int j, count = sqlite3_bind_parameter_count(d->cache[stmt]);
  if (count > SLOTS_MAX) {
    d->slot_n[stmt] = -1;
    return;
  }
  for (j = 1; j <= count; j++)
    d->slot_arg[stmt][j - 1] = (int16_t)slot_arg(d->cache[stmt], j);
  d->slot_n[stmt] = (int16_t)count;
}

static int prepare(sqlite_db_t *d, int stmt, const char *sql, sqlite3_stmt **out)
{
  int rc;

  if (stmt >= 0) {
    if (d->cache[stmt] == NULL) {
      /* The reader's transactions only read: a deferred BEGIN takes no
       * write lock (IMMEDIATE would queue it behind the writer's). */
      const char *text = stmt != OSR__ST_BEGIN ? osr__stmt_sql[stmt]
                         : d->reader          ? "BEGIN"
                                              : osr__store_sqlite.begin_sql;
      rc = sqlite3_prepare_v3(d->h, text, -1, SQLITE_PREPARE_PERSISTENT, &d->cache[stmt], NULL);
      if (rc != SQLITE_OK)
        return map_err(d, rc, "prepare");
      map_slots(d, stmt);
    }
    *out = d->cache[stmt];
    return 0;
  }
  rc = sqlite3_prepare_v2(d->h, sql, -1, out, NULL);
  if (rc != SQLITE_OK)
    return map_err(d, rc, "prepare");
  return 0;
}

/* Walk the statement's parameter slots rather than our arguments: each
 * slot's name ("$N") says which argument it takes, and a name repeated in
 * the text shares one slot. Looking names up the other way round (format
 * "$N", then sqlite3_bind_parameter_index) cost a snprintf and a string
 * search per argument, ~30,000 instructions per create on the store thread;
 * reading the names at every bind still cost ~8,000, so cached statements
 * use the map made when they were prepared (`stmt` < 0: a dynamic one). */
static int bind_args(sqlite_db_t *d, int stmt, sqlite3_stmt *s, const osr__sql_arg_t *args,
                     int nargs)
{
  int j, n, rc, mapped = stmt >= 0 && d->slot_n[stmt] >= 0;
  int count = mapped ? d->slot_n[stmt] : sqlite3_bind_parameter_count(s);

  for (j = 1; j <= count; j++) {
    const osr__sql_arg_t *a;
    n = mapped ? d->slot_arg[stmt][j - 1] : slot_arg(s, j);
    if (n < 1 || n > nargs)
      continue; /* not one of ours: stays NULL, as an unbound parameter */
    a = &args[n - 1];
    if (a->is_int)
      rc = sqlite3_bind_int64(s, j, a->i);
    else if (a->s != NULL)
      /* STATIC: the strings live in the request until the statement is reset. */
      rc = sqlite3_bind_text(s, j, a->s, -1, SQLITE_STATIC);
    else
      rc = sqlite3_bind_null(s, j);
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
  if (d->reader && stmt == OSR__ST_BEGIN && shared(d) != NULL)
    reader_enter(shared(d));
  rv = prepare(d, stmt, sql, &s);
  if (rv == 0)
    rv = bind_args(d, stmt, s, args, nargs);
  if (rv == 0) {
    /* Statements that return rows (pragmas) are stepped to the end. */
    while ((rc = sqlite3_step(s)) == SQLITE_ROW)
      ;
    if (rc != SQLITE_DONE)
      rv = map_err(d, rc, "step");
    else if (changes != NULL)
      *changes = sqlite3_changes64(d->h);
  }
  if (s != NULL)
    finish(s, stmt < 0);
  /* No transaction open (it ended, or its BEGIN failed): no snapshot held. */
  if (d->reader && shared(d) != NULL && sqlite3_get_autocommit(d->h))
    atomic_store(&shared(d)->reader_in, 0);
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
  return bind_args(d, stmt, s, args, nargs);
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
  /* In process a statement costs no round trip: one row each. */
  .array_params = 0,
  .after_batch = sq_after_batch,
  .configure = sq_configure,
  .unconfigure = sq_unconfigure,
  .db_new = sq_db_new,
  .has_reader = sq_has_reader,
  .db_new_reader = sq_db_new_reader,
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
