/*
 * gvisor_exec_probe: the parts of a spawn, timed from inside one sandbox
 * (bench/gvisor_exec_count.py uploads it into a gVisor sandbox and counts
 * the sentry's host ptrace calls around each mode; bench/results/tti.md
 * "gVisor warm exec").
 *
 *   gvisor_exec_probe N MODE [PROGRAM ARG...]
 *
 * runs MODE N times (20 ms apart) and prints the first sample and the p50,
 * min and max in ms. PROGRAM defaults to /usr/bin/busybox echo ready (a
 * static binary in the read-only root). Modes:
 *   none            nothing (the baseline of the harness's counts)
 *   getppid         one system call
 *   sig31           31 rt_sigaction calls (what the agent's spawn child made)
 *   clone_exit      clone(CLONE_VM | CLONE_VFORK), the child exits at once
 *   fork_exit       fork(), the child exits at once (a new address space)
 *   vfork_exec      clone(CLONE_VM | CLONE_VFORK) + execve PROGRAM, to its
 *                   first output byte (the agent's way)
 *   fork_exec       fork() + execve PROGRAM, to its first output byte
 *   posix_spawn     glibc's posix_spawn (clone(CLONE_VM | CLONE_VFORK) too, and
 *                   its child reads or resets every signal's disposition)
 *   prefork_exec    a child forked ahead waits on a pipe; from the write to
 *                   the pipe to PROGRAM's first output byte (a pre-forked
 *                   spawn helper's critical path)
 *   prefork_noexec  the same child writes one byte itself instead
 * Static, libc only: it runs in sandboxes that have nothing but /usr.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static char child_stack[64 * 1024];
static char **prog;
static int prog_out = -1;

static double now_ms(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int child_exit(void *arg)
{
  (void)arg;
  syscall(SYS_exit, 0);
  return 0;
}

/* Raw system calls only: it runs on child_stack in the caller's memory. */
static int child_exec(void *arg)
{
  (void)arg;
  syscall(SYS_dup3, prog_out, 1, 0);
  syscall(SYS_execve, prog[0], prog, environ);
  syscall(SYS_exit, 127);
  return 127;
}

/* ms from t0 to the first byte on rfd (-1: none), then drain and reap. */
static double first_byte(int rfd, double t0, pid_t pid)
{
  char buf[256];
  double t = -1;
  if (read(rfd, buf, 1) == 1)
    t = now_ms() - t0;
  while (read(rfd, buf, sizeof(buf)) > 0)
    ;
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
    ;
  return t;
}

static double spawn_exec(int use_fork)
{
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0)
    return -1;
  prog_out = p[1];
  double t0 = now_ms();
  pid_t pid;
  if (use_fork) {
    pid = fork();
    if (pid == 0)
      child_exec(NULL);
  } else {
    pid = clone(child_exec, child_stack + sizeof(child_stack), CLONE_VM | CLONE_VFORK | SIGCHLD,
                NULL);
  }
  close(p[1]);
  double r = pid > 0 ? first_byte(p[0], t0, pid) : -1;
  close(p[0]);
  return r;
}

static double spawn_posix(void)
{
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0)
    return -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  double t0 = now_ms();
  pid_t pid = -1;
  int rv = posix_spawn(&pid, prog[0], &fa, NULL, prog, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(p[1]);
  double r = rv == 0 ? first_byte(p[0], t0, pid) : -1;
  close(p[0]);
  return r;
}

static double prefork(int do_exec)
{
  int go[2], out[2];
  if (pipe2(go, O_CLOEXEC) != 0)
    return -1;
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(go[0]);
    close(go[1]);
    return -1;
  }
  pid_t pid = fork();
  if (pid == 0) {
    char c;
    if (read(go[0], &c, 1) != 1)
      _exit(1);
    if (!do_exec) {
      _exit(write(out[1], "r", 1) == 1 ? 0 : 1);
    }
    dup2(out[1], 1);
    execve(prog[0], prog, environ);
    _exit(127);
  }
  close(go[0]);
  close(out[1]);
  usleep(20000); /* armed: the fork is behind us */
  double t0 = now_ms();
  double r = -1;
  if (pid > 0 && write(go[1], "x", 1) == 1)
    r = first_byte(out[0], t0, pid);
  close(go[1]);
  close(out[0]);
  return r;
}

static double clone_only(int use_fork)
{
  double t0 = now_ms();
  pid_t pid;
  if (use_fork) {
    pid = fork();
    if (pid == 0)
      _exit(0);
  } else {
    pid = clone(child_exit, child_stack + sizeof(child_stack), CLONE_VM | CLONE_VFORK | SIGCHLD,
                NULL);
  }
  while (pid > 0 && waitpid(pid, NULL, 0) < 0 && errno == EINTR)
    ;
  return now_ms() - t0;
}

static double sig31(void)
{
  struct {
    void (*handler)(int);
    unsigned long flags;
    void (*restorer)(void);
    unsigned long mask;
  } dfl = {SIG_DFL, 0, NULL, 0};
  double t0 = now_ms();
  for (int s = 1; s <= 33; s++)
    if (s != SIGKILL && s != SIGSTOP)
      syscall(SYS_rt_sigaction, s, &dfl, NULL, 8);
  return now_ms() - t0;
}

static int cmp(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
  static char *dflt[] = {"/usr/bin/busybox", "echo", "ready", NULL};
  if (argc < 3) {
    fprintf(stderr, "usage: gvisor_exec_probe N MODE [PROGRAM ARG...]\n");
    return 2;
  }
  long n = strtol(argv[1], NULL, 10);
  const char *mode = argv[2];
  prog = argc > 3 ? argv + 3 : dflt;
  if (n < 1 || n > 100000)
    return 2;
  double *v = calloc((size_t)n, sizeof(double));
  if (v == NULL)
    return 1;
  for (long i = 0; i < n; i++) {
    double x;
    if (strcmp(mode, "none") == 0)
      x = 0;
    else if (strcmp(mode, "getppid") == 0) {
      double t0 = now_ms();
      syscall(SYS_getppid);
      x = now_ms() - t0;
    } else if (strcmp(mode, "sig31") == 0)
      x = sig31();
    else if (strcmp(mode, "clone_exit") == 0)
      x = clone_only(0);
    else if (strcmp(mode, "fork_exit") == 0)
      x = clone_only(1);
    else if (strcmp(mode, "vfork_exec") == 0)
      x = spawn_exec(0);
    else if (strcmp(mode, "fork_exec") == 0)
      x = spawn_exec(1);
    else if (strcmp(mode, "posix_spawn") == 0)
      x = spawn_posix();
    else if (strcmp(mode, "prefork_exec") == 0)
      x = prefork(1);
    else if (strcmp(mode, "prefork_noexec") == 0)
      x = prefork(0);
    else {
      fprintf(stderr, "gvisor_exec_probe: unknown mode %s\n", mode);
      return 2;
    }
    v[i] = x;
    usleep(20000);
  }
  double first = v[0];
  qsort(v, (size_t)n, sizeof(double), cmp);
  printf("%s n=%ld first %.2f p50 %.2f min %.2f max %.2f ms\n", mode, n, first, v[n / 2], v[0],
         v[n - 1]);
  free(v);
  return 0;
}
