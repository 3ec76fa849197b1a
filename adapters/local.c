/*
 * The `local` provider: real isolated sandboxes on the machine the gateway
 * runs on (docs/local-provider.md).
 *
 * Two isolation classes, each declared only when its runtime is installed:
 *   container  bubblewrap: user, pid, mount, net, ipc, uts and cgroup
 *              namespaces, no capabilities, no_new_privs, a seccomp denylist
 *              (local_seccomp.c), a per-sandbox host uid, cgroup limits (v2
 *              or v1, local_cgroup.c) or rlimits where there are none.
 *   gvisor     runsc (OCI bundle, `run --detach`) on the ptrace platform
 *              with --network=none; runsc applies the cgroup limits itself.
 *
 * Every sandbox gets a directory <state_dir>/<provider id>/ holding:
 *   meta.json  who it is (sandbox id label, tenant, class, pid, ...): the
 *              durable record list() reads, so a restarted gateway finds
 *              every sandbox it made.
 *   rw/        the writable layer (a size-capped tmpfs when we may mount):
 *              rw/home, rw/tmp and rw/etc become /home, /tmp and /etc.
 *              A snapshot is a tar of this directory.
 *   run/       bind-mounted at /run/osr: the agent creates agent.sock here,
 *              which is how the host reaches it (never the network).
 *   secret/    bind-mounted read-only at /run/osr-secret: the token file.
 *   log        the sandbox's stdout/stderr.
 * The sandbox's root is otherwise the host's /usr, read-only, with the
 * merged-/usr symlinks; nothing else of the host is visible.
 *
 * Sandboxes outlive the gateway on purpose (a restart must not kill user
 * work): the container wrapper is spawned detached and runsc sandboxes are
 * daemons. The TTL is enforced by a timer in the adapter, re-armed from
 * meta.json when a restarted gateway scans the state directory.
 *
 * Concurrency: all state lives on the loop thread. File-system work
 * (mkdir, mount, writing meta, killing a cgroup, rm -rf) runs in
 * uv_queue_work jobs that touch only their op's private copy and the
 * sandbox's immutable fields; external commands (bwrap, runsc, tar) run
 * through uv_spawn and continue from the exit callback. Nothing blocks the
 * loop.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "adapters/local_int.h"
#include "osr/adapter.h"
#include "util/log.h"
#include "util/mem.h"

#define MOD "local"
#define L_PATH 512
#define L_MAX_SANDBOXES 4096
#define L_MAX_ENV 256
#define L_MAX_ARGS 160
#define L_PROBE_MAX 4096
#define L_AGENT_IN "/opt/osr/osr-agent"
/* cpu.shares of a warm-pool sandbox until its handoff (1024 = the kernel's
 * default, which every handed-out sandbox gets). A refill boots in the
 * background while the sandbox just handed out runs its first commands;
 * at 1024 the two split the CPU evenly and the refill's boot (a gVisor
 * boot is ~200 ms of CPU) doubles the new sandbox's time to first byte.
 * At 128 the refill takes ~1/9 of a contended CPU: it still completes
 * within boot_timeout_ms next to a busy sandbox, and uses all idle CPU. */
#define L_POOL_CPU_SHARES 128u
#define L_CPU_SHARES 1024u
/* A gVisor refill's `runsc run` process is not in the sandbox's cgroup
 * (runsc makes it, and starts the gofer and the sandbox in it): its Go
 * start-up, spec load and cgroup set-up ran at full weight in the gateway's
 * cgroup, next to the first commands of the sandbox just handed out. It
 * runs under `nice -n 19` (weight 15 of 1024); the gofer and the sandbox
 * inherit that, which changes nothing inside their own cgroup (its
 * cpu.shares are the group's weight; nice only orders tasks of one group),
 * and nothing a user of the sandbox sees (gVisor emulates nice). */
#define L_NICE_PATH "/usr/bin/nice"

typedef struct lp_s lp_t;
typedef struct lsb_s lsb_t;
typedef struct lop_s lop_t;

/* One sandbox this process knows about (created here or found in the state
 * directory). Immutable after creation except the fields marked (loop). */
struct lsb_s {
  lsb_t *next;
  lp_t *lp;
  char id[40];                    /* provider id, also the directory name */
  char sandbox_id[OSR_NAME_MAX];  /* (loop) our label; "" while in the pool */
  char tenant[OSR_NAME_MAX];      /* (loop) */
  char tmpl[OSR_NAME_MAX];
  char dir[L_PATH];
  osr_isolation_t iso;
  uint32_t uid, mem_mib, vcpus, pids_max, disk_mib;
  int64_t pid;                    /* (loop) wrapper (container) or runsc sandbox pid */
  int64_t created_ms, expires_ms; /* (loop) */
  int warm;                       /* (loop) in the pool, not handed out */
  int ready;                      /* (loop) the agent answered */
  int paused;                     /* (loop) */
  long oom_seen;                  /* (loop) OOM kills already reported */
  int doomed;                     /* (loop) being destroyed: no new ops */
  int refs;                       /* (loop) ops and handles using this struct */
  uv_process_t proc;              /* container wrapper, when spawned by us */
  int proc_open;
  int stopped;                    /* (loop) its process is gone */
  int creating;                   /* (loop) a create op owns it */
  int gone;                       /* (loop) torn down, kept as a tombstone (sb_forget) */
  lop_t *handoff;                 /* (loop) a create waiting for the pool op to finish */
  uv_timer_t ttl;
  int ttl_open;
};

typedef enum {
  K_CREATE, K_DESTROY, K_GET, K_LIST, K_PAUSE, K_RESUME, K_SNAPSHOT, K_POOL, K_TTL,
} lop_kind_t;

/* Steps of the op state machine (op_next). */
typedef enum {
  S_PREP, S_UNTAR, S_SPAWN, S_RUNSC_RUN, S_READ_PID, S_PROBE, S_META,
  S_HANDOFF_WRITE, S_HANDOFF_JOIN,
  S_KILL_RUNSC, S_DELETE_RUNSC, S_CLEAN, S_UNLIST,
  S_CHECK, S_SCAN, S_FREEZE, S_RUNSC_PAUSE, S_TAR, S_DONE,
} lop_step_t;

struct lop_s {
  lop_t *next;
  lp_t *lp;
  lop_kind_t kind;
  lop_step_t step;
  lsb_t *sb;
  int status;             /* first error, sticky */
  int delivered;
  int cancelled;
  int pending;            /* outstanding async pieces (work, spawn, probe) */
  uv_timer_t timer;       /* delivery deferral, probe backoff */
  int timer_open;
  uv_work_t work;
  int work_rc;
  long oom_kills;         /* the sandbox's cgroup OOM kill count, read by the job; -1 = not read */
  /* create */
  char token[256];
  char env_blob[8192];    /* NUL-separated KEY=VALUE pairs from spec->env */
  size_t env_len;
  uint64_t deadline_ms;
  uint64_t t0_ns, tspawn_ns; /* create started / sandbox spawned (uv_hrtime), for the debug log */
  unsigned probe_attempt;
  int boot_exited;        /* the container wrapper died during boot */
  char snapshot_path[L_PATH]; /* restore source / snapshot output */
  char old_token[256];    /* pool handoff: the token the warm agent has */
  char sandbox_id[OSR_NAME_MAX]; /* pool handoff: the label and tenant it gets, */
  char tenant[OSR_NAME_MAX];     /* applied when it starts (handoff_start) */
  uint32_t timeout_s;
  int init_json_len;
  char *init_json;        /* pool handoff: POST /init body (osr_json_free) */
  int handoff_failed;
  struct lprobe_s *probe; /* the agent request in flight (op_probe), bounded by `timer` */
  /* list */
  osr_resource_t *list;
  size_t nlist, caplist;
  char (*found)[L_PATH];  /* state dir entries found by the scan */
  size_t nfound;
  lsb_t **scanned;        /* lsb_t records built by the scan (not yet in the table) */
  size_t nscanned;
  int scan_open;          /* counted in lp->scans until merged or freed */
  /* spawn */
  int spawn_exit;
  int pause_target;
  /* callbacks */
  union {
    osr_provider_create_cb create;
    osr_provider_done_cb done;
    osr_provider_get_cb get;
    osr_provider_list_cb list;
    osr_provider_snapshot_cb snap;
  } cb;
  void *data;
};

typedef struct lpool_s {
  osr_isolation_t iso;
  uint32_t target;
  uint32_t filling; /* pool creates in flight */
} lpool_t;

struct lp_s {
  osr_provider_t *p;
  /* configuration */
  char state_dir[300];
  char agent_path[L_PATH];
  char bwrap_path[L_PATH];
  char runsc_path[L_PATH];
  char runsc_platform[32];
  char cgroup_parent[OSR__LCG_PATH]; /* "" = choose (osr__lcg_probe) */
  unsigned iso_mask;
  uint32_t mem_default, mem_max, vcpus_default, vcpus_max, pids_max, disk_mib;
  uint32_t uid_base;
  uint32_t boot_timeout_ms;
  lpool_t pools[2];       /* [0] container, [1] gvisor */
  int pool_disabled;      /* the agent refused the handoff, or pool creates keep failing */
  unsigned pool_failures; /* pool creates failed in a row */
  /* host capabilities, probed at init */
  osr__lcg_t cg;
  int can_mount;
  int can_nice; /* L_NICE_PATH is executable (checked at init) */
  unsigned char bpf[2048];
  size_t bpf_len;
  /* state */
  lsb_t *sbx;
  size_t nsbx;
  lop_t *ops;
  size_t nops;
  int scanned;            /* the state directory was read once */
  unsigned scans;         /* list scans started and not yet merged (sb_forget) */
  int run_root;           /* state_dir is our own /run/osr/local-<hash> (see local_init) */
  uv_timer_t kick;        /* first scan and pool refills */
  int kick_open;
  osr__lreap_t reap;      /* gvisor: the orphans runsc leaves us (local_reap.c) */
  int reap_open;
  int reap_closing;
  int closing;
  void (*close_cb)(osr_provider_t *p);
  uint64_t seq;
};

/* ---- small helpers ------------------------------------------------------- */

/* snprintf through a function, so the compiler does not second-guess every
 * path built here: sizes are bounded by construction (state_dir < 300
 * bytes, ids < 40, L_PATH buffers), and an over-long result is truncated
 * and then fails to open rather than overflowing. */
static int fmt(char *dst, size_t len, const char *f, ...) OSR_PRINTF(3, 4);
static int fmt(char *dst, size_t len, const char *f, ...)
{
  va_list ap;
  va_start(ap, f);
  int n = vsnprintf(dst, len, f, ap);
  va_end(ap);
  return n;
}

static int64_t now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void cpy(char *dst, size_t len, const char *src)
{
  fmt(dst, len, "%s", src != NULL ? src : "");
}

static int pool_idx(osr_isolation_t iso)
{
  return iso == OSR_ISO_GVISOR ? 1 : 0;
}

/* Write a whole file (worker thread). */
static int write_file(const char *path, const void *data, size_t len, mode_t mode, uid_t uid)
{
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0)
    return -errno;
  const char *p = data;
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      int e = -errno;
      close(fd);
      return e;
    }
    p += w;
    len -= (size_t)w;
  }
  if (uid != (uid_t)-1 && fchown(fd, uid, uid) != 0) {
    int e = -errno;
    close(fd);
    return e;
  }
  if (fchmod(fd, mode) != 0) {
    int e = -errno;
    close(fd);
    return e;
  }
  return close(fd) == 0 ? 0 : -errno;
}

/* Atomic replace: write a temporary sibling, then rename over (worker). */
static int write_atomic(const char *path, const void *data, size_t len, mode_t mode, uid_t uid)
{
  char tmp[L_PATH + 8];
  fmt(tmp, sizeof(tmp), "%s.tmp", path);
  int rv = write_file(tmp, data, len, mode, uid);
  if (rv == 0 && rename(tmp, path) != 0)
    rv = -errno;
  if (rv != 0)
    unlink(tmp);
  return rv;
}

static int mkdir_owned(const char *path, mode_t mode, uid_t uid)
{
  if (mkdir(path, mode) != 0 && errno != EEXIST)
    return -errno;
  if (uid != (uid_t)-1 && chown(path, uid, uid) != 0)
    return -errno;
  return chmod(path, mode) == 0 ? 0 : -errno;
}

/* mkdir -p: missing components are created 0711 (traversable, not
 * listable), existing ones are left as they are (worker). */
static int mkdir_p(const char *path)
{
  char tmp[L_PATH];
  fmt(tmp, sizeof(tmp), "%s", path);
  for (char *s = tmp + 1; ; s++) {
    if (*s != '/' && *s != '\0')
      continue;
    char c = *s;
    *s = '\0';
    if (mkdir(tmp, 0711) != 0 && errno != EEXIST)
      return -errno;
    *s = c;
    if (c == '\0')
      return 0;
  }
}

/* Can every uid traverse `path`? Each existing component must be o+x;
 * missing ones will be created 0711 by mkdir_p. Called once at init on
 * local metadata only. */
static int path_traversable(const char *path)
{
  char tmp[L_PATH];
  fmt(tmp, sizeof(tmp), "%s", path);
  for (char *s = tmp + 1; ; s++) {
    if (*s != '/' && *s != '\0')
      continue;
    char c = *s;
    *s = '\0';
    struct stat st;
    if (stat(tmp, &st) != 0)
      return 1; /* from here on we create it */
    if (!(st.st_mode & S_IXOTH))
      return 0;
    *s = c;
    if (c == '\0')
      return 1;
  }
}

/* rm -rf without following symlinks or crossing a mount point (a bind
 * mount that failed to come off, e.g. the host's /usr under rootfs/),
 * bounded depth (worker). */
static void rm_rf_at(int dfd, const char *name, int depth)
{
  if (depth > 64)
    return;
  if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT)
    return;
  int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return;
  struct stat up, st;
  if (fstat(dfd, &up) != 0 || fstat(fd, &st) != 0 || up.st_dev != st.st_dev) {
    close(fd);
    return;
  }
  DIR *d = fdopendir(fd);
  if (d == NULL) {
    close(fd);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    rm_rf_at(dirfd(d), e->d_name, depth + 1);
  }
  closedir(d);
  unlinkat(dfd, name, AT_REMOVEDIR);
}

/* The start time of a process (field 22 of /proc/PID/stat), to tell our
 * pid from a recycled one; 0 if there is no such process. */
static uint64_t proc_start(int64_t pid)
{
  char path[64], buf[1024];
  if (pid <= 0)
    return 0;
  fmt(path, sizeof(path), "/proc/%lld/stat", (long long)pid);
  if (osr__local_read_small(path, buf, sizeof(buf)) <= 0)
    return 0;
  char *p = strrchr(buf, ')');
  if (p == NULL)
    return 0;
  /* After ") " come fields 3.. ; starttime is field 22. */
  int field = 2;
  for (char *s = p + 1; *s != '\0'; s++) {
    if (*s == ' ') {
      field++;
      if (field == 22)
        return strtoull(s + 1, NULL, 10);
    }
  }
  return 0;
}

static int proc_is_zombie(int64_t pid)
{
  char path[64], buf[512];
  fmt(path, sizeof(path), "/proc/%lld/stat", (long long)pid);
  if (osr__local_read_small(path, buf, sizeof(buf)) <= 0)
    return 1;
  char *p = strrchr(buf, ')');
  return p == NULL || p[1] == '\0' || p[2] == 'Z' || p[2] == 'X';
}

/* ---- sandbox table -------------------------------------------------------- */

static lsb_t *sb_find(lp_t *lp, const char *id)
{
  for (lsb_t *s = lp->sbx; s != NULL; s = s->next)
    if (strcmp(s->id, id) == 0)
      return s;
  return NULL;
}

static void sb_unlink(lp_t *lp, lsb_t *sb)
{
  for (lsb_t **pp = &lp->sbx; *pp != NULL; pp = &(*pp)->next) {
    if (*pp == sb) {
      *pp = sb->next;
      lp->nsbx--;
      sb->next = NULL;
      return;
    }
  }
}

static int sb_in_table(lp_t *lp, lsb_t *sb)
{
  for (lsb_t *s = lp->sbx; s != NULL; s = s->next)
    if (s == sb)
      return 1;
  return 0;
}

static void sb_maybe_free(lsb_t *sb)
{
  if (sb->refs == 0 && !sb->proc_open && !sb->ttl_open && !sb_in_table(sb->lp, sb))
    osr_free(sb);
}

static void sb_unref(lsb_t *sb)
{
  sb->refs--;
  sb_maybe_free(sb);
}

static void maybe_close_done(lp_t *lp);

static void on_sb_ttl_close(uv_handle_t *h)
{
  lsb_t *sb = h->data;
  lp_t *lp = sb->lp;
  sb->ttl_open = 0;
  sb_maybe_free(sb);
  maybe_close_done(lp);
}

static void on_sb_proc_close(uv_handle_t *h)
{
  lsb_t *sb = h->data;
  lp_t *lp = sb->lp;
  sb->proc_open = 0;
  sb_maybe_free(sb);
  maybe_close_done(lp);
}

/* Forget a sandbox (after destroy, or at close): close its handles; the
 * struct is freed once they and every op holding it are done. */
static void sb_remove(lp_t *lp, lsb_t *sb)
{
  sb_unlink(lp, sb);
  if (sb->ttl_open && !uv_is_closing((uv_handle_t *)&sb->ttl))
    uv_close((uv_handle_t *)&sb->ttl, on_sb_ttl_close);
  /* The wrapper's process handle stays open until it exits (on_wrapper_exit
   * closes it), so libuv still reaps it. At provider close we close it
   * anyway: the sandbox keeps running and init adopts the zombie. */
  if (lp->closing && sb->proc_open && !uv_is_closing((uv_handle_t *)&sb->proc))
    uv_close((uv_handle_t *)&sb->proc, on_sb_proc_close);
  sb_maybe_free(sb);
}

/* A teardown finished (its meta.json is gone). A list scan that started
 * before then may still have read that meta.json: if the record left the
 * table now, the scan's merge would adopt the sandbox again as one made by
 * an earlier process and list it forever. So while any scan is in flight
 * the record stays in the table, doomed (never listed, never found), and
 * the last scan to merge sweeps such tombstones out (scan_end). */
static void sb_forget(lp_t *lp, lsb_t *sb)
{
  if (!sb_in_table(lp, sb))
    return;
  if (lp->scans > 0 && !lp->closing)
    sb->gone = 1;
  else
    sb_remove(lp, sb);
}

/* A list op's scan is merged (or abandoned): once no scan is in flight,
 * no tombstone can be re-adopted any more. */
static void scan_end(lop_t *op)
{
  lp_t *lp = op->lp;
  if (!op->scan_open)
    return;
  op->scan_open = 0;
  if (--lp->scans > 0 || lp->closing)
    return;
  for (lsb_t *s = lp->sbx, *next; s != NULL; s = next) {
    next = s->next;
    if (s->gone)
      sb_remove(lp, s);
  }
}

static lsb_t *sb_new(lp_t *lp, const char *id, osr_isolation_t iso)
{
  lsb_t *sb = osr_xcalloc(1, sizeof(*sb));
  sb->lp = lp;
  cpy(sb->id, sizeof(sb->id), id);
  fmt(sb->dir, sizeof(sb->dir), "%s/%s", lp->state_dir, id);
  sb->iso = iso;
  return sb;
}

static void sb_insert(lp_t *lp, lsb_t *sb)
{
  sb->next = lp->sbx;
  lp->sbx = sb;
  lp->nsbx++;
}

static void fill_resource(const lsb_t *sb, osr_resource_t *r)
{
  memset(r, 0, sizeof(*r));
  cpy(r->provider_id, sizeof(r->provider_id), sb->id);
  cpy(r->sandbox_id, sizeof(r->sandbox_id), sb->sandbox_id);
  r->isolation = sb->iso;
  fmt(r->agent_endpoint, sizeof(r->agent_endpoint), "unix:%s/run/agent.sock", sb->dir);
  r->state = sb->stopped ? OSR_RES_STOPPED
             : sb->paused ? OSR_RES_PAUSED
             : sb->ready  ? OSR_RES_RUNNING
                          : OSR_RES_STARTING;
  r->granted.min_memory_mib = sb->mem_mib;
  r->granted.vcpus = sb->vcpus;
  r->granted.isolation = sb->iso;
  r->granted.snapshot = 1;
}

static json_t *meta_json(const lsb_t *sb)
{
  char ep[L_PATH + 32];
  fmt(ep, sizeof(ep), "unix:%s/run/agent.sock", sb->dir);
  return json_pack("{s:i, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:s, s:i, s:i, s:i, s:i, "
                   "s:i, s:b, s:b}",
                   "version", 1, "provider_id", sb->id, OSR_LABEL_SANDBOX_ID, sb->sandbox_id,
                   OSR_LABEL_TENANT, sb->tenant, "template", sb->tmpl, "class",
                   osr_isolation_name(sb->iso), "pid", (json_int_t)sb->pid, "created_ms",
                   (json_int_t)sb->created_ms, "expires_ms", (json_int_t)sb->expires_ms,
                   "pid_start", (json_int_t)0, "agent_endpoint", ep, "uid", (int)sb->uid,
                   "memory_mib", (int)sb->mem_mib, "vcpus", (int)sb->vcpus, "pids_max",
                   (int)sb->pids_max, "disk_mib", (int)sb->disk_mib, "warm", sb->warm, "ready",
                   sb->ready);
}

/* ---- ops -------------------------------------------------------------------- */

static void op_next(lop_t *op);
static void op_finish(lop_t *op);
static int op_work(lop_t *op, void (*fn)(uv_work_t *w));
static void handoff_release(lsb_t *sb, int ok);
static void pool_kick(lp_t *lp);
static void on_kick(uv_timer_t *t);

static void op_unlink(lp_t *lp, lop_t *op)
{
  for (lop_t **pp = &lp->ops; *pp != NULL; pp = &(*pp)->next) {
    if (*pp == op) {
      *pp = op->next;
      lp->nops--;
      return;
    }
  }
}

static void op_free(lop_t *op)
{
  lp_t *lp = op->lp;
  op_unlink(lp, op);
  scan_end(op);
  if (op->sb != NULL && op->sb->handoff == op)
    op->sb->handoff = NULL; /* a waiting handoff that ended (close) */
  if (op->kind == K_POOL && op->sb != NULL)
    handoff_release(op->sb, 0);
  if (op->sb != NULL)
    sb_unref(op->sb);
  osr_free(op->list);
  osr_free(op->found);
  if (op->scanned != NULL) {
    for (size_t i = 0; i < op->nscanned; i++)
      osr_free(op->scanned[i]);
    osr_free(op->scanned);
  }
  if (op->init_json != NULL)
    osr_json_free(op->init_json);
  osr_free(op);
  maybe_close_done(lp);
}

static void on_op_timer_close(uv_handle_t *h)
{
  lop_t *op = h->data;
  op->timer_open = 0;
  if (op->pending == 0)
    op_free(op);
}

static lop_t *op_new(lp_t *lp, lop_kind_t kind, lsb_t *sb, void *cb, void *data)
{
  lop_t *op = osr_xcalloc(1, sizeof(*op));
  op->lp = lp;
  op->kind = kind;
  op->sb = sb;
  if (sb != NULL)
    sb->refs++;
  op->cb.create = (osr_provider_create_cb)cb;
  op->data = data;
  uv_timer_init(lp->p->loop, &op->timer);
  op->timer.data = op;
  op->timer_open = 1;
  op->work.data = op;
  op->next = lp->ops;
  lp->ops = op;
  lp->nops++;
  return op;
}

/* Deliver the result to the caller exactly once, then release the op when
 * nothing is pending on it. */
static void op_deliver(lop_t *op)
{
  lp_t *lp = op->lp;
  osr_provider_t *p = lp->p;
  if (op->delivered)
    return;
  op->delivered = 1;
  int st = op->cancelled ? OSR_ECANCELED : op->status;
  osr_resource_t r;
  switch (op->kind) {
  case K_CREATE:
  case K_RESUME:
    if (op->cb.create != NULL) {
      if (st == 0)
        fill_resource(op->sb, &r);
      op->cb.create(p, st, st == 0 ? &r : NULL, op->data);
    }
    break;
  case K_GET:
    if (st == 0)
      fill_resource(op->sb, &r);
    op->cb.get(p, st, st == 0 ? &r : NULL, op->data);
    break;
  case K_LIST:
    op->cb.list(p, st, op->list, st == 0 ? op->nlist : 0, op->data);
    break;
  case K_DESTROY:
  case K_PAUSE:
    if (op->cb.done != NULL)
      op->cb.done(p, st, op->data);
    break;
  case K_SNAPSHOT:
    op->cb.snap(p, st, st == 0 ? op->snapshot_path : NULL, op->data);
    break;
  case K_POOL:
  case K_TTL:
    break;
  }
}

static void op_finish(lop_t *op)
{
  op_deliver(op);
  if (op->timer_open && !uv_is_closing((uv_handle_t *)&op->timer))
    uv_close((uv_handle_t *)&op->timer, on_op_timer_close);
}

static void op_fail(lop_t *op, int status)
{
  if (op->status == 0)
    op->status = status;
}

/* An async piece finished: continue, or free if the op already ended. */
static void op_piece_done(lop_t *op)
{
  op->pending--;
  if (op->delivered && !op->timer_open) {
    if (op->pending == 0)
      op_free(op);
    return;
  }
  op_next(op);
}

static void on_op_timer(uv_timer_t *t)
{
  lop_t *op = t->data;
  op_next(op);
}

/* ---- thread-pool jobs ----------------------------------------------------------- */

/* Report OOM kills the last job saw (get and destroy read the count):
 * the process got SIGKILL (exit 137 through the agent), and the operator
 * learns why from this line. */
static void oom_note(lop_t *op)
{
  lsb_t *sb = op->sb;
  if (sb == NULL || op->oom_kills <= sb->oom_seen)
    return;
  OSR_LOG_WARN(MOD, "%s (%s): the kernel OOM-killed %ld process(es) at the %u MiB memory limit",
               sb->id, sb->sandbox_id[0] ? sb->sandbox_id : "pool", op->oom_kills - sb->oom_seen,
               sb->mem_mib);
  sb->oom_seen = op->oom_kills;
}

static void on_work_done(uv_work_t *w, int status)
{
  lop_t *op = w->data;
  oom_note(op);
  if (status != 0)
    op_fail(op, status);
  else if (op->work_rc != 0)
    op_fail(op, op->work_rc);
  op_piece_done(op);
}

static int op_work(lop_t *op, void (*fn)(uv_work_t *w))
{
  op->work_rc = 0;
  op->oom_kills = -1;
  int rv = uv_queue_work(op->lp->p->loop, &op->work, fn, on_work_done);
  if (rv == 0)
    op->pending++;
  return rv;
}

/* Write /etc files of the sandbox's own (worker). */
static int write_etc(const lsb_t *sb)
{
  char path[L_PATH + 32], buf[512];
  int rv;
  fmt(path, sizeof(path), "%s/rw/etc/passwd", sb->dir);
  fmt(buf, sizeof(buf),
           "root:x:0:0:root:/root:/bin/sh\nuser:x:%u:%u:user:/home/user:/bin/bash\n"
           "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
           sb->uid, sb->uid);
  if ((rv = write_file(path, buf, strlen(buf), 0644, sb->uid)) != 0)
    return rv;
  fmt(path, sizeof(path), "%s/rw/etc/group", sb->dir);
  fmt(buf, sizeof(buf), "root:x:0:\nuser:x:%u:\nnogroup:x:65534:\n", sb->uid);
  if ((rv = write_file(path, buf, strlen(buf), 0644, sb->uid)) != 0)
    return rv;
  static const char hosts[] = "127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost\n";
  fmt(path, sizeof(path), "%s/rw/etc/hosts", sb->dir);
  if ((rv = write_file(path, hosts, sizeof(hosts) - 1, 0644, sb->uid)) != 0)
    return rv;
  fmt(path, sizeof(path), "%s/rw/etc/hostname", sb->dir);
  if ((rv = write_file(path, "sandbox\n", 8, 0644, sb->uid)) != 0)
    return rv;
  /* No resolver: the sandbox has no network (the egress allowlist of a
   * later issue will write one). */
  fmt(path, sizeof(path), "%s/rw/etc/resolv.conf", sb->dir);
  if ((rv = write_file(path, "", 0, 0644, sb->uid)) != 0)
    return rv;
  static const char nss[] = "passwd: files\ngroup: files\nhosts: files\n";
  fmt(path, sizeof(path), "%s/rw/etc/nsswitch.conf", sb->dir);
  return write_file(path, nss, sizeof(nss) - 1, 0644, sb->uid);
}

static int write_meta(const lsb_t *sb)
{
  json_t *j = meta_json(sb);
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (s == NULL)
    return OSR_ENOMEM;
  char path[L_PATH + 16];
  fmt(path, sizeof(path), "%s/meta.json", sb->dir);
  int rv = write_atomic(path, s, strlen(s), 0600, (uid_t)-1);
  osr_json_free(s);
  return rv;
}

/* The read-only parts of the host's /etc a sandbox sees (both classes). */
static const char *const etc_ro[] = {"/etc/alternatives", "/etc/ssl", "/etc/ca-certificates",
                                     "/etc/ld.so.cache"};

/* The OCI bundle for runsc (worker). */
static int write_bundle(const lop_t *op)
{
  const lsb_t *sb = op->sb;
  const lp_t *lp = op->lp;
  char root[L_PATH + 16], path[L_PATH + 64];
  int rv;
  fmt(root, sizeof(root), "%s/rootfs", sb->dir);
  if ((rv = mkdir_owned(root, 0755, (uid_t)-1)) != 0)
    return rv;
  static const char *const dirs[] = {"usr", "etc", "home", "tmp", "run", "run/osr",
                                     "run/osr-secret", "opt", "opt/osr", "proc", "dev", "sys"};
  for (size_t i = 0; i < OSR_ARRAY_SIZE(dirs); i++) {
    fmt(path, sizeof(path), "%s/%s", root, dirs[i]);
    if ((rv = mkdir_owned(path, 0755, (uid_t)-1)) != 0)
      return rv;
  }
  static const char *const links[][2] = {
    {"usr/bin", "bin"}, {"usr/sbin", "sbin"}, {"usr/lib", "lib"}, {"usr/lib64", "lib64"}};
  for (size_t i = 0; i < OSR_ARRAY_SIZE(links); i++) {
    fmt(path, sizeof(path), "%s/%s", root, links[i][1]);
    if (symlink(links[i][0], path) != 0 && errno != EEXIST)
      return -errno;
  }
  fmt(path, sizeof(path), "%s/opt/osr/osr-agent", root);
  if ((rv = write_file(path, "", 0, 0755, (uid_t)-1)) != 0)
    return rv;

  json_t *env = json_array();
  json_array_append_new(env, json_string("PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"));
  json_array_append_new(env, json_string("HOME=/home/user"));
  json_array_append_new(env, json_string("USER=user"));
  json_array_append_new(env, json_string("LANG=C.UTF-8"));
  json_t *mounts = json_array();
#define MNT(dst, type, src, o1, o2)                                                               \
  json_array_append_new(mounts, json_pack("{s:s, s:s, s:s, s:[s,s]}", "destination", (dst),         \
                                          "type", (type), "source", (src), "options", (o1), (o2)))
  char rw[L_PATH + 32], b[L_PATH + 32];
  /* /usr is not a runsc mount: prep_work binds it into rootfs/ on the host,
   * so that it is part of gVisor's root mount (see bind_usr). */
  fmt(rw, sizeof(rw), "%s/rw/etc", sb->dir);
  MNT("/etc", "bind", rw, "rbind", "rw");
  /* The read-only parts of the host's /etc are not runsc mounts either:
   * prep_work binds them inside rw/etc (bind_host_ro), where the /etc
   * volume shows them, and the agent onto rootfs/opt/osr/osr-agent, part
   * of the root mount. Each runsc mount is a gofer mount point and a
   * channel the sentry sets up at boot: 12 -> 7 of them, 7 % less CPU per
   * boot (results/tti.md). */
  for (size_t i = 0; i < OSR_ARRAY_SIZE(etc_ro); i++) {
    struct stat st;
    if (stat(etc_ro[i], &st) != 0)
      continue;
    fmt(b, sizeof(b), "%s/rw%s", sb->dir, etc_ro[i]);
    if (S_ISDIR(st.st_mode))
      mkdir_owned(b, 0755, (uid_t)-1);
    else if (access(b, F_OK) != 0)
      write_file(b, "", 0, 0644, (uid_t)-1);
  }
  fmt(rw, sizeof(rw), "%s/rw/home", sb->dir);
  MNT("/home", "bind", rw, "rbind", "rw");
  fmt(rw, sizeof(rw), "%s/rw/tmp", sb->dir);
  MNT("/tmp", "bind", rw, "rbind", "rw");
  fmt(rw, sizeof(rw), "%s/run", sb->dir);
  MNT("/run/osr", "bind", rw, "rbind", "rw");
  fmt(rw, sizeof(rw), "%s/secret", sb->dir);
  MNT("/run/osr-secret", "bind", rw, "rbind", "ro");
  MNT("/proc", "proc", "proc", "nosuid", "noexec");
  MNT("/dev", "tmpfs", "tmpfs", "nosuid", "mode=755");
#undef MNT
  char cgpath[OSR__LCG_PATH + 48];
  osr__lcg_cgroups_path(&lp->cg, sb->id, cgpath, sizeof(cgpath));
  json_t *res = json_pack("{s:{s:I}, s:{s:I}, s:{s:I, s:I}}", "memory", "limit",
                          (json_int_t)sb->mem_mib << 20, "pids", "limit", (json_int_t)sb->pids_max,
                          "cpu", "quota", (json_int_t)sb->vcpus * 100000, "period",
                          (json_int_t)100000);
  if (res != NULL)
    json_object_set_new(json_object_get(res, "cpu"), "shares",
                        json_integer(sb->warm ? L_POOL_CPU_SHARES : L_CPU_SHARES));
  json_t *cfg = json_pack(
    "{s:s, s:{s:b, s:{s:i, s:i}, s:[s,s,s,s,s], s:o, s:s, s:{}, s:b, s:[{s:s, s:I, s:I}]}, "
    "s:{s:s, s:b}, s:s, s:o, s:{s:[{s:s},{s:s},{s:s},{s:s},{s:s}], s:s, s:o}}",
    "ociVersion", "1.0.2", "process", "terminal", 0, "user", "uid", (int)sb->uid, "gid",
    (int)sb->uid, "args", L_AGENT_IN, "--listen", "unix:/run/osr/agent.sock", "--token-file",
    "/run/osr-secret/token", "env", env, "cwd", "/home/user", "capabilities", "noNewPrivileges", 1,
    "rlimits", "type", "RLIMIT_NOFILE", "hard", (json_int_t)4096, "soft", (json_int_t)4096, "root",
    "path", "rootfs", "readonly", 1, "hostname", "sandbox", "mounts", mounts, "linux",
    "namespaces", "type", "pid", "type", "ipc", "type", "uts", "type", "mount", "type", "network",
    "cgroupsPath", cgpath, "resources", res);
  if (cfg != NULL && op->token[0] == '\0') {
    /* No token: drop "--token-file F" (the agent runs open, as envd). */
    json_t *args = json_object_get(json_object_get(cfg, "process"), "args");
    json_array_remove(args, 4);
    json_array_remove(args, 3);
  }
  if (cfg != NULL) {
    /* spec->env: the sandbox's variables for every process (see
     * spawn_container). */
    json_t *args = json_object_get(json_object_get(cfg, "process"), "args");
    for (size_t off = 0; off < op->env_len;) {
      json_array_append_new(args, json_string("--env"));
      json_array_append_new(args, json_string(op->env_blob + off));
      off += strlen(op->env_blob + off) + 1;
    }
  }
  if (cfg == NULL)
    return OSR_ENOMEM;
  char *s = json_dumps(cfg, JSON_INDENT(1));
  json_decref(cfg);
  if (s == NULL)
    return OSR_ENOMEM;
  fmt(path, sizeof(path), "%s/config.json", sb->dir);
  rv = write_file(path, s, strlen(s), 0600, (uid_t)-1);
  osr_json_free(s);
  return rv;
}

/* Bind src read-only (nosuid, nodev) onto dst (worker). For gVisor, the
 * host's /usr goes onto rootfs/usr this way rather than as a runsc bind
 * mount: a runsc bind mount ("volume") is served with
 * --file-access-mounts=shared: the
 * sentry revalidates every path component with the gofer on each lookup,
 * ~20 gofer round trips per exec of /bin/sh (its path, ld.so, libc). Inside
 * the root mount the same tree is cached (exclusive, the root's default):
 * the host's /usr is not written while a sandbox runs (a package upgrade is
 * seen by sandboxes booted after it). The writable mounts stay shared
 * volumes: the host reads and writes them while the sandbox runs
 * (snapshots, the token). clean_work unmounts it. */
static int bind_ro(const char *src, const char *dst)
{
  if (mount(src, dst, NULL, MS_BIND | MS_REC, NULL) != 0)
    return -errno;
  if (mount(NULL, dst, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) != 0) {
    int e = -errno;
    umount2(dst, MNT_DETACH);
    return e;
  }
  return 0;
}

/* gVisor: every read-only host path of the sandbox as a host bind mount
 * (worker): /usr and the agent into rootfs/ (the root mount, cached),
 * the read-only parts of /etc into rw/etc (seen through the /etc volume;
 * write_bundle made their mount points). clean_work unmounts them: rw/
 * with everything below it, rootfs/usr and the agent one by one. */
static int bind_host_ro(const lsb_t *sb)
{
  char path[L_PATH + 48];
  int rv;
  fmt(path, sizeof(path), "%s/rootfs/usr", sb->dir);
  if ((rv = bind_ro("/usr", path)) != 0)
    return rv;
  fmt(path, sizeof(path), "%s/rootfs%s", sb->dir, L_AGENT_IN);
  if ((rv = bind_ro(sb->lp->agent_path, path)) != 0)
    return rv;
  for (size_t i = 0; i < OSR_ARRAY_SIZE(etc_ro); i++) {
    fmt(path, sizeof(path), "%s/rw%s", sb->dir, etc_ro[i]);
    if (access(etc_ro[i], F_OK) == 0 && (rv = bind_ro(etc_ro[i], path)) != 0)
      return rv;
  }
  return 0;
}

/* Create the sandbox's directories, writable layer, token and cgroups
 * (worker). Everything created here is removed by clean_work. */
static void prep_work(uv_work_t *w)
{
  lop_t *op = w->data;
  lsb_t *sb = op->sb;
  const lp_t *lp = op->lp;
  char path[L_PATH + 64];
  int rv;

  /* The state directory must be traversable by the sandbox uids (bwrap
   * resolves its bind sources as that uid). */
  if ((rv = mkdir_p(lp->state_dir)) != 0)
    goto out;
  if ((rv = mkdir_owned(sb->dir, 0711, (uid_t)-1)) != 0)
    goto out;
  fmt(path, sizeof(path), "%s/rw", sb->dir);
  if ((rv = mkdir_owned(path, 0755, (uid_t)-1)) != 0)
    goto out;
  if (lp->can_mount) {
    char opts[128];
    fmt(opts, sizeof(opts), "size=%um,mode=0700,uid=%u,gid=%u,nr_inodes=%u", sb->disk_mib,
             sb->uid, sb->uid, sb->disk_mib * 64u + 1024u);
    if (mount("osr-sandbox", path, "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0) {
      rv = -errno;
      goto out;
    }
  } else if (chown(path, sb->uid, sb->uid) != 0 || chmod(path, 0700) != 0) {
    rv = -errno;
    goto out;
  }
  static const char *const sub[] = {"rw/home", "rw/home/user", "rw/tmp", "rw/etc", "run",
                                     "secret"};
  for (size_t i = 0; i < OSR_ARRAY_SIZE(sub); i++) {
    fmt(path, sizeof(path), "%s/%s", sb->dir, sub[i]);
    /* Only this sandbox's uid (and root) may enter rw/, run/ and secret/:
     * the directory above them is root's 0711, so other sandbox uids can
     * neither list nor enter anything of this sandbox. */
    mode_t mode = strcmp(sub[i], "rw/tmp") == 0   ? 01777
                  : strcmp(sub[i], "secret") == 0 ? 0500
                  : strcmp(sub[i], "run") == 0    ? 0700
                                                  : 0755;
    if ((rv = mkdir_owned(path, mode, sb->uid)) != 0)
      goto out;
  }
  if ((rv = write_etc(sb)) != 0)
    goto out;
  fmt(path, sizeof(path), "%s/secret/token", sb->dir);
  if ((rv = write_file(path, op->token, strlen(op->token), 0400, sb->uid)) != 0)
    goto out;
  fmt(path, sizeof(path), "%s/log", sb->dir);
  if ((rv = write_file(path, "", 0, 0600, (uid_t)-1)) != 0)
    goto out;

  if (sb->iso == OSR_ISO_CONTAINER) {
    osr__lcg_limits_t lim = {.mem_bytes = (uint64_t)sb->mem_mib << 20,
                             .pids_max = sb->pids_max,
                             .vcpus = sb->vcpus,
                             .cpu_shares = sb->warm ? L_POOL_CPU_SHARES : L_CPU_SHARES};
    if ((rv = osr__lcg_create(&lp->cg, sb->id, &lim, sb->uid)) != 0)
      goto out;
  } else {
    /* runsc makes /osr/<id> itself; on v2 its parent must exist with the
     * controllers enabled for it. */
    if ((rv = osr__lcg_parent(&lp->cg)) != 0 || (rv = write_bundle(op)) != 0 ||
        (rv = bind_host_ro(sb)) != 0)
      goto out;
  }
  rv = write_meta(sb);
out:
  op->work_rc = rv;
}

/* Tear a sandbox down completely (worker): kill its processes, remove its
 * cgroups, unmount and delete its directory. Idempotent. */
static void clean_work(uv_work_t *w)
{
  lop_t *op = w->data;
  lsb_t *sb = op->sb;
  char path[L_PATH + 32];
  if (sb->iso == OSR_ISO_CONTAINER && sb->pid > 0 && proc_start(sb->pid) != 0)
    kill((pid_t)sb->pid, SIGKILL); /* the wrapper: bwrap's --die-with-parent follows */
  if (sb->iso == OSR_ISO_CONTAINER)
    op->oom_kills = osr__lcg_oom_kills(&op->lp->cg, sb->id);
  osr__lcg_remove(&op->lp->cg, sb->id);
  fmt(path, sizeof(path), "%s/rw", sb->dir);
  umount2(path, MNT_DETACH);
  if (sb->iso == OSR_ISO_GVISOR) {
    fmt(path, sizeof(path), "%s/rootfs/usr", sb->dir);
    umount2(path, MNT_DETACH);
    fmt(path, sizeof(path), "%s/rootfs%s", sb->dir, L_AGENT_IN);
    umount2(path, MNT_DETACH);
  }
  /* The state dir is ours; remove the meta file last so that a crash in
   * between leaves a record list() can still find and destroy. */
  int dfd = open(sb->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    DIR *d = fdopendir(dfd);
    struct dirent *e;
    if (d != NULL) {
      while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
            strcmp(e->d_name, "meta.json") == 0)
          continue;
        rm_rf_at(dirfd(d), e->d_name, 0);
      }
      closedir(d);
    } else {
      close(dfd);
    }
  }
  fmt(path, sizeof(path), "%s/meta.json", sb->dir);
  unlink(path);
  if (rmdir(sb->dir) != 0 && errno != ENOENT)
    op->work_rc = -errno;
}

static int sb_alive(const lsb_t *sb)
{
  return sb->pid > 0 && proc_start(sb->pid) != 0 && !proc_is_zombie(sb->pid);
}

/* get(): is it still running (worker)? */
static void check_work(uv_work_t *w)
{
  lop_t *op = w->data;
  op->work_rc = sb_alive(op->sb) ? 0 : 1; /* 1 = stopped, handled in op_next */
  if (op->sb->iso == OSR_ISO_CONTAINER)
    op->oom_kills = osr__lcg_oom_kills(&op->lp->cg, op->sb->id);
}

static void meta_work(uv_work_t *w)
{
  lop_t *op = w->data;
  op->work_rc = write_meta(op->sb);
}

static void read_pid_work(uv_work_t *w)
{
  lop_t *op = w->data;
  char path[L_PATH + 16], buf[64];
  fmt(path, sizeof(path), "%s/runsc.pid", op->sb->dir);
  if (osr__local_read_small(path, buf, sizeof(buf)) <= 0) {
    op->work_rc = OSR_PERR_BOOT_FAILED;
    return;
  }
  op->sb->pid = strtoll(buf, NULL, 10); /* the loop thread waits for this job */
  op->work_rc = op->sb->pid > 0 ? 0 : OSR_PERR_BOOT_FAILED;
}

static void freeze_work(uv_work_t *w)
{
  lop_t *op = w->data;
  op->work_rc = osr__lcg_freeze(&op->lp->cg, op->sb->id, op->pause_target);
}

static void handoff_work(uv_work_t *w)
{
  lop_t *op = w->data;
  char path[L_PATH + 16];
  /* Full CPU weight from now on (it booted at L_POOL_CPU_SHARES). Both
   * classes: runsc made the same cgroup path from config.json. Only a host
   * without the cpu controller has no such file. */
  if ((op->work_rc = osr__lcg_set_shares(&op->lp->cg, op->sb->id, L_CPU_SHARES)) != 0)
    return;
  fmt(path, sizeof(path), "%s/secret/token", op->sb->dir);
  op->work_rc = write_atomic(path, op->token, strlen(op->token), 0400, op->sb->uid);
  if (op->work_rc == 0)
    op->work_rc = write_meta(op->sb);
}

/* list(): read every meta.json of the state directory (worker). The
 * records are turned into lsb_t here and merged on the loop thread. */
static void scan_work(uv_work_t *w)
{
  lop_t *op = w->data;
  lp_t *lp = op->lp;
  DIR *d = opendir(lp->state_dir);
  if (d == NULL) {
    op->work_rc = errno == ENOENT ? 0 : -errno;
    return;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL && op->nscanned < L_MAX_SANDBOXES) {
    if (e->d_name[0] != 'l' || strlen(e->d_name) >= 40)
      continue;
    char path[L_PATH + 64];
    fmt(path, sizeof(path), "%s/%s/meta.json", lp->state_dir, e->d_name);
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (j == NULL)
      continue;
    const char *cls = json_string_value(json_object_get(j, "class"));
    osr_isolation_t iso = osr_isolation_parse(cls);
    if (iso != OSR_ISO_CONTAINER && iso != OSR_ISO_GVISOR) {
      json_decref(j);
      continue;
    }
    lsb_t *sb = sb_new(lp, e->d_name, iso);
    cpy(sb->sandbox_id, sizeof(sb->sandbox_id),
        json_string_value(json_object_get(j, OSR_LABEL_SANDBOX_ID)));
    cpy(sb->tenant, sizeof(sb->tenant), json_string_value(json_object_get(j, OSR_LABEL_TENANT)));
    cpy(sb->tmpl, sizeof(sb->tmpl), json_string_value(json_object_get(j, "template")));
    sb->pid = json_integer_value(json_object_get(j, "pid"));
    sb->created_ms = json_integer_value(json_object_get(j, "created_ms"));
    sb->expires_ms = json_integer_value(json_object_get(j, "expires_ms"));
    sb->uid = (uint32_t)json_integer_value(json_object_get(j, "uid"));
    sb->mem_mib = (uint32_t)json_integer_value(json_object_get(j, "memory_mib"));
    sb->vcpus = (uint32_t)json_integer_value(json_object_get(j, "vcpus"));
    sb->pids_max = (uint32_t)json_integer_value(json_object_get(j, "pids_max"));
    sb->disk_mib = (uint32_t)json_integer_value(json_object_get(j, "disk_mib"));
    sb->warm = json_is_true(json_object_get(j, "warm"));
    sb->stopped = !sb_alive(sb);
    sb->ready = json_is_true(json_object_get(j, "ready")) && !sb->stopped;
    json_decref(j);
    if (op->nscanned % 64 == 0)
      op->scanned = osr_xrealloc(op->scanned, (op->nscanned + 64) * sizeof(*op->scanned));
    op->scanned[op->nscanned++] = sb;
  }
  closedir(d);
}

/* ---- spawning external commands ------------------------------------------------ */

typedef struct lcmd_s {
  uv_process_t proc;
  lop_t *op;
} lcmd_t;

static void on_cmd_close(uv_handle_t *h)
{
  lcmd_t *c = h->data;
  lop_t *op = c->op;
  osr_free(c);
  op_piece_done(op);
}

static void on_cmd_exit(uv_process_t *proc, int64_t exit_status, int term_signal)
{
  lcmd_t *c = proc->data;
  c->op->spawn_exit = term_signal != 0 ? 128 + term_signal : (int)exit_status;
  uv_close((uv_handle_t *)proc, on_cmd_close);
}

/* Run argv to completion; op_next continues with op->spawn_exit set. The
 * child's stdout/stderr go to `logfd` (or nowhere). */
static int op_spawn(lop_t *op, char **argv, int logfd)
{
  lcmd_t *c = osr_xcalloc(1, sizeof(*c));
  c->op = op;
  c->proc.data = c;
  uv_stdio_container_t stdio[3];
  stdio[0].flags = UV_IGNORE;
  for (int i = 1; i < 3; i++) {
    stdio[i].flags = logfd >= 0 ? UV_INHERIT_FD : UV_IGNORE;
    stdio[i].data.fd = logfd;
  }
  uv_process_options_t o;
  memset(&o, 0, sizeof(o));
  o.file = argv[0];
  o.args = argv;
  o.exit_cb = on_cmd_exit;
  o.stdio = stdio;
  o.stdio_count = 3;
  /* Its own session: `runsc run` forks the gVisor sandbox from here, and
   * that must not be in the gateway's process group, where a Ctrl-C or a
   * service manager's group kill would take it down with the gateway. */
  o.flags = UV_PROCESS_DETACHED;
  op->spawn_exit = -1;
  int rv = uv_spawn(op->lp->p->loop, &c->proc, &o);
  if (rv != 0) {
    /* uv_spawn initialised the handle: it must still be closed. */
    OSR_LOG_WARN(MOD, "spawn %s: %s", argv[0], uv_strerror(rv));
    op->pending++;
    uv_close((uv_handle_t *)&c->proc, on_cmd_close);
    op->spawn_exit = 127;
    return 0;
  }
  op->pending++;
  return 0;
}

static int open_log(const lsb_t *sb)
{
  char path[L_PATH + 8];
  fmt(path, sizeof(path), "%s/log", sb->dir);
  /* O_APPEND on a file we created in prep: a local open is fast and never
   * waits on the network (the state dir is local by contract). */
  return open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
}

static void runsc_base(const lp_t *lp, char **a, int *n, char *rootarg, size_t rootlen,
                       char *platarg, size_t platlen)
{
  fmt(rootarg, rootlen, "--root=%s/runsc", lp->state_dir);
  fmt(platarg, platlen, "--platform=%s", lp->runsc_platform);
  a[(*n)++] = (char *)lp->runsc_path;
  a[(*n)++] = rootarg;
  a[(*n)++] = platarg;
  a[(*n)++] = "--network=none";
  a[(*n)++] = "--host-uds=create";
}

/* runsc <verb> [args] <id>; a warm-pool sandbox's `run` under nice (see
 * L_NICE_PATH). */
static int op_runsc(lop_t *op, const char *verb, const char *a1, const char *a2)
{
  char *a[20], rootarg[L_PATH], platarg[64], bundle[L_PATH + 16], pidf[L_PATH + 16];
  int n = 0;
  if (op->sb->warm && strcmp(verb, "run") == 0 && op->lp->can_nice) {
    a[n++] = L_NICE_PATH;
    a[n++] = "-n";
    a[n++] = "19";
  }
  runsc_base(op->lp, a, &n, rootarg, sizeof(rootarg), platarg, sizeof(platarg));
  a[n++] = (char *)verb;
  if (strcmp(verb, "run") == 0) {
    fmt(bundle, sizeof(bundle), "--bundle=%s", op->sb->dir);
    fmt(pidf, sizeof(pidf), "--pid-file=%s/runsc.pid", op->sb->dir);
    a[n++] = bundle;
    a[n++] = pidf;
  }
  if (a1 != NULL)
    a[n++] = (char *)a1;
  a[n++] = op->sb->id;
  if (a2 != NULL)
    a[n++] = (char *)a2;
  a[n] = NULL;
  int logfd = open_log(op->sb);
  int rv = op_spawn(op, a, logfd);
  if (logfd >= 0)
    close(logfd);
  return rv;
}

static void on_wrapper_exit(uv_process_t *proc, int64_t exit_status, int term_signal)
{
  lsb_t *sb = proc->data;
  OSR_LOG_DEBUG(MOD, "%s: sandbox exited (status %lld, signal %d)", sb->id,
                (long long)exit_status, term_signal);
  sb->ready = 0;
  sb->stopped = 1;
  uv_close((uv_handle_t *)proc, on_sb_proc_close);
  /* A create still probing notices through boot_exited. */
  for (lop_t *op = sb->lp->ops; op != NULL; op = op->next)
    if (op->sb == sb && (op->kind == K_CREATE || op->kind == K_POOL))
      op->boot_exited = 1;
}

/* The container sandbox: a detached /bin/sh, already running as the
 * sandbox uid (uv_spawn's setgroups(0) + setgid + setuid, what `setpriv
 * --reuid --regid --clear-groups` did with one more exec), that joins the
 * cgroups (prep_work gave the uid their cgroup.procs files), then runs (not
 * execs: it stays bwrap's parent, so killing it kills the tree via
 * --die-with-parent) bwrap → the agent. */
static int spawn_container(lop_t *op)
{
  lsb_t *sb = op->sb;
  lp_t *lp = op->lp;
  char *a[L_MAX_ARGS + L_MAX_ENV * 3];
  int n = 0;
  char cgf[4][L_PATH], uidb[16], rlim_as[64], rlim_np[64], reuid[32], regid[32];
  char rw_etc[L_PATH + 16], rw_home[L_PATH + 16], rw_tmp[L_PATH + 16], run[L_PATH + 16],
    secret[L_PATH + 16];
  size_t ncg = osr__lcg_procs_files(&lp->cg, sb->id, cgf[0], sizeof(cgf[0]), 4);
  int v2 = lp->cg.mode == OSR__LCG_V2 && ncg > 0;

  if (v2) {
    /* cgroup v2 lets a process move a task only with write access to the
     * cgroup.procs of the common ancestor of both groups, here the root:
     * the sandbox uid can never join by itself. So this first shell runs
     * as root, joins the group (a child inherits it at fork, so bwrap and
     * everything below start inside), and execs setpriv, which drops to
     * the sandbox uid (root's capabilities go with the uid change) before
     * the v1 chain below runs. Root runs only this fixed script; nothing
     * of the sandbox runs before the drop. clone3(CLONE_INTO_CGROUP)
     * would avoid the root step but needs our own fork/exec in place of
     * uv_spawn, which offers no such hook. */
    a[n++] = "/bin/sh";
    a[n++] = "-c";
    a[n++] = "echo $$ > \"$1\" || exit 125; shift; exec \"$@\"";
    a[n++] = "osr-sandbox";
    a[n++] = cgf[0];
    fmt(reuid, sizeof(reuid), "--reuid=%u", sb->uid);
    fmt(regid, sizeof(regid), "--regid=%u", sb->uid);
    a[n++] = "/usr/bin/setpriv";
    a[n++] = reuid;
    a[n++] = regid;
    a[n++] = "--clear-groups";
    a[n++] = "--";
  }
  a[n++] = "/bin/sh";
  a[n++] = "-c";
  /* Join each cgroup (v1), then run the rest. `rc=$?` after the command
   * keeps dash from exec'ing it. */
  a[n++] = "while [ \"$1\" != -- ]; do echo $$ > \"$1\" || exit 125; shift; done; shift; "
           "\"$@\"; rc=$?; exit $rc";
  a[n++] = "osr-sandbox";
  for (size_t i = 0; !v2 && i < ncg; i++)
    a[n++] = cgf[i];
  a[n++] = "--";
  if (!lp->cg.mem || !lp->cg.pids) {
    /* No cgroup for it: fall back to rlimits (per process / per uid). */
    a[n++] = "/usr/bin/prlimit";
    if (!lp->cg.mem) {
      fmt(rlim_as, sizeof(rlim_as), "--as=%llu", (unsigned long long)sb->mem_mib << 20);
      a[n++] = rlim_as;
    }
    if (!lp->cg.pids) {
      fmt(rlim_np, sizeof(rlim_np), "--nproc=%u", sb->pids_max);
      a[n++] = rlim_np;
    }
    a[n++] = "--";
  }
  fmt(uidb, sizeof(uidb), "%u", sb->uid);
  a[n++] = lp->bwrap_path;
  static const char *const fixed[] = {
    "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
    "--hostname", "sandbox", "--seccomp", "3",
    "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
    "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
    "--proc", "/proc", "--dev", "/dev"};
  for (size_t i = 0; i < OSR_ARRAY_SIZE(fixed); i++)
    a[n++] = (char *)fixed[i];
  a[n++] = "--uid";
  a[n++] = uidb;
  a[n++] = "--gid";
  a[n++] = uidb;
  fmt(rw_etc, sizeof(rw_etc), "%s/rw/etc", sb->dir);
  fmt(rw_home, sizeof(rw_home), "%s/rw/home", sb->dir);
  fmt(rw_tmp, sizeof(rw_tmp), "%s/rw/tmp", sb->dir);
  fmt(run, sizeof(run), "%s/run", sb->dir);
  fmt(secret, sizeof(secret), "%s/secret", sb->dir);
  const char *binds[][3] = {
    {"--bind", rw_etc, "/etc"},
    {"--ro-bind-try", "/etc/alternatives", "/etc/alternatives"},
    {"--ro-bind-try", "/etc/ssl", "/etc/ssl"},
    {"--ro-bind-try", "/etc/ca-certificates", "/etc/ca-certificates"},
    {"--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"},
    {"--bind", rw_home, "/home"},
    {"--bind", rw_tmp, "/tmp"},
    {"--bind", run, "/run/osr"},
    {"--ro-bind", secret, "/run/osr-secret"},
    {"--ro-bind", lp->agent_path, L_AGENT_IN},
    {"--chdir", "/home/user", NULL},
  };
  for (size_t i = 0; i < OSR_ARRAY_SIZE(binds); i++)
    for (int k = 0; k < 3 && binds[i][k] != NULL; k++)
      a[n++] = (char *)binds[i][k];
  a[n++] = "--clearenv";
  static const char *const env[][2] = {{"PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"},
                                       {"HOME", "/home/user"},
                                       {"USER", "user"},
                                       {"LANG", "C.UTF-8"}};
  for (size_t i = 0; i < OSR_ARRAY_SIZE(env); i++) {
    a[n++] = "--setenv";
    a[n++] = (char *)env[i][0];
    a[n++] = (char *)env[i][1];
  }
  a[n++] = "--";
  a[n++] = L_AGENT_IN;
  a[n++] = "--listen";
  a[n++] = "unix:/run/osr/agent.sock";
  if (op->token[0] != '\0') { /* no token: the agent runs open (envd semantics) */
    a[n++] = "--token-file";
    a[n++] = "/run/osr-secret/token";
  }
  /* spec->env (KEY=VALUE\0... in env_blob): the sandbox's variables, which
   * the agent gives every process it starts (envd's envVars). Not the
   * agent's own environment: envd builds children's environments itself. */
  for (size_t off = 0; off < op->env_len && n < (int)OSR_ARRAY_SIZE(a) - 3;) {
    a[n++] = "--env";
    a[n++] = op->env_blob + off;
    off += strlen(op->env_blob + off) + 1;
  }
  a[n] = NULL;

  /* The seccomp program is handed over as fd 3 (read by bwrap). A pipe is
   * enough: the program is far below the pipe buffer size. */
  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC) != 0)
    return -errno;
  if (write(pfd[1], lp->bpf, lp->bpf_len) != (ssize_t)lp->bpf_len) {
    close(pfd[0]);
    close(pfd[1]);
    return OSR_EPIPE;
  }
  close(pfd[1]);
  int logfd = open_log(sb);
  uv_stdio_container_t stdio[4];
  stdio[0].flags = UV_IGNORE;
  for (int i = 1; i < 3; i++) {
    stdio[i].flags = logfd >= 0 ? UV_INHERIT_FD : UV_IGNORE;
    stdio[i].data.fd = logfd;
  }
  stdio[3].flags = UV_INHERIT_FD;
  stdio[3].data.fd = pfd[0];
  uv_process_options_t o;
  memset(&o, 0, sizeof(o));
  o.file = a[0];
  o.args = a;
  o.exit_cb = on_wrapper_exit;
  o.stdio = stdio;
  o.stdio_count = 4;
  /* Its own session (it outlives the gateway), and the sandbox's uid from
   * the start (v2: from setpriv, above): bwrap then creates its namespaces
   * unprivileged, so the sandbox never holds host privilege, even before
   * its capability drop. */
  o.flags = UV_PROCESS_DETACHED | (v2 ? 0 : UV_PROCESS_SETUID | UV_PROCESS_SETGID);
  o.uid = sb->uid;
  o.gid = sb->uid;
  sb->proc.data = sb;
  int rv = uv_spawn(lp->p->loop, &sb->proc, &o);
  close(pfd[0]);
  if (logfd >= 0)
    close(logfd);
  sb->proc_open = 1;
  if (rv != 0) {
    uv_close((uv_handle_t *)&sb->proc, on_sb_proc_close);
    return rv;
  }
  sb->pid = sb->proc.pid;
  return 0;
}

/* ---- agent probe (GET /health, POST /init) over the unix socket ---------------- */

typedef struct lprobe_s {
  uv_pipe_t pipe;
  uv_connect_t conn;
  uv_write_t wr;
  lop_t *op;
  char req[8192];
  size_t reqlen;
  char resp[512];
  size_t resplen;
  int result; /* HTTP status, or <0 */
} lprobe_t;

static void on_probe_close(uv_handle_t *h)
{
  lprobe_t *pr = h->data;
  lop_t *op = pr->op;
  int result = pr->result;
  osr_free(pr);
  op->probe = NULL;
  uv_timer_stop(&op->timer); /* its deadline (op_probe) */
  op->probe_attempt++;
  op->spawn_exit = result; /* reused as "last probe status" */
  op_piece_done(op);
}

static void probe_end(lprobe_t *pr, int result)
{
  if (pr->result == 0)
    pr->result = result;
  if (!uv_is_closing((uv_handle_t *)&pr->pipe))
    uv_close((uv_handle_t *)&pr->pipe, on_probe_close);
}

static void probe_alloc(uv_handle_t *h, size_t sz, uv_buf_t *b)
{
  lprobe_t *pr = h->data;
  b->base = pr->resp + pr->resplen;
  b->len = sizeof(pr->resp) - 1 - pr->resplen;
}

static void probe_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
  lprobe_t *pr = s->data;
  if (n > 0)
    pr->resplen += (size_t)n;
  pr->resp[pr->resplen] = '\0';
  char *eol = strstr(pr->resp, "\r\n");
  if (eol != NULL || pr->resplen + 1 >= sizeof(pr->resp) || n < 0) {
    int code = -1;
    if (strncmp(pr->resp, "HTTP/1.", 7) == 0 && pr->resplen >= 12)
      code = (int)strtol(pr->resp + 9, NULL, 10);
    probe_end(pr, code >= 100 && code < 600 ? code : -1);
  }
}

static void probe_written(uv_write_t *w, int status)
{
  lprobe_t *pr = w->data;
  if (status != 0) {
    probe_end(pr, -1);
    return;
  }
  if (uv_read_start((uv_stream_t *)&pr->pipe, probe_alloc, probe_read) != 0)
    probe_end(pr, -1);
}

static void probe_connected(uv_connect_t *c, int status)
{
  lprobe_t *pr = c->data;
  if (status != 0) {
    probe_end(pr, -1);
    return;
  }
  uv_buf_t b = uv_buf_init(pr->req, (unsigned)pr->reqlen);
  if (uv_write(&pr->wr, (uv_stream_t *)&pr->pipe, &b, 1, probe_written) != 0)
    probe_end(pr, -1);
}

/* An agent that accepted the connection but never answers (stopped, or
 * wedged) must not hold its op forever: the request ends as "no answer"
 * and the op goes on (the next /health probe, or its failure). */
static void on_probe_timeout(uv_timer_t *t)
{
  lop_t *op = t->data;
  if (op->probe != NULL) {
    OSR_LOG_WARN(MOD, "%s: the agent did not answer within %u ms", op->sb->id,
                 op->lp->boot_timeout_ms);
    probe_end(op->probe, -1);
  }
}

/* One HTTP request to the agent; op_next continues with the status code in
 * op->spawn_exit (-1 if there was no answer, also after boot_timeout_ms).
 * The op's timer is the request's deadline meanwhile: neither caller
 * (S_PROBE, S_HANDOFF_WRITE) has it armed while a request is in flight. */
static void op_probe(lop_t *op, const char *method, const char *path, const char *token,
                     const char *body)
{
  lprobe_t *pr = osr_xcalloc(1, sizeof(*pr));
  pr->op = op;
  pr->pipe.data = pr;
  pr->conn.data = pr;
  pr->wr.data = pr;
  size_t blen = body != NULL ? strlen(body) : 0;
  int w = fmt(pr->req, sizeof(pr->req),
                   "%s %s HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n%s%s%s"
                   "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                   method, path, token ? "X-Access-Token: " : "", token ? token : "",
                   token ? "\r\n" : "", blen, body ? body : "");
  pr->reqlen = w > 0 && (size_t)w < sizeof(pr->req) ? (size_t)w : 0;
  op->pending++;
  op->probe = pr;
  uv_timer_start(&op->timer, on_probe_timeout, op->lp->boot_timeout_ms, 0);
  uv_pipe_init(op->lp->p->loop, &pr->pipe, 0);
  char sock[L_PATH + 32];
  fmt(sock, sizeof(sock), "%s/run/agent.sock", op->sb->dir);
  if (pr->reqlen == 0) {
    probe_end(pr, -1);
    return;
  }
  uv_pipe_connect(&pr->conn, &pr->pipe, sock, probe_connected);
}

/* ---- the state machine -------------------------------------------------------------- */

static void start_destroy_steps(lop_t *op)
{
  op->sb->doomed = 1;
  op->sb->ready = 0;
  op->step = op->sb->iso == OSR_ISO_GVISOR ? S_KILL_RUNSC : S_CLEAN;
  op_next(op);
}

static void arm_ttl(lsb_t *sb);

static void on_ttl_destroyed(osr_provider_t *p, int status, void *data)
{
  (void)p;
  (void)data;
  if (status != 0 && status != OSR_PERR_NOT_FOUND && status != OSR_ECANCELED)
    OSR_LOG_WARN(MOD, "TTL destroy failed: %s", osr_provider_err_name(status));
}

static int local_destroy(osr_provider_t *p, const char *provider_id, osr_provider_done_cb cb,
                         void *data);

static void on_ttl(uv_timer_t *t)
{
  lsb_t *sb = t->data;
  OSR_LOG_INFO(MOD, "%s (sandbox %s): TTL expired, destroying", sb->id, sb->sandbox_id);
  local_destroy(sb->lp->p, sb->id, on_ttl_destroyed, NULL);
}

static void arm_ttl(lsb_t *sb)
{
  if (sb->expires_ms <= 0 || sb->doomed || sb->lp->closing)
    return;
  if (!sb->ttl_open) {
    uv_timer_init(sb->lp->p->loop, &sb->ttl);
    sb->ttl.data = sb;
    sb->ttl_open = 1;
    /* A TTL timer alone must not keep the loop (and the gateway) alive. */
    uv_unref((uv_handle_t *)&sb->ttl);
  }
  int64_t left = sb->expires_ms - now_ms();
  uv_timer_start(&sb->ttl, on_ttl, left > 0 ? (uint64_t)left : 0, 0);
}

/* The steps a teardown runs to the end, whatever happened before. */
static int in_teardown(lop_step_t step)
{
  return step == S_KILL_RUNSC || step == S_DELETE_RUNSC || step == S_CLEAN || step == S_UNLIST;
}

static void op_next(lop_t *op)
{
  lp_t *lp = op->lp;
  lsb_t *sb = op->sb;
  int rv = 0;

  if (op->delivered)
    return;
  /* A handoff's job and POST /init run at once: act (on a failure too)
   * only when both have finished. */
  if (op->step == S_HANDOFF_JOIN && op->pending > 0)
    return;
  /* A create whose teardown already ran (or that failed while being torn
   * down) only has to answer. */
  if (op->status != 0 && (op->kind == K_CREATE || op->kind == K_POOL) && sb->doomed &&
      !in_teardown(op->step))
    op->step = S_DONE;
  /* A pool create cut short by close tears its sandbox down: nobody
   * else would ever find an unlabelled warm sandbox. */
  if (op->cancelled && op->kind == K_POOL && !sb->doomed) {
    start_destroy_steps(op);
    return;
  }
  if (op->cancelled && !in_teardown(op->step) && op->step != S_DONE) {
    op_finish(op);
    return;
  }
  /* A failed create tears down what it made before answering. */
  if (op->status != 0 && (op->kind == K_CREATE || op->kind == K_POOL) && !sb->doomed &&
      op->step != S_DONE) {
    OSR_LOG_WARN(MOD, "%s: create failed at step %d: %s", sb->id, (int)op->step,
                 osr_strerror(op->status));
    if (op->status > -31000 || op->status < -31100)
      op->status = OSR_PERR_BOOT_FAILED;
    start_destroy_steps(op);
    return;
  }

  switch (op->step) {
  case S_PREP:
    op->t0_ns = uv_hrtime();
    op->step = op->snapshot_path[0] ? S_UNTAR : sb->iso == OSR_ISO_GVISOR ? S_RUNSC_RUN
                                                                            : S_SPAWN;
    rv = op_work(op, prep_work);
    break;
  case S_UNTAR: {
    op->step = S_SPAWN;
    if (sb->iso == OSR_ISO_GVISOR)
      op->step = S_RUNSC_RUN;
    /* tar runs as the sandbox's uid, reading the snapshot from the
     * shell's stdin: what it extracts is the sandbox's own from the start
     * (no chown -R over rw/, which would walk into the read-only host
     * binds of a gVisor sandbox's rw/etc, see bind_host_ro), and a link in
     * the archive can never make root write through it. -p keeps the
     * archive's modes. */
    char script[] = "exec /usr/bin/setpriv --reuid=\"$3\" --regid=\"$3\" --clear-groups -- "
                    "tar -xpf - -C \"$2\" < \"$1\"";
    char rw[L_PATH + 8], uid[16];
    fmt(rw, sizeof(rw), "%s/rw", sb->dir);
    fmt(uid, sizeof(uid), "%u", sb->uid);
    char *a[] = {"/bin/sh", "-c", script, "untar", op->snapshot_path, rw, uid, NULL};
    rv = op_spawn(op, a, -1);
    op->snapshot_path[0] = '\0';
    /* The exit status is checked at the next step. */
    op->pause_target = 1;
    break;
  }
  case S_SPAWN:
    if (op->pause_target && op->spawn_exit != 0) {
      op_fail(op, OSR_PERR_INVALID);
      op_next(op);
      return;
    }
    op->pause_target = 0;
    op->tspawn_ns = uv_hrtime();
    rv = spawn_container(op);
    if (rv != 0) {
      op_fail(op, OSR_PERR_BOOT_FAILED);
      op_next(op);
      return;
    }
    op->step = S_PROBE;
    op->probe_attempt = 0;
    op->spawn_exit = -1;
    op->deadline_ms = uv_now(lp->p->loop) + lp->boot_timeout_ms;
    uv_timer_start(&op->timer, on_op_timer, 1, 0);
    break;
  case S_RUNSC_RUN:
    if (op->pause_target && op->spawn_exit != 0) {
      op_fail(op, OSR_PERR_INVALID);
      op_next(op);
      return;
    }
    op->pause_target = 0;
    op->tspawn_ns = uv_hrtime();
    op->step = S_READ_PID;
    /* One runsc process (create and start in one, returning once the
     * agent has been started) instead of `create` + `start`: each runsc
     * invocation is a Go runtime start-up plus a reload of the container
     * state, 20-40 ms here. */
    rv = op_runsc(op, "run", "--detach", NULL);
    break;
  case S_READ_PID:
    if (op->spawn_exit != 0) {
      op_fail(op, OSR_PERR_BOOT_FAILED);
      op_next(op);
      return;
    }
    op->step = S_PROBE;
    OSR_LOG_DEBUG(MOD, "%s: runsc run exited after %.1f ms", sb->id,
                  (uv_hrtime() - op->tspawn_ns) / 1e6);
    op->probe_attempt = 0;
    op->spawn_exit = -1;
    op->deadline_ms = uv_now(lp->p->loop) + lp->boot_timeout_ms;
    rv = op_work(op, read_pid_work);
    break;
  case S_PROBE:
    /* Entered from the backoff timer or after a probe finished. */
    if (op->spawn_exit == 204) {
      op->step = S_META;
      op_next(op);
      return;
    }
    if (op->boot_exited || uv_now(lp->p->loop) >= op->deadline_ms) {
      OSR_LOG_WARN(MOD, "%s: the agent did not answer /health (%s)", sb->id,
                   op->boot_exited ? "the sandbox exited" : "timeout");
      op_fail(op, OSR_PERR_BOOT_FAILED);
      op_next(op);
      return;
    }
    if (op->spawn_exit == -2 || op->probe_attempt == 0) {
      op->spawn_exit = -3; /* a probe is in flight */
      op_probe(op, "GET", "/health", NULL, NULL);
      return;
    }
    {
      /* 1 ms between probes for the first ~150 ms (a probe of a socket
       * that does not exist yet is one failed connect(): cheap, and every
       * millisecond here is time to interactive), then back off 2, 4 ...
       * 32 ms for a slow boot (gVisor). */
      unsigned a = op->probe_attempt < 100 ? 0 : op->probe_attempt - 99;
      op->spawn_exit = -2;
      uv_timer_start(&op->timer, on_op_timer, 1u << (a < 5 ? a : 5), 0);
    }
    return;
  case S_META:
    OSR_LOG_DEBUG(MOD, "%s: agent ready %.1f ms after create (prepare %.1f ms, boot %.1f ms, %u probes)",
                  sb->id, (uv_hrtime() - op->t0_ns) / 1e6, (op->tspawn_ns - op->t0_ns) / 1e6,
                  (uv_hrtime() - op->tspawn_ns) / 1e6, op->probe_attempt);
    sb->ready = 1;
    op->step = S_DONE;
    rv = op_work(op, meta_work);
    break;
  case S_HANDOFF_WRITE:
    /* The thread-pool job (cpu.shares, token file, meta.json) and POST
     * /init at once: neither needs the other, and the create answers when
     * both are done (S_HANDOFF_JOIN); in sequence a gVisor handoff waited
     * for the job's two thread hops before the agent saw /init. */
    op->tspawn_ns = uv_hrtime();
    op->step = S_HANDOFF_JOIN;
    op->spawn_exit = -1;
    op_probe(op, "POST", "/init", op->old_token, op->init_json);
    rv = op_work(op, handoff_work);
    break;
  case S_HANDOFF_JOIN:
    op->step = S_DONE; /* both pieces are done (the top of op_next) */
    break;
  case S_KILL_RUNSC:
    op->step = S_DELETE_RUNSC;
    rv = op_runsc(op, "kill", "--all", "KILL");
    break;
  case S_DELETE_RUNSC:
    op->step = S_CLEAN;
    rv = op_runsc(op, "delete", "--force", NULL);
    break;
  case S_CLEAN:
    /* The record stays in the table (doomed) until the files are gone:
     * a list merging meanwhile must find it, not adopt it. */
    op->step = S_UNLIST;
    rv = op_work(op, clean_work);
    if (rv != 0) {
      sb_forget(lp, sb);
      op_finish(op);
      return;
    }
    break;
  case S_UNLIST:
    op->step = S_DONE;
    sb_forget(lp, sb);
    break;
  case S_CHECK:
    op->step = S_DONE;
    rv = op_work(op, check_work);
    break;
  case S_FREEZE:
    op->step = S_DONE;
    rv = op_work(op, freeze_work);
    break;
  case S_RUNSC_PAUSE:
    op->step = S_DONE;
    rv = op_runsc(op, op->pause_target ? "pause" : "resume", NULL, NULL);
    break;
  case S_TAR: {
    op->step = S_DONE;
    char rw[L_PATH + 8];
    fmt(rw, sizeof(rw), "%s/rw", sb->dir);
    /* Not the host's read-only /etc parts a gVisor sandbox has bound
     * inside rw/etc (bind_host_ro): they are the host's, not the
     * sandbox's, and a restore could not write into them. */
    char *a[] = {"/usr/bin/tar", "--exclude=./etc/alternatives", "--exclude=./etc/ssl",
                 "--exclude=./etc/ca-certificates", "--exclude=./etc/ld.so.cache", "-cf",
                 op->snapshot_path, "-C", rw, ".", NULL};
    rv = op_spawn(op, a, -1);
    break;
  }
  case S_SCAN:
    op->step = S_DONE;
    rv = op_work(op, scan_work);
    if (rv == 0) {
      op->scan_open = 1;
      lp->scans++;
    }
    break;
  case S_DONE:
    break;
  }
  if (rv != 0) {
    op_fail(op, rv);
    op->step = S_DONE;
    op_finish(op);
    return;
  }
  if (op->step != S_DONE || op->pending > 0)
    return;

  /* S_DONE with nothing pending: finish per kind. */
  int kick = op->kind == K_CREATE && op->init_json != NULL; /* a pool handoff: refill */
  switch (op->kind) {
  case K_CREATE:
  case K_POOL:
    sb->creating = 0;
    if (sb->doomed) {
      /* A failed create has been torn down: report the failure. */
      if (op->status == 0)
        op->status = OSR_PERR_BOOT_FAILED;
      if (op->kind == K_POOL) {
        lp->pools[pool_idx(sb->iso)].filling--;
        handoff_release(sb, 0);
        /* Refill again later, not now: a runtime that fails every boot
         * must not turn the pool into a busy loop. Give up after a run of
         * failures (creates are cold from then on). */
        if (++lp->pool_failures >= 5 && !lp->pool_disabled) {
          OSR_LOG_WARN(MOD, "provider '%s': %u warm-pool creates failed in a row: warm pool "
                       "disabled", lp->p->name, lp->pool_failures);
          lp->pool_disabled = 1;
        } else if (!lp->closing && lp->kick_open) {
          uv_timer_start(&lp->kick, on_kick, 1000u << (lp->pool_failures - 1), 0);
        }
      }
      break;
    }
    if (op->handoff_failed == 0 && op->init_json != NULL) {
      /* Pool handoff: the agent must have accepted the new token. */
      if (op->spawn_exit < 200 || op->spawn_exit >= 300) {
        OSR_LOG_WARN(MOD, "%s: the agent refused POST /init (%d): warm pool disabled", sb->id,
                     op->spawn_exit);
        lp->pool_disabled = 1;
        op->handoff_failed = 1;
        op_fail(op, OSR_PERR_BOOT_FAILED);
        start_destroy_steps(op);
        return;
      }
      OSR_LOG_DEBUG(MOD,
                    "%s: handed out from the pool in %.1f ms (token + meta with POST "
                    "/init: %.1f ms)",
                    sb->id, (uv_hrtime() - op->t0_ns) / 1e6, (uv_hrtime() - op->tspawn_ns) / 1e6);
    }
    if (op->kind == K_POOL) {
      lp->pools[pool_idx(sb->iso)].filling--;
      lp->pool_failures = 0;
      pool_kick(lp); /* before the handoff: it still counts as warm (no refill yet) */
      handoff_release(sb, 1);
    } else {
      arm_ttl(sb);
    }
    break;
  case K_DESTROY:
  case K_TTL:
    if (op->status == OSR_ENOENT)
      op->status = 0;
    break;
  case K_GET:
    if (op->status == 1) { /* check_work: the process is gone */
      op->status = 0;
      sb->ready = 0;
      sb->stopped = 1;
    }
    break;
  case K_PAUSE:
  case K_RESUME:
    if (op->status == 0 && op->spawn_exit > 0)
      op->status = OSR_PERR_UNAVAILABLE;
    if (op->status == 0)
      sb->paused = op->pause_target;
    break;
  case K_SNAPSHOT:
    if (op->status == 0 && op->spawn_exit != 0)
      op->status = OSR_PERR_UNAVAILABLE;
    break;
  case K_LIST: {
    /* Merge what the scan found with the table, adopt sandboxes made by an
     * earlier process (their TTL timers are re-armed here), and report
     * every labelled one. Warm-pool leftovers of an earlier process are
     * destroyed: their tokens are gone with it. */
    int first = !lp->scanned;
    lp->scanned = 1;
    for (size_t i = 0; i < op->nscanned; i++) {
      lsb_t *f = op->scanned[i];
      op->scanned[i] = NULL;
      lsb_t *known = sb_find(lp, f->id);
      if (known != NULL) {
        if (f->stopped && !known->doomed) {
          known->stopped = 1;
          known->ready = 0;
        }
        osr_free(f);
        continue;
      }
      sb_insert(lp, f);
      if (!f->warm)
        OSR_LOG_INFO(MOD, "provider '%s': adopted %s (sandbox %s, %s) from an earlier run",
                     lp->p->name, f->id, f->sandbox_id, f->stopped ? "stopped" : "running");
      if (f->warm) {
        if (first || !f->ready)
          local_destroy(lp->p, f->id, on_ttl_destroyed, NULL);
        continue;
      }
      arm_ttl(f);
    }
    for (lsb_t *s = lp->sbx; s != NULL; s = s->next) {
      if (s->warm || s->sandbox_id[0] == '\0' || s->doomed)
        continue;
      if (op->nlist == op->caplist) {
        op->caplist = op->caplist ? op->caplist * 2 : 16;
        op->list = osr_xrealloc(op->list, op->caplist * sizeof(*op->list));
      }
      fill_resource(s, &op->list[op->nlist]);
      op->nlist++;
    }
    scan_end(op);
    if (first)
      pool_kick(lp);
    break;
  }
  }
  /* Before op_finish: its delivery may close the provider (and free lp). */
  if (kick)
    pool_kick(lp);
  op_finish(op);
}

/* ---- configuration ----------------------------------------------------------------- */

static int cfg_u32(const json_t *c, const char *key, uint32_t *out, uint32_t lo, uint32_t hi,
                   char *err, size_t errlen)
{
  json_t *v = json_object_get(c, key);
  if (v == NULL || json_is_null(v))
    return 0;
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
    fmt(err, errlen, "key '%s': expected an integer in %u..%u", key, lo, hi);
    return OSR_EINVAL;
  }
  *out = (uint32_t)json_integer_value(v);
  return 0;
}

static int cfg_str(const json_t *c, const char *key, char *out, size_t len, char *err,
                   size_t errlen)
{
  json_t *v = json_object_get(c, key);
  if (v == NULL || json_is_null(v))
    return 0;
  if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) >= len) {
    fmt(err, errlen, "key '%s': expected a non-empty string shorter than %zu bytes", key,
             len);
    return OSR_EINVAL;
  }
  cpy(out, len, json_string_value(v));
  return 0;
}

static void on_kick(uv_timer_t *t);

static int local_init(osr_provider_t *p, const json_t *config, char *err, size_t errlen)
{
  lp_t *lp = osr_xcalloc(1, sizeof(*lp));
  int rv = 0;
  lp->p = p;
  lp->mem_default = 512;
  lp->mem_max = 8192;
  lp->vcpus_default = 1;
  lp->vcpus_max = 4;
  lp->pids_max = 512;
  lp->disk_mib = 1024;
  lp->uid_base = 200000;
  lp->boot_timeout_ms = 10000;
  cpy(lp->bwrap_path, sizeof(lp->bwrap_path), "/usr/bin/bwrap");
  cpy(lp->runsc_path, sizeof(lp->runsc_path), "/usr/bin/runsc");
  cpy(lp->runsc_platform, sizeof(lp->runsc_platform), "ptrace");

  /* state_dir: config, else <data_dir>/local where data_dir comes from the
   * config ("data_dir", which the gateway may pass down) or OSR_DATA_DIR or
   * the gateway's default $HOME/.local/share/osr. */
  const char *dd = json_string_value(json_object_get(config, "data_dir"));
  char ddbuf[300];
  if (dd == NULL)
    dd = getenv("OSR_DATA_DIR");
  if (dd == NULL) {
    const char *home = getenv("HOME");
    fmt(ddbuf, sizeof(ddbuf), "%s/.local/share/osr", home ? home : "/var/lib");
    dd = ddbuf;
  }
  fmt(lp->state_dir, sizeof(lp->state_dir), "%s/local", dd);
  /* agent_path default: osr-agent next to the running binary. */
  char self[L_PATH];
  ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (sl > 0) {
    self[sl] = '\0';
    char *slash = strrchr(self, '/');
    if (slash != NULL)
      *slash = '\0';
    fmt(lp->agent_path, sizeof(lp->agent_path), "%s/osr-agent", self);
  }

  if (config != NULL && !json_is_object(config)) {
    fmt(err, errlen, "expected an object");
    rv = OSR_EINVAL;
    goto out;
  }
  if ((rv = cfg_str(config, "state_dir", lp->state_dir, sizeof(lp->state_dir), err, errlen)) ||
      (rv = cfg_str(config, "agent_path", lp->agent_path, sizeof(lp->agent_path), err, errlen)) ||
      (rv = cfg_str(config, "bwrap_path", lp->bwrap_path, sizeof(lp->bwrap_path), err, errlen)) ||
      (rv = cfg_str(config, "runsc_path", lp->runsc_path, sizeof(lp->runsc_path), err, errlen)) ||
      (rv = cfg_str(config, "runsc_platform", lp->runsc_platform, sizeof(lp->runsc_platform), err,
                    errlen)) ||
      (rv = cfg_str(config, "cgroup_parent", lp->cgroup_parent, sizeof(lp->cgroup_parent), err,
                    errlen)) ||
      (rv = cfg_u32(config, "vcpus", &lp->vcpus_default, 1, 64, err, errlen)) ||
      (rv = cfg_u32(config, "max_vcpus", &lp->vcpus_max, 1, 64, err, errlen)) ||
      (rv = cfg_u32(config, "pids_max", &lp->pids_max, 16, 1u << 20, err, errlen)) ||
      (rv = cfg_u32(config, "disk_mib", &lp->disk_mib, 16, 1u << 20, err, errlen)) ||
      (rv = cfg_u32(config, "uid_base", &lp->uid_base, 1000, 1u << 30, err, errlen)) ||
      (rv = cfg_u32(config, "boot_timeout_ms", &lp->boot_timeout_ms, 100, 600000, err, errlen)))
    goto out;
  json_t *mem = json_object_get(config, "memory_mib");
  if (json_is_object(mem)) {
    if ((rv = cfg_u32(mem, "default", &lp->mem_default, 16, 1u << 20, err, errlen)) ||
        (rv = cfg_u32(mem, "max", &lp->mem_max, 16, 1u << 20, err, errlen)))
      goto out;
  } else if ((rv = cfg_u32(config, "memory_mib", &lp->mem_default, 16, 1u << 20, err, errlen))) {
    goto out;
  }
  if (lp->mem_default > lp->mem_max)
    lp->mem_max = lp->mem_default;
  if (lp->vcpus_default > lp->vcpus_max)
    lp->vcpus_max = lp->vcpus_default;
  if (lp->state_dir[0] != '/') {
    fmt(err, errlen, "key 'state_dir': must be an absolute path");
    rv = OSR_EINVAL;
    goto out;
  }
  if (geteuid() == 0 && !path_traversable(lp->state_dir)) {
    /* bwrap resolves its bind sources as the sandbox uid, which cannot
     * pass a 0700 parent (root's $HOME is /root). Keep the sandboxes in
     * a directory of their own under /run instead, named after the state
     * dir so that each gateway (and its restart) finds only its own. */
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (const char *c = lp->state_dir; *c != '\0'; c++)
      h = (h ^ (unsigned char)*c) * 1099511628211ULL;
    OSR_LOG_INFO(MOD, "provider '%s': %s is not traversable by sandbox uids; sandboxes live in "
                 "/run/osr/local-%016llx", p->name, lp->state_dir, (unsigned long long)h);
    fmt(lp->state_dir, sizeof(lp->state_dir), "/run/osr/local-%016llx", (unsigned long long)h);
    lp->run_root = 1;
  }

  /* Which classes exist here. These access() calls read only local
   * metadata; they run once, at configuration time. */
  unsigned want = (1u << OSR_ISO_CONTAINER) | (1u << OSR_ISO_GVISOR);
  json_t *cls = json_object_get(config, "classes");
  if (cls != NULL && !json_is_null(cls)) {
    size_t i;
    json_t *e;
    want = 0;
    if (!json_is_array(cls)) {
      fmt(err, errlen, "key 'classes': expected a list of \"container\"/\"gvisor\"");
      rv = OSR_EINVAL;
      goto out;
    }
    json_array_foreach(cls, i, e)
    {
      osr_isolation_t iso = osr_isolation_parse(json_string_value(e));
      if (iso != OSR_ISO_CONTAINER && iso != OSR_ISO_GVISOR) {
        fmt(err, errlen, "key 'classes': '%s' is not a local class (container, gvisor)",
                 json_string_value(e) ? json_string_value(e) : "?");
        rv = OSR_EINVAL;
        goto out;
      }
      want |= 1u << iso;
    }
  }
  if ((want & (1u << OSR_ISO_CONTAINER)) && access(lp->bwrap_path, X_OK) == 0)
    lp->iso_mask |= 1u << OSR_ISO_CONTAINER;
  if ((want & (1u << OSR_ISO_GVISOR)) && access(lp->runsc_path, X_OK) == 0 && geteuid() == 0)
    lp->iso_mask |= 1u << OSR_ISO_GVISOR;
  if (lp->iso_mask == 0)
    OSR_LOG_WARN(MOD, "provider '%s': no isolation class available (bwrap at %s, runsc at %s)",
                 p->name, lp->bwrap_path, lp->runsc_path);

  json_t *wp = json_object_get(config, "warm_pool");
  if (wp != NULL && !json_is_null(wp)) {
    if (!json_is_object(wp)) {
      fmt(err, errlen, "key 'warm_pool': expected {container: N, gvisor: M}");
      rv = OSR_EINVAL;
      goto out;
    }
    if ((rv = cfg_u32(wp, "container", &lp->pools[0].target, 0, 256, err, errlen)) ||
        (rv = cfg_u32(wp, "gvisor", &lp->pools[1].target, 0, 256, err, errlen)))
      goto out;
  }
  lp->pools[0].iso = OSR_ISO_CONTAINER;
  lp->pools[1].iso = OSR_ISO_GVISOR;

  /* The cgroup parent: the key, else $OSR_LOCAL_CGROUP_PARENT (which
   * available() and so `osr doctor` see too), else chosen by the probe.
   * Setting it up moves this process into a leaf when its own cgroup is
   * delegated to it: small cgroupfs writes, once, before the loop runs. */
  if (lp->cgroup_parent[0] == '\0' && getenv("OSR_LOCAL_CGROUP_PARENT") != NULL)
    cpy(lp->cgroup_parent, sizeof(lp->cgroup_parent), getenv("OSR_LOCAL_CGROUP_PARENT"));
  if (osr__lcg_probe(&lp->cg, lp->cgroup_parent) != 0) {
    fmt(err, errlen,
        "key 'cgroup_parent': '%s' is not a cgroup path like /osr or "
        "/system.slice/osr.service/sandboxes",
        lp->cgroup_parent);
    rv = OSR_EINVAL;
    goto out;
  }
  osr__lcg_setup(&lp->cg);
  char limits[1024];
  OSR_LOG_INFO(MOD, "provider '%s': container limits by %s", p->name,
               osr__lcg_describe(&lp->cg, limits, sizeof(limits)));
  if (lp->cg.v2_host && lp->cg.mode == OSR__LCG_NONE && (lp->iso_mask & (1u << OSR_ISO_GVISOR))) {
    /* runsc would enable the same controllers on the same way down and
     * fail the same way: not a class we can offer with its limits. */
    lp->iso_mask &= ~(1u << OSR_ISO_GVISOR);
    OSR_LOG_WARN(MOD,
                 "provider '%s': gvisor class off: runsc cannot get a cgroup with limits "
                 "here (%s)",
                 p->name, lp->cg.note);
  }
  lp->can_mount = geteuid() == 0;
  lp->can_nice = access(L_NICE_PATH, X_OK) == 0;
  lp->bpf_len = osr__local_seccomp_bpf(lp->bpf, sizeof(lp->bpf));
  if (lp->bpf_len == 0) {
    fmt(err, errlen, "internal: seccomp program too large");
    rv = OSR_EINVAL;
    goto out;
  }
  lp->seq = (uint64_t)now_ms();

  /* gVisor's sandbox and gofer are orphans once `runsc run --detach`
   * exits: reap them here, not PID 1, or every `runsc delete` waits for
   * PID 1 to reap the sandbox it killed (local_reap.c). */
  if (lp->iso_mask & (1u << OSR_ISO_GVISOR)) {
    int r = osr__lreap_init(&lp->reap, p->loop);
    if (r == 0)
      lp->reap_open = 1;
    else
      OSR_LOG_WARN(MOD,
                   "provider '%s': cannot become a child subreaper (%s): gVisor destroys "
                   "wait for PID 1 to reap each sandbox",
                   p->name, osr_strerror(r));
  }

  /* The first scan (adopting sandboxes of an earlier process) and the warm
   * pool start from the loop, right after init. */
  uv_timer_init(p->loop, &lp->kick);
  lp->kick.data = lp;
  lp->kick_open = 1;
  uv_timer_start(&lp->kick, on_kick, 0, 0);
  uv_unref((uv_handle_t *)&lp->kick);
  p->impl = lp;
out:
  if (rv != 0)
    osr_free(lp);
  return rv;
}

static void local_describe(osr_provider_t *p, osr_provider_info_t *info)
{
  lp_t *lp = p->impl;
  memset(info, 0, sizeof(*info));
  info->isolation_mask = lp->iso_mask;
  info->snapshot = 1;
  info->pause = lp->cg.freezer || (lp->iso_mask & (1u << OSR_ISO_GVISOR)) != 0;
  info->max_ports = OSR_MAX_PORTS;
  info->max_memory_mib = lp->mem_max;
  info->max_vcpus = lp->vcpus_max;
  info->default_memory_mib = lp->mem_default;
  info->default_vcpus = lp->vcpus_default;
  /* Local compute is free; the create latency prior is the faster class. */
  info->expected_create_ms = (lp->iso_mask & (1u << OSR_ISO_CONTAINER)) ? 30 : 300;
}

/* ---- operations ----------------------------------------------------------------- */

static void new_id(lp_t *lp, char *out, size_t len)
{
  unsigned char r[8];
  if (uv_random(NULL, NULL, r, sizeof(r), 0, NULL) != 0) {
    uint64_t x = uv_hrtime() ^ (++lp->seq * 0x9E3779B97F4A7C15ULL);
    memcpy(r, &x, sizeof(r));
  }
  fmt(out, len, "l%02x%02x%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2], r[3], r[4], r[5],
           r[6], r[7]);
}

static uint32_t pick_uid(lp_t *lp)
{
  for (int tries = 0; tries < 64; tries++) {
    uint32_t r;
    if (uv_random(NULL, NULL, &r, sizeof(r), 0, NULL) != 0)
      r = (uint32_t)uv_hrtime();
    uint32_t uid = lp->uid_base + r % 65536u;
    int used = 0;
    for (lsb_t *s = lp->sbx; s != NULL && !used; s = s->next)
      used = s->uid == uid;
    if (!used)
      return uid;
  }
  return lp->uid_base + (uint32_t)(lp->nsbx % 65536u);
}

static int env_pack(lop_t *op, const json_t *env)
{
  const char *k;
  json_t *v;
  size_t n = 0;
  if (env == NULL || json_is_null(env))
    return 0;
  if (!json_is_object(env))
    return OSR_PERR_INVALID;
  json_object_foreach((json_t *)env, k, v)
  {
    if (!json_is_string(v) || k[0] == '\0' || strchr(k, '=') != NULL || strlen(k) >= 128)
      return OSR_PERR_INVALID;
    int w = fmt(op->env_blob + op->env_len, sizeof(op->env_blob) - op->env_len, "%s=%s", k,
                     json_string_value(v));
    if (w < 0 || (size_t)w + 1 > sizeof(op->env_blob) - op->env_len || ++n > L_MAX_ENV - 8)
      return OSR_PERR_INVALID;
    op->env_len += (size_t)w + 1;
  }
  return 0;
}

/* A warm sandbox to hand out: its agent answered (ready). Its pool op may
 * still be writing meta.json (the last step, `creating` still set): the
 * handoff then waits for it (handoff_release), so a sandbox whose meta.json
 * says ready is always the one a create gets, and it is never handed out
 * before its pool op is done. */
static lsb_t *pool_take(lp_t *lp, osr_isolation_t iso, const char *tmpl)
{
  for (lsb_t *s = lp->sbx; s != NULL; s = s->next)
    if (s->warm && s->ready && !s->doomed && s->handoff == NULL && s->iso == iso &&
        strcmp(s->tmpl, tmpl) == 0)
      return s;
  return NULL;
}

/* Give the warm sandbox its label and start the handoff (token file + POST
 * /init); from here it is a create op like any other. */
static void handoff_start(lop_t *op)
{
  lsb_t *w = op->sb;
  w->warm = 0;
  cpy(w->sandbox_id, sizeof(w->sandbox_id), op->sandbox_id);
  cpy(w->tenant, sizeof(w->tenant), op->tenant);
  w->created_ms = now_ms();
  w->expires_ms = op->timeout_s ? w->created_ms + (int64_t)op->timeout_s * 1000 : 0;
  w->creating = 1;
  uv_timer_start(&op->timer, on_op_timer, 0, 0);
}

/* The pool op of a warm sandbox ended: start the handoff waiting for it,
 * or fail it (the sandbox is being torn down) from the timer. */
static void handoff_release(lsb_t *sb, int ok)
{
  lop_t *h = sb->handoff;
  if (h == NULL)
    return;
  sb->handoff = NULL;
  if (ok && !sb->doomed) {
    handoff_start(h);
    return;
  }
  op_fail(h, OSR_PERR_BOOT_FAILED);
  h->step = S_DONE;
  uv_timer_start(&h->timer, on_op_timer, 0, 0);
}

static int start_create(lp_t *lp, const osr_sandbox_spec_t *spec, osr_isolation_t iso,
                        lop_kind_t kind, const char *snapshot, osr_provider_create_cb cb,
                        void *data)
{
  if (lp->closing)
    return OSR_ECANCELED;
  if (!(lp->iso_mask & (1u << iso)))
    return OSR_PERR_INVALID;
  uint32_t mem = spec && spec->caps.min_memory_mib ? spec->caps.min_memory_mib : lp->mem_default;
  uint32_t vcpus = spec && spec->caps.vcpus ? spec->caps.vcpus : lp->vcpus_default;
  if (mem > lp->mem_max || vcpus > lp->vcpus_max)
    return OSR_PERR_INVALID;
  if (spec != NULL && spec->caps.gpu_count > 0)
    return OSR_PERR_INVALID;
  if (lp->nsbx >= L_MAX_SANDBOXES)
    return OSR_PERR_CAPACITY;
  const char *tmpl = spec && spec->template_id && spec->template_id[0] ? spec->template_id
                                                                       : "base";
  if (strcmp(tmpl, "base") != 0 && strcmp(tmpl, "default") != 0)
    return OSR_PERR_INVALID; /* local templates map to bases; only the host userland so far */

  /* Warm pool: hand out a fully ready sandbox when one fits. */
  /* Not for a create without a token: the warm agent already requires its
   * pool token and /init cannot make an agent open again. */
  if (kind == K_CREATE && snapshot == NULL && !lp->pool_disabled &&
      mem == lp->mem_default && vcpus == lp->vcpus_default && spec->agent_token != NULL &&
      spec->agent_token[0] != '\0') {
    lsb_t *w = pool_take(lp, iso, tmpl);
    if (w != NULL) {
      lop_t *op = op_new(lp, K_CREATE, w, (void *)cb, data);
      int rv = env_pack(op, spec->env);
      if (rv != 0) {
        op->delivered = 1;
        op_finish(op);
        return rv;
      }
      /* The warm agent was started with the token "pool-<id>"; the handoff
       * replaces it (token file + POST /init) before anyone sees it. */
      cpy(op->sandbox_id, sizeof(op->sandbox_id), spec->sandbox_id);
      cpy(op->tenant, sizeof(op->tenant), spec->tenant);
      op->timeout_s = spec->timeout_s;
      fmt(op->old_token, sizeof(op->old_token), "pool-%s", w->id);
      cpy(op->token, sizeof(op->token), spec->agent_token);
      json_t *envs = json_object();
      for (size_t off = 0; off < op->env_len;) {
        const char *kv = op->env_blob + off;
        const char *eq = strchr(kv, '='); /* env_pack wrote KEY=VALUE */
        if (eq != NULL) {
          char key[128];
          size_t kl = (size_t)(eq - kv) < sizeof(key) ? (size_t)(eq - kv) : sizeof(key) - 1;
          memcpy(key, kv, kl);
          key[kl] = '\0';
          json_object_set_new(envs, key, json_string(eq + 1));
        }
        off += strlen(kv) + 1;
      }
      /* envd's /init body; the timestamp makes a delayed duplicate a no-op. */
      char ts[40];
      int64_t ms = now_ms();
      time_t secs = (time_t)(ms / 1000);
      struct tm tm;
      gmtime_r(&secs, &tm);
      fmt(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
          tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ms % 1000));
      json_t *body = json_pack("{s:s, s:o, s:s}", "accessToken", op->token, "envVars", envs,
                               "timestamp", ts);
      op->init_json = json_dumps(body, JSON_COMPACT);
      json_decref(body);
      op->step = S_HANDOFF_WRITE;
      op->t0_ns = uv_hrtime();
      if (w->creating) {
        OSR_LOG_DEBUG(MOD, "%s: taken from the pool while its meta.json is written: handed out "
                      "when that is done", w->id);
        w->handoff = op;
      } else {
        handoff_start(op);
      }
      /* The refill starts when the handoff is done (op_next), not now: its
       * prepare job would queue in the thread pool ahead of the handoff's. */
      return 0;
    }
  }

  char id[40];
  new_id(lp, id, sizeof(id));
  lsb_t *sb = sb_new(lp, id, iso);
  sb->uid = pick_uid(lp);
  sb->mem_mib = mem;
  sb->vcpus = vcpus;
  sb->pids_max = lp->pids_max;
  sb->disk_mib = lp->disk_mib;
  cpy(sb->tmpl, sizeof(sb->tmpl), tmpl);
  sb->created_ms = now_ms();
  if (kind == K_POOL) {
    sb->warm = 1;
  } else {
    cpy(sb->sandbox_id, sizeof(sb->sandbox_id), spec->sandbox_id);
    cpy(sb->tenant, sizeof(sb->tenant), spec->tenant);
    sb->expires_ms = spec->timeout_s ? sb->created_ms + (int64_t)spec->timeout_s * 1000 : 0;
  }
  lop_t *op = op_new(lp, kind, sb, (void *)cb, data);
  if (kind == K_CREATE) {
    int rv = env_pack(op, spec->env);
    if (rv != 0) {
      op->delivered = 1;
      op_finish(op); /* frees sb too: never inserted, last ref */
      return rv;
    }
    cpy(op->token, sizeof(op->token), spec->agent_token);
  } else {
    fmt(op->token, sizeof(op->token), "pool-%s", sb->id);
  }
  if (snapshot != NULL)
    cpy(op->snapshot_path, sizeof(op->snapshot_path), snapshot);
  sb_insert(lp, sb);
  sb->creating = 1;
  op->step = S_PREP;
  op_next(op);
  return 0;
}

static int local_create(osr_provider_t *p, const osr_sandbox_spec_t *spec,
                        osr_provider_create_cb cb, void *data)
{
  lp_t *lp = p->impl;
  if (spec == NULL || spec->sandbox_id == NULL || spec->sandbox_id[0] == '\0')
    return OSR_PERR_INVALID;
  osr_isolation_t iso = spec->isolation != OSR_ISO_NONE ? spec->isolation : OSR_ISO_CONTAINER;
  return start_create(lp, spec, iso, K_CREATE, NULL, cb, data);
}

static int local_destroy(osr_provider_t *p, const char *provider_id, osr_provider_done_cb cb,
                         void *data)
{
  lp_t *lp = p->impl;
  if (lp->closing)
    return OSR_ECANCELED;
  lsb_t *sb = provider_id ? sb_find(lp, provider_id) : NULL;
  if (sb == NULL || sb->doomed)
    return OSR_PERR_NOT_FOUND;
  if (sb->creating)
    return OSR_EBUSY; /* its create answers first (and cleans up on failure) */
  lop_t *op = op_new(lp, cb == on_ttl_destroyed ? K_TTL : K_DESTROY, sb, (void *)cb, data);
  sb->doomed = 1;
  sb->ready = 0;
  op->step = sb->iso == OSR_ISO_GVISOR ? S_KILL_RUNSC : S_CLEAN;
  /* Start from the timer so the callback never runs inside this call. */
  uv_timer_start(&op->timer, on_op_timer, 0, 0);
  return 0;
}

static int local_get(osr_provider_t *p, const char *provider_id, osr_provider_get_cb cb,
                     void *data)
{
  lp_t *lp = p->impl;
  if (lp->closing)
    return OSR_ECANCELED;
  lsb_t *sb = provider_id ? sb_find(lp, provider_id) : NULL;
  if (sb == NULL || sb->doomed || sb->warm)
    return OSR_PERR_NOT_FOUND;
  lop_t *op = op_new(lp, K_GET, sb, (void *)cb, data);
  op->step = S_CHECK;
  uv_timer_start(&op->timer, on_op_timer, 0, 0);
  return 0;
}

static int local_list(osr_provider_t *p, osr_provider_list_cb cb, void *data)
{
  lp_t *lp = p->impl;
  if (lp->closing)
    return OSR_ECANCELED;
  lop_t *op = op_new(lp, K_LIST, NULL, (void *)cb, data);
  op->step = S_SCAN;
  uv_timer_start(&op->timer, on_op_timer, 0, 0);
  return 0;
}

static int pause_resume(lp_t *lp, const char *provider_id, int pause, lop_kind_t kind,
                        void *cb, void *data)
{
  if (lp->closing)
    return OSR_ECANCELED;
  lsb_t *sb = provider_id ? sb_find(lp, provider_id) : NULL;
  if (sb == NULL || sb->doomed || sb->warm)
    return OSR_PERR_NOT_FOUND;
  if (sb->iso == OSR_ISO_CONTAINER && !lp->cg.freezer)
    return OSR_PERR_UNSUPPORTED;
  lop_t *op = op_new(lp, kind, sb, cb, data);
  op->pause_target = pause;
  op->step = sb->iso == OSR_ISO_GVISOR ? S_RUNSC_PAUSE : S_FREEZE;
  uv_timer_start(&op->timer, on_op_timer, 0, 0);
  return 0;
}

static int local_pause(osr_provider_t *p, const char *provider_id, osr_provider_done_cb cb,
                       void *data)
{
  return pause_resume(p->impl, provider_id, 1, K_PAUSE, (void *)cb, data);
}

static int local_resume(osr_provider_t *p, const char *provider_id, osr_provider_create_cb cb,
                        void *data)
{
  return pause_resume(p->impl, provider_id, 0, K_RESUME, (void *)cb, data);
}

static int local_snapshot(osr_provider_t *p, const char *provider_id, const char *path,
                          osr_provider_snapshot_cb cb, void *data)
{
  lp_t *lp = p->impl;
  if (lp->closing)
    return OSR_ECANCELED;
  lsb_t *sb = provider_id ? sb_find(lp, provider_id) : NULL;
  if (sb == NULL || sb->doomed || sb->warm)
    return OSR_PERR_NOT_FOUND;
  if (path == NULL || path[0] != '/' || strlen(path) >= L_PATH)
    return OSR_PERR_INVALID;
  lop_t *op = op_new(lp, K_SNAPSHOT, sb, (void *)cb, data);
  cpy(op->snapshot_path, sizeof(op->snapshot_path), path);
  op->step = S_TAR;
  uv_timer_start(&op->timer, on_op_timer, 0, 0);
  return 0;
}

static int local_restore(osr_provider_t *p, const osr_sandbox_spec_t *spec, const char *path,
                         osr_provider_create_cb cb, void *data)
{
  lp_t *lp = p->impl;
  if (spec == NULL || spec->sandbox_id == NULL || spec->sandbox_id[0] == '\0' || path == NULL ||
      path[0] != '/' || strlen(path) >= L_PATH)
    return OSR_PERR_INVALID;
  osr_isolation_t iso = spec->isolation != OSR_ISO_NONE ? spec->isolation : OSR_ISO_CONTAINER;
  return start_create(lp, spec, iso, K_CREATE, path, cb, data);
}

/* ---- warm pool ---------------------------------------------------------------------- */

static void pool_kick(lp_t *lp)
{
  if (lp->closing || lp->pool_disabled || !lp->scanned)
    return;
  for (int i = 0; i < 2; i++) {
    lpool_t *pl = &lp->pools[i];
    if (pl->target == 0 || !(lp->iso_mask & (1u << pl->iso)))
      continue;
    uint32_t have = 0;
    for (lsb_t *s = lp->sbx; s != NULL; s = s->next)
      if (s->warm && !s->doomed && s->iso == pl->iso && s->ready)
        have++;
    /* Refill one at a time per class so a burst of pool creates does not
     * compete with the user creates it is meant to speed up. */
    if (have + pl->filling < pl->target && pl->filling == 0) {
      pl->filling++;
      if (start_create(lp, NULL, pl->iso, K_POOL, NULL, NULL, NULL) != 0)
        pl->filling--;
    }
  }
}

static void on_kick_list(osr_provider_t *p, int status, const osr_resource_t *res, size_t n,
                         void *data)
{
  (void)res;
  (void)data;
  if (status != 0 && status != OSR_ECANCELED)
    OSR_LOG_WARN(MOD, "provider '%s': initial scan failed: %s", p->name, osr_strerror(status));
}

/* The first scan right after init; later, a delayed pool refill after a
 * failed pool create. */
static void on_kick(uv_timer_t *t)
{
  lp_t *lp = t->data;
  if (!lp->scanned)
    local_list(lp->p, on_kick_list, NULL);
  else
    pool_kick(lp);
}

/* ---- close ------------------------------------------------------------------------- */

static void on_kick_close(uv_handle_t *h)
{
  lp_t *lp = h->data;
  lp->kick_open = 0;
  maybe_close_done(lp);
}

static void on_reap_close(osr__lreap_t *r);

static void maybe_close_done(lp_t *lp)
{
  if (!lp->closing || lp->nops > 0 || lp->kick_open || lp->close_cb == NULL)
    return;
  if (lp->reap_open) {
    /* The last destroys have ended: reap what they left, then close. */
    if (!lp->reap_closing) {
      lp->reap_closing = 1;
      osr__lreap_close(&lp->reap, on_reap_close);
    }
    return;
  }
  for (lsb_t *s = lp->sbx; s != NULL; s = s->next)
    if (s->ttl_open || s->proc_open)
      return;
  /* A /run/osr/local-<hash> root exists only for this state dir: once it
   * holds no sandbox (and runsc keeps no state in it), remove it, or every
   * gateway that ever ran with a private data dir leaves an empty
   * directory in /run/osr behind. rmdir() removes only empty directories,
   * so sandboxes still running (they outlive the gateway) keep their root;
   * the table is not consulted because a list() that overlapped a destroy
   * can leave a record of a sandbox that is gone. Two rmdir() calls, once,
   * at close: not worth a thread-pool round trip during the teardown. */
  if (lp->run_root) {
    char runsc_root[sizeof(lp->state_dir) + 8];
    fmt(runsc_root, sizeof(runsc_root), "%s/runsc", lp->state_dir);
    rmdir(runsc_root);
    if (rmdir(lp->state_dir) == 0)
      OSR_LOG_DEBUG(MOD, "provider '%s': removed %s (empty)", lp->p->name, lp->state_dir);
  }
  /* Everything closed: free the remaining (still running) sandbox records. */
  while (lp->sbx != NULL) {
    lsb_t *s = lp->sbx;
    lp->sbx = s->next;
    osr_free(s);
  }
  void (*cb)(osr_provider_t *p) = lp->close_cb;
  osr_provider_t *p = lp->p;
  lp->close_cb = NULL;
  osr_free(lp);
  p->impl = NULL;
  cb(p);
}

static void on_reap_close(osr__lreap_t *r)
{
  lp_t *lp = osr_container_of(r, lp_t, reap);
  lp->reap_open = 0;
  maybe_close_done(lp);
}

static void local_close(osr_provider_t *p, void (*cb)(osr_provider_t *p))
{
  lp_t *lp = p->impl;
  /* Warm-pool sandboxes carry no label and no usable token: they must not
   * outlive the provider. Their destroys run to completion before close
   * finishes (destroy ops are never cancelled). */
  for (lsb_t *s = lp->sbx, *next; s != NULL; s = next) {
    next = s->next;
    if (s->warm && !s->doomed && !s->creating)
      local_destroy(p, s->id, on_ttl_destroyed, NULL);
  }
  lp->closing = 1;
  lp->close_cb = cb;
  /* In-flight ops answer ECANCELED at their next step; work and commands
   * already started run to completion first (they cannot be interrupted
   * safely), and a create that was cancelled leaves its sandbox to be
   * found by the next scan. */
  for (lop_t *op = lp->ops; op != NULL; op = op->next) {
    if (op->delivered || op->kind == K_DESTROY || op->kind == K_TTL)
      continue;
    op->cancelled = 1;
    if (op->kind == K_POOL)
      continue; /* tears down at its next step (op_next) */
    if (op->pending == 0) {
      uv_timer_stop(&op->timer);
      op_finish(op);
    }
  }
  for (lsb_t *s = lp->sbx; s != NULL; s = s->next) {
    if (s->ttl_open && !uv_is_closing((uv_handle_t *)&s->ttl))
      uv_close((uv_handle_t *)&s->ttl, on_sb_ttl_close);
    if (s->proc_open && !uv_is_closing((uv_handle_t *)&s->proc))
      uv_close((uv_handle_t *)&s->proc, on_sb_proc_close);
  }
  if (lp->kick_open && !uv_is_closing((uv_handle_t *)&lp->kick))
    uv_close((uv_handle_t *)&lp->kick, on_kick_close);
  maybe_close_done(lp);
}

/* ---- availability probe (configuration time, blocking) -------------------------- */

/* Run argv with no stdio, wait at most timeout_ms; 1 if it exited 0. Only
 * for local_available(), which runs before any loop exists. */
static int probe_run(char *const argv[], int timeout_ms)
{
  pid_t pid = fork();
  if (pid < 0)
    return 0;
  if (pid == 0) {
    int fd = open("/dev/null", O_RDWR);
    if (fd >= 0) {
      dup2(fd, 0);
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(argv[0], argv);
    _exit(127);
  }
  int st = 0;
  for (int waited = 0;; waited += 2) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid)
      return WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (r < 0 || waited >= timeout_ms) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return 0;
    }
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
}

/* Success: what enforces the container class's limits here, for
 * `osr doctor` (its "provider" line shows `why` either way). */
static int available_ok(char *why, size_t whylen)
{
  osr__lcg_t cg;
  char limits[1024];
  /* Read-only: what init would choose with no cgroup_parent key. */
  if (osr__lcg_probe(&cg, getenv("OSR_LOCAL_CGROUP_PARENT")) != 0) {
    fmt(why, whylen, "OSR_LOCAL_CGROUP_PARENT is not a cgroup path");
    return 0;
  }
  if (cg.v2_host && cg.mode == OSR__LCG_NONE) {
    /* The reason first: doctor's line is short, and it is what to fix. */
    fmt(why, whylen, "container limits by rlimits, not cgroup v2: %s", cg.note);
    return 1;
  }
  fmt(why, whylen, "container limits by %s", osr__lcg_describe(&cg, limits, sizeof(limits)));
  return 1;
}

static int local_available(char *why, size_t whylen)
{
  if (geteuid() != 0) {
    fmt(why, whylen, "the local provider needs root (a host uid, cgroups and a tmpfs per "
                     "sandbox)");
    return 0;
  }
  char self[L_PATH], agent[L_PATH + 16];
  ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
  self[sl > 0 ? sl : 0] = '\0';
  char *slash = strrchr(self, '/');
  if (slash != NULL)
    *slash = '\0';
  fmt(agent, sizeof(agent), "%s/osr-agent", self);
  if (access(agent, X_OK) != 0) {
    fmt(why, whylen, "osr-agent is not installed next to this binary (%s)", agent);
    return 0;
  }
  /* container: exactly what a sandbox needs (an unprivileged uid creating
   * every namespace), so a host that forbids unprivileged user namespaces
   * is caught here and not at the first create. */
  char bwhy[128] = "", *bw = "/usr/bin/bwrap";
  if (access(bw, X_OK) != 0 || access("/usr/bin/setpriv", X_OK) != 0) {
    fmt(bwhy, sizeof(bwhy), "bwrap/setpriv not installed");
  } else {
    char *a[] = {"/usr/bin/setpriv", "--reuid=200000", "--regid=200000", "--clear-groups", "--",
                 bw, "--unshare-all", "--unshare-user", "--die-with-parent", "--ro-bind", "/usr",
                 "/usr", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/lib", "/lib",
                 "--proc", "/proc", "--dev", "/dev", "/usr/bin/true", NULL};
    if (probe_run(a, 5000))
      return available_ok(why, whylen);
    fmt(bwhy, sizeof(bwhy), "bwrap cannot create namespaces as an unprivileged uid");
  }
  char *rs = "/usr/bin/runsc";
  if (access(rs, X_OK) != 0) {
    fmt(why, whylen, "%s; runsc not installed", bwhy);
    return 0;
  }
  char *a[] = {rs, "--platform=ptrace", "--network=none", "do", "/usr/bin/true", NULL};
  if (probe_run(a, 20000))
    return available_ok(why, whylen);
  fmt(why, whylen, "%s; runsc --platform=ptrace do fails", bwhy);
  return 0;
}

const osr_adapter_t osr_adapter_local = {
  .version = OSR_ADAPTER_VERSION,
  .type = "local",
  .init = local_init,
  .describe = local_describe,
  .create = local_create,
  .destroy = local_destroy,
  .get = local_get,
  .list = local_list,
  .pause = local_pause,
  .resume = local_resume,
  .close = local_close,
  .snapshot = local_snapshot,
  .restore = local_restore,
  .available = local_available,
};
