/*
 * Orphan reaping for the local provider (see local_int.h, osr__lreap_*).
 *
 * Why: `runsc run --detach` forks the gVisor sandbox and gofer processes
 * and exits, so they are orphans; the kernel hands an orphan to the nearest
 * ancestor that is a child subreaper, else to PID 1. `runsc delete` kills
 * the sandbox and then polls kill(pid, 0) every 100 ms for up to 5 s, and a
 * zombie still answers that poll: every destroy waited for PID 1 to reap.
 * On a host whose PID 1 reaps on a timer (the build VM's init reaps every
 * 2 s) a destroy took 1-2 s; where PID 1 never reaps (a container whose
 * entry point is the gateway, or a shell) `runsc delete` gave up after 5 s,
 * leaving its state files, and every zombie stayed. So the process that
 * runs the provider becomes a child subreaper (PR_SET_CHILD_SUBREAPER; a
 * PID 1 gets orphans anyway) and reaps them itself, from SIGCHLD.
 *
 * The reaper must never take the exit status of a child that libuv waits
 * for (a uv_process_t: runsc commands, container wrappers): libuv reaps
 * those by pid and would never see the exit. So it only peeks at the next
 * zombie (waitid WNOWAIT), skips the pass when that is a uv_process_t of
 * the loop (libuv reaps it in the same SIGCHLD round; the pass is retried
 * shortly after), and reaps everything else. It assumes, as the gateway
 * does, that every process this process spawns is a uv_process_t of this
 * loop. __WALL: gVisor's ptrace stubs are clone children (no SIGCHLD on
 * exit) and become our orphans when their sentry dies.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "adapters/local_int.h"
#include "util/log.h"
#include "util/mem.h"

#define MOD "local"
/* Zombies reaped per pass before yielding to the loop (a teardown of many
 * sandboxes at once leaves hundreds: stubs, gofers, sentries). */
#define LREAP_PER_PASS 256
/* Retry delay when the next zombie is libuv's (it reaps it this round). */
#define LREAP_RETRY_MS 5

/* Providers that made this process a subreaper (loop thread only: every
 * provider runs on the gateway's one loop). The attribute is cleared when
 * the last one closes. */
static unsigned subreaper_users;

static void on_retry(uv_timer_t *t);

/* The pids of the loop's uv_process_t handles, collected by one uv_walk
 * per pass (the walk is O(loop handles), a gateway's connections included,
 * so it is not repeated for each zombie). The loop thread spawns nothing
 * while a pass runs, so the set stays true for the whole pass. */
typedef struct uvpids_s {
  pid_t local[32];
  pid_t *pid;
  size_t n, cap;
  int failed; /* out of memory: fall back to a walk per zombie */
} uvpids_t;

static void collect_uv_child(uv_handle_t *h, void *arg)
{
  uvpids_t *w = arg;
  if (h->type != UV_PROCESS || w->failed)
    return;
  if (w->n == w->cap) {
    size_t cap = w->cap * 2;
    pid_t *p = osr_try_realloc(w->pid == w->local ? NULL : w->pid, cap * sizeof(*p));
    if (p == NULL) {
      w->failed = 1;
      return;
    }
    if (w->pid == w->local)
      memcpy(p, w->local, sizeof(w->local));
    w->pid = p;
    w->cap = cap;
  }
  w->pid[w->n++] = ((uv_process_t *)h)->pid;
}

typedef struct uvpid_s {
  pid_t pid;
  int found;
} uvpid_t;

static void find_uv_child(uv_handle_t *h, void *arg)
{
  uvpid_t *w = arg;
  if (h->type == UV_PROCESS && ((uv_process_t *)h)->pid == w->pid)
    w->found = 1;
}

/* Whether pid is a uv_process_t of the loop; the set is built on the
 * first call of a pass (walked is 0 until then). */
static int is_uv_child(uv_loop_t *loop, uvpids_t *w, int *walked, pid_t pid)
{
  if (!*walked) {
    uv_walk(loop, collect_uv_child, w);
    *walked = 1;
  }
  if (w->failed) {
    uvpid_t one = {pid, 0};
    uv_walk(loop, find_uv_child, &one);
    return one.found;
  }
  for (size_t i = 0; i < w->n; i++)
    if (w->pid[i] == pid)
      return 1;
  return 0;
}

unsigned osr__lreap_run(osr__lreap_t *r)
{
  unsigned n = 0;
  uvpids_t w;
  w.pid = w.local;
  w.n = 0;
  w.cap = sizeof(w.local) / sizeof(w.local[0]);
  w.failed = 0;
  int walked = 0;
  for (;;) {
    if (n == LREAP_PER_PASS) {
      uv_timer_start(&r->retry, on_retry, 0, 0);
      break;
    }
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT | __WALL) != 0 || si.si_pid == 0)
      break; /* ECHILD: no children; si_pid 0: none has exited */
    if (is_uv_child(r->loop, &w, &walked, si.si_pid)) {
      uv_timer_start(&r->retry, on_retry, LREAP_RETRY_MS, 0);
      break;
    }
    siginfo_t done;
    memset(&done, 0, sizeof(done));
    if (waitid(P_PID, (id_t)si.si_pid, &done, WEXITED | WNOHANG | __WALL) != 0)
      break;
    n++;
  }
  if (w.pid != w.local)
    osr_free(w.pid);
  r->reaped += n;
  return n;
}

static void on_retry(uv_timer_t *t)
{
  osr__lreap_run(t->data);
}

static void on_sigchld(uv_signal_t *s, int signum)
{
  (void)signum;
  osr__lreap_run(s->data);
}

int osr__lreap_init(osr__lreap_t *r, uv_loop_t *loop)
{
  memset(r, 0, sizeof(*r));
  r->loop = loop;
  if (getpid() != 1) {
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
      return -errno;
    r->subreaper = 1;
    subreaper_users++;
  }
  uv_signal_init(loop, &r->sig);
  r->sig.data = r;
  uv_timer_init(loop, &r->retry);
  r->retry.data = r;
  r->open = 2;
  int rv = uv_signal_start(&r->sig, on_sigchld, SIGCHLD);
  if (rv != 0)
    OSR_LOG_WARN(MOD, "SIGCHLD watcher: %s: orphans are reaped by PID 1 only", uv_strerror(rv));
  /* Neither handle may keep the loop (and the gateway) alive. */
  uv_unref((uv_handle_t *)&r->sig);
  uv_unref((uv_handle_t *)&r->retry);
  /* Orphans a closed provider left (see osr__lreap_close). */
  osr__lreap_run(r);
  return 0;
}

static void on_reap_close(uv_handle_t *h)
{
  osr__lreap_t *r = h->data;
  if (--r->open == 0 && r->close_cb != NULL)
    r->close_cb(r);
}

void osr__lreap_close(osr__lreap_t *r, void (*cb)(osr__lreap_t *r))
{
  if (r->open == 0) {
    if (cb != NULL)
      cb(r);
    return;
  }
  r->close_cb = cb;
  osr__lreap_run(r);
  if (r->subreaper && --subreaper_users == 0)
    prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
  r->subreaper = 0;
  uv_close((uv_handle_t *)&r->sig, on_reap_close);
  uv_close((uv_handle_t *)&r->retry, on_reap_close);
}
