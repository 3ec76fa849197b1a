/*
 * vfork-style process spawner for osr-agent (see spawn.h for why).
 *
 * The child runs on a separate stack in the agent's own address space
 * until its execve: the calling thread is suspended by CLONE_VFORK
 * meanwhile, but the agent's thread-pool threads are not, and the child
 * shares the calling thread's TLS (errno, ASan's thread state). So the
 * child function:
 *   - only reads its context and writes one int back (the failing errno),
 *   - calls nothing that takes a lock or touches shared libc state (no
 *     malloc, no stdio, no glibc setuid which signals every thread): only
 *     raw system calls through syscall(2),
 *   - is not instrumented by the sanitizers (their runtime would see the
 *     agent's thread state on a foreign stack).
 * All signals are blocked in the parent across clone(), so no handler of
 * the agent (libuv's signal pipe writers) can run on the child's stack;
 * the child puts back to the default every disposition of signals 1..33
 * the agent does not have at the default (its signal table is its own: no
 * CLONE_SIGHAND; the real-time ones above are at their default since
 * start-up) and unblocks them just before the exec, as libuv's child
 * does. Which ones those are is a snapshot (osr__agent_spawn_snapshot):
 * libuv's child resets all 31, and in gVisor each of those system calls
 * is a ptrace round trip through the sentry (~5 host ptrace calls each,
 * bench/results/tti.md "gVisor warm exec").
 */
#include "agent/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/log.h"
#include "util/mem.h"

/* The child's stack. It is used only between clone() and the child's exec
 * or exit, while the (single) loop thread waits in clone(), so one stack
 * serves every spawn. The child's deepest frame is its path buffer. */
#define CHILD_STACK_BYTES (64 * 1024)
#define GUARD_BYTES       4096

/* The kernel's struct sigaction for rt_sigaction (not glibc's). */
struct k_sigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)(void);
  uint64_t mask;
};

typedef struct spawn_ctx_s {
  const agent_spawn_opts_t *o;
  uint64_t reset;          /* bit s-1: signal s needs SIG_DFL (a copy of reset_set) */
  int reset_sched;         /* the agent runs SCHED_BATCH: the child goes back to SCHED_OTHER */
  const char *path;        /* the PATH to search */
  char **sh_argv;          /* [ "/bin/sh", <file>, argv[1..] ]: ENOEXEC fallback, as execvp */
  volatile int err;        /* set by the child when a step before the exec failed */
  volatile int cwd_status; /* opts.cwd_status's value, set by the child */
} spawn_ctx_t;

static char *child_stack; /* mmap'd on first use, lowest page a guard */
static uv_signal_t sigchld;
static int sigchld_init;
static agent_child_t *children; /* not yet reaped */
static size_t nrefs;            /* children with a callback: they keep the loop alive */

/* The child resets the dispositions of signals 1..this; the agent never
 * sets a handler (or SIG_IGN) on a signal above it, and puts those back to
 * the default at start-up (an ignored signal is inherited across exec). */
#define SPAWN_LAST_HANDLED_SIGNAL 33

/* What the child must undo, as of the last osr__agent_spawn_snapshot():
 * the signals (1..33) whose disposition is not SIG_DFL (a handler, or
 * SIG_IGN: both would otherwise reach the command, a handler only until
 * its exec, SIG_IGN across it) and whether the agent runs SCHED_BATCH. */
static uint64_t reset_set;
static int reset_sched;
static int snapshot_taken;

#define NO_SAN __attribute__((no_sanitize("address", "undefined"), noinline))

static NO_SAN void child_exec_one(spawn_ctx_t *ctx, const char *file)
{
  const agent_spawn_opts_t *o = ctx->o;
  syscall(SYS_execve, file, o->argv, o->env);
  if (errno == ENOEXEC) {
    /* A script without #!: execvp hands it to the shell. */
    ctx->sh_argv[1] = (char *)file;
    syscall(SYS_execve, "/bin/sh", ctx->sh_argv, o->env);
    errno = ENOEXEC;
  }
}

/* The reason for a failed exec as the terminal shows it. A table, not
 * strerror(): that may take the locale lock of a thread we borrowed. */
static NO_SAN const char *child_reason(int e)
{
  switch (e) {
  case ENOENT:
    return "No such file or directory";
  case EACCES:
    return "Permission denied";
  case ENOEXEC:
    return "Exec format error";
  case ENOTDIR:
    return "Not a directory";
  case ELOOP:
    return "Too many levels of symbolic links";
  case ENAMETOOLONG:
    return "File name too long";
  case E2BIG:
    return "Argument list too long";
  case ENOMEM:
    return "Cannot allocate memory";
  case ENOTTY:
    return "Inappropriate ioctl for device";
  default:
    return "cannot execute";
  }
}

static NO_SAN void child_puts(const char *s)
{
  size_t n = 0;
  while (s[n] != '\0')
    n++;
  syscall(SYS_write, 2, s, n);
}

/* fail_in_child: report on fd 2 and exit as a shell would. */
static NO_SAN void child_die(const char *what, const char *file, int e)
{
  child_puts("osr-agent: ");
  child_puts(what);
  if (file != NULL) {
    child_puts(" ");
    child_puts(file);
  }
  child_puts(": ");
  child_puts(child_reason(e));
  child_puts("\r\n");
  syscall(SYS_exit_group, e == ENOENT ? 127 : 126);
}

static NO_SAN int child_main(void *arg)
{
  spawn_ctx_t *ctx = arg;
  const agent_spawn_opts_t *o = ctx->o;
  struct k_sigaction dfl;
  uint64_t none = 0;
  int e;

  dfl.handler = SIG_DFL;
  dfl.flags = 0;
  dfl.restorer = NULL;
  dfl.mask = 0;
  /* Only the signals the agent does not have at the default (5 in a
   * running agent: PIPE, TERM, INT, CHLD and glibc's 33) instead of all
   * of 1..33: in gVisor every one is a round trip through the sentry. */
  for (int s = 1; s <= SPAWN_LAST_HANDLED_SIGNAL; s++)
    if (ctx->reset & (UINT64_C(1) << (s - 1)))
      syscall(SYS_rt_sigaction, s, &dfl, NULL, sizeof(uint64_t));
  /* The agent runs SCHED_BATCH (main.c --sched) for its own sake; what it
   * starts gets the default policy (SCHED_RESET_ON_FORK resets only
   * real-time policies, so it is done here). */
  if (ctx->reset_sched) {
    struct sched_param sp = {.sched_priority = 0};
    syscall(SYS_sched_setscheduler, 0, SCHED_OTHER, &sp);
  }

  if (o->new_session && syscall(SYS_setsid) < 0)
    goto fail;
  for (int i = 0; i < 3; i++) {
    int fd = o->stdio[i];
    if (fd < 0) {
      fd = (int)syscall(SYS_openat, AT_FDCWD, "/dev/null", i == 0 ? O_RDONLY : O_RDWR);
      if (fd < 0)
        goto fail;
      if (fd != i) {
        if (syscall(SYS_dup3, fd, i, 0) < 0)
          goto fail;
        syscall(SYS_close, fd);
      }
    } else if (fd == i) {
      if (syscall(SYS_fcntl, fd, F_SETFD, 0) < 0)
        goto fail;
    } else if (syscall(SYS_dup3, fd, i, 0) < 0) {
      goto fail;
    }
  }
  if (o->ctty && syscall(SYS_ioctl, 0, TIOCSCTTY, 0) < 0) {
    if (o->fail_in_child)
      child_die("cannot make the pty the controlling terminal", NULL, errno);
    goto fail;
  }
  if (o->cwd != NULL && syscall(SYS_chdir, o->cwd) < 0) {
    /* Checked here rather than by a stat before the spawn: that stat was
     * a thread-pool hop (process.c "fast path"). */
    e = errno;
    if (o->cwd_fallback == NULL || (e != ENOENT && e != ENOTDIR) ||
        syscall(SYS_chdir, o->cwd_fallback) < 0) {
      ctx->cwd_status = e;
      errno = e;
      goto fail;
    }
    ctx->cwd_status = -1;
  }
  if (o->switch_ids) {
    syscall(SYS_setgroups, 0, NULL); /* fails unless root; libuv ignores it too */
    if (syscall(SYS_setgid, o->gid) < 0 || syscall(SYS_setuid, o->uid) < 0)
      goto fail;
  }
  syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, sizeof(none));

  /* execvp's search, over the child's PATH (glibc's execvpe would search
   * the agent's own environment). */
  const char *f = o->file;
  int slash = 0;
  size_t flen = 0;
  for (; f[flen] != '\0'; flen++)
    slash |= f[flen] == '/';
  if (slash || flen == 0) {
    child_exec_one(ctx, f);
    goto exec_failed;
  }
  char buf[PATH_MAX];
  int eacces = 0;
  const char *p = ctx->path;
  for (;;) {
    const char *end = p;
    while (*end != '\0' && *end != ':')
      end++;
    size_t dlen = (size_t)(end - p);
    if (dlen + 1 + flen + 1 <= sizeof(buf)) {
      size_t n = 0;
      if (dlen == 0) { /* an empty entry is the current directory */
        buf[n++] = '.';
      } else {
        for (size_t k = 0; k < dlen; k++)
          buf[n++] = p[k];
      }
      buf[n++] = '/';
      for (size_t k = 0; k <= flen; k++)
        buf[n++] = f[k];
      child_exec_one(ctx, buf);
      switch (errno) {
      case EACCES:
        eacces = 1;
        break;
      case ENOENT:
      case ENOTDIR:
      case ESTALE:
      case ENODEV:
      case ETIMEDOUT:
        break;
      default:
        goto exec_failed;
      }
    }
    if (*end == '\0')
      break;
    p = end + 1;
  }
  errno = eacces ? EACCES : ENOENT;
exec_failed:
  if (o->fail_in_child)
    child_die("exec", f, errno);
fail:
  e = errno;
  ctx->err = e != 0 ? e : EINVAL;
  syscall(SYS_exit, 127);
  return 127;
}

/* The dispositions of signals 1..33 as a set of the non-default ones
 * (raw system calls: glibc refuses its internal 32 and 33). */
static uint64_t read_dispositions(void)
{
  uint64_t set = 0;
  for (int s = 1; s <= SPAWN_LAST_HANDLED_SIGNAL; s++) {
    struct k_sigaction old;
    if (s == SIGKILL || s == SIGSTOP)
      continue;
    memset(&old, 0, sizeof(old));
    if (syscall(SYS_rt_sigaction, s, NULL, &old, sizeof(uint64_t)) != 0 || old.handler != SIG_DFL)
      set |= UINT64_C(1) << (s - 1); /* unreadable: reset it to be safe */
  }
  return set;
}

void osr__agent_spawn_snapshot(void)
{
  reset_set = read_dispositions();
  reset_sched = sched_getscheduler(0) == SCHED_BATCH;
  snapshot_taken = 1;
}

void osr__agent_spawn_init_signals(void)
{
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = SIG_DFL;
  for (int s = SPAWN_LAST_HANDLED_SIGNAL + 1; s <= 64; s++)
    sigaction(s, &sa, NULL); /* EINVAL for none of them on Linux; nothing to undo */
}

/* ---- reaping --------------------------------------------------------------------------- */

static void unlink_child(agent_child_t *c)
{
  for (agent_child_t **pp = &children; *pp != NULL; pp = &(*pp)->_next) {
    if (*pp == c) {
      *pp = c->_next;
      return;
    }
  }
}

static void drop_ref(void)
{
  if (--nrefs == 0 && sigchld_init)
    uv_unref((uv_handle_t *)&sigchld);
}

static void on_sigchld(uv_signal_t *h, int signum)
{
  (void)h;
  (void)signum;
  /* Bounded: every iteration reaps one zombie, and there are at most as
   * many as the pids limit allows. */
  for (;;) {
    int st;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid <= 0)
      break; /* 0: children left but running; -1 ECHILD: none */
    agent_child_t *c = children;
    while (c != NULL && c->pid != pid)
      c = c->_next;
    if (c == NULL)
      continue; /* an orphan reparented to us (we are pid 1): just reaped */
    unlink_child(c);
    agent_child_exit_cb cb = c->_cb;
    if (cb != NULL) {
      drop_ref();
      int64_t code = WIFEXITED(st) ? WEXITSTATUS(st) : 0;
      int sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
      cb(c, code, sig);
    }
    osr_free(c);
  }
}

void osr__agent_child_detach(agent_child_t *c)
{
  if (c->_cb == NULL)
    return;
  c->_cb = NULL;
  c->data = NULL;
  drop_ref();
}

void osr__agent_spawn_close(void)
{
  if (!sigchld_init)
    return;
  uv_close((uv_handle_t *)&sigchld, NULL);
  sigchld_init = 0;
  /* Records of children that never exited: the kernel hands those to init. */
  while (children != NULL) {
    agent_child_t *c = children;
    children = c->_next;
    osr_free(c);
  }
}

/* ---- spawning -------------------------------------------------------------------------- */

static int ensure_setup(uv_loop_t *loop)
{
  if (child_stack == NULL) {
    char *m = mmap(NULL, CHILD_STACK_BYTES + GUARD_BYTES, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (m == MAP_FAILED)
      return -errno;
    /* A stack overflow in the child faults instead of writing over the heap. */
    if (mprotect(m, GUARD_BYTES, PROT_NONE) != 0) {
      int e = errno;
      munmap(m, CHILD_STACK_BYTES + GUARD_BYTES);
      return -e;
    }
    child_stack = m;
  }
  if (!sigchld_init) {
    int rv = uv_signal_init(loop, &sigchld);
    if (rv == 0)
      rv = uv_signal_start(&sigchld, on_sigchld, SIGCHLD);
    if (rv != 0)
      return rv;
    uv_unref((uv_handle_t *)&sigchld);
    sigchld_init = 1;
    /* libuv's handler is on SIGCHLD now. */
    reset_set |= UINT64_C(1) << (SIGCHLD - 1);
  }
  if (!snapshot_taken)
    osr__agent_spawn_snapshot();
#if defined(__SANITIZE_ADDRESS__)
  /* Test builds check the contract in spawn.h: a disposition changed
   * since the snapshot would reach the command (or run an agent handler
   * on the child's stack). Only a handler that went away may be stale. */
  uint64_t now = read_dispositions();
  if ((now & ~reset_set) != 0) {
    OSR_LOG_ERROR("agent",
                  "spawn: signal dispositions changed since the snapshot (%#llx not in %#llx)",
                  (unsigned long long)now, (unsigned long long)reset_set);
    abort();
  }
#endif
  return 0;
}

int osr__agent_spawn(uv_loop_t *loop, const agent_spawn_opts_t *opts, agent_child_exit_cb cb,
                     agent_child_t **out)
{
  *out = NULL;
  int rv = ensure_setup(loop);
  if (rv != 0)
    return rv;

  const char *path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  for (char **e = opts->env; e != NULL && *e != NULL; e++) {
    if (strncmp(*e, "PATH=", 5) == 0) {
      path = *e + 5; /* the first, as getenv() in the child would see it */
      break;
    }
  }
  size_t argc = 0;
  while (opts->argv[argc] != NULL)
    argc++;
  char **sh_argv = osr_xcalloc(argc + 2, sizeof(char *));
  sh_argv[0] = (char *)"/bin/sh";
  for (size_t i = 1; i < argc; i++)
    sh_argv[i + 1] = opts->argv[i];

  spawn_ctx_t ctx;
  ctx.o = opts;
  ctx.reset = reset_set;
  ctx.reset_sched = reset_sched;
  ctx.path = path;
  ctx.sh_argv = sh_argv;
  ctx.err = 0;
  ctx.cwd_status = 0;

  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = clone(child_main, child_stack + GUARD_BYTES + CHILD_STACK_BYTES,
                    CLONE_VM | CLONE_VFORK | SIGCHLD, &ctx);
  int e = errno;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  osr_free(sh_argv);
  if (pid < 0)
    return -e;
  if (opts->cwd_status != NULL)
    *opts->cwd_status = ctx.cwd_status;
  if (ctx.err != 0) {
    /* The child has exited already (CLONE_VFORK resumed us at its exit):
     * reap it here so its status never reaches on_sigchld. */
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
      ;
    return -ctx.err;
  }
  agent_child_t *c = osr_xcalloc(1, sizeof(*c));
  c->pid = pid;
  c->_cb = cb;
  c->_next = children;
  children = c;
  if (nrefs++ == 0)
    uv_ref((uv_handle_t *)&sigchld);
  *out = c;
  return 0;
}
