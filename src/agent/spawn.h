/*
 * osr-agent's process spawner (private to src/agent).
 *
 * Why not uv_spawn: libuv 1.44 (Debian 12) spawns with fork(). Inside
 * gVisor on the ptrace platform a fork copies the agent's address space
 * into a new stub process and every page the child then touches before its
 * exec is a ptrace round trip; a command's fork + exec costs >= 8-10 ms
 * there (bench/results/tti.md). This spawner uses clone(CLONE_VM |
 * CLONE_VFORK), as glibc's posix_spawn does: the child borrows the agent's
 * address space until its execve, so only the exec builds a new one. It
 * also does what posix_spawn cannot: setuid/setgid per task (raw system
 * calls: glibc's setuid() would broadcast to the agent's threads) and
 * TIOCSCTTY for a pty child, so no re-exec trampoline is needed.
 *
 * Exits are collected by one SIGCHLD watcher per process (a uv_signal_t on
 * the loop of the first spawn) that reaps with waitpid(-1): the agent is
 * pid 1 of its sandbox in gVisor, so orphaned grandchildren are reaped too
 * instead of piling up as zombies against the pids limit. Nothing else in
 * the agent may spawn or wait for children (no uv_spawn, no system()).
 *
 * Loop thread only.
 */
#ifndef OSR_AGENT_SPAWN_H
#define OSR_AGENT_SPAWN_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

typedef struct agent_child_s agent_child_t;

/** Exit callback: exit_status is the exit code (0 if signalled),
 * term_signal the terminating signal (0 if it exited). The child record is
 * freed right after the callback returns. */
typedef void (*agent_child_exit_cb)(agent_child_t *c, int64_t exit_status, int term_signal);

struct agent_child_s {
  pid_t pid;  /**< set by osr__agent_spawn */
  void *data; /**< the caller's */
  /* private */
  agent_child_exit_cb _cb; /* NULL once detached: reaped silently */
  agent_child_t *_next;
};

typedef struct agent_spawn_opts_s {
  const char *file; /**< run as execvp would: searched in the PATH of env when it has no '/' */
  char **argv;      /**< NULL-terminated */
  char **env;       /**< NULL-terminated, the child's whole environment */
  const char *cwd;  /**< NULL: inherit */
  const char *cwd_fallback; /**< non-NULL: where the child goes when cwd does not exist
                                 (chdir ENOENT or ENOTDIR) instead of failing */
  int *cwd_status;          /**< non-NULL: set to 0 (cwd entered), -1 (cwd_fallback entered) or
                                 the errno of a failed chdir (the spawn then fails with it) */
  int stdio[3];             /**< fds dup2'd onto the child's 0-2 (may repeat); -1: /dev/null */
  int new_session;          /**< setsid(): the child leads its own process group */
  int ctty;          /**< with new_session: make fd 0 (a pty slave) the controlling terminal */
  int fail_in_child; /**< a failing TIOCSCTTY or exec is not a spawn error: the child writes
                          "osr-agent: exec FILE: reason\r\n" to its fd 2 and exits 127
                          (ENOENT) or 126, as a shell would (the pty semantics) */
  int switch_ids;    /**< setgroups(0), setgid(gid), setuid(uid) before the exec */
  uid_t uid;
  gid_t gid;
} agent_spawn_opts_t;

/** Start a child. On success returns 0, *out is the child's record
 * (pid set, data NULL) and cb fires exactly once, on the loop thread, when
 * the child is reaped, unless osr__agent_child_detach() came first. On
 * failure (clone, or any step before the exec including the exec itself:
 * ENOENT, EACCES, ...) returns a negative errno, the child (if any) is
 * already reaped, and cb never fires. The fds in opts stay the caller's. */
int osr__agent_spawn(uv_loop_t *loop, const agent_spawn_opts_t *opts, agent_child_exit_cb cb,
                     agent_child_t **out);

/** Stop caring about a child that has not exited yet: no callback will
 * fire; the record is freed when the child is reaped. c is invalid after. */
void osr__agent_child_detach(agent_child_t *c);

/** Close the SIGCHLD watcher (after the loop ran out of work, before
 * uv_loop_close). Children still unreaped are left to the parent's init. */
void osr__agent_spawn_close(void);

/** Put the dispositions of the real-time signals (34..64) back to the
 * default. Called once at start-up, before any thread: the child of a
 * spawn resets only signals 1..33 (the agent never handles the others). */
void osr__agent_spawn_init_signals(void);

/** Record what a child must undo before its exec: which of signals 1..33
 * the agent has not at SIG_DFL (a handler or SIG_IGN) and whether it runs
 * SCHED_BATCH. The child resets exactly those (26 system calls fewer per
 * spawn than resetting all: in gVisor each is a ptrace round trip).
 * Contract: call it after every change of a signal disposition or of the
 * scheduling policy that happens before a later spawn (main.c calls it
 * once its handlers and policy are set; the SIGCHLD watcher of the first
 * spawn is added by the spawner itself; the first spawn takes one if none
 * was taken). Sanitizer builds check the contract at every spawn and
 * abort on a disposition the snapshot misses. Loop thread, or start-up. */
void osr__agent_spawn_snapshot(void);

#endif
