/*
 * The container class's seccomp filter, hand-written in classic BPF so the
 * gateway needs no libseccomp. bubblewrap loads it (after setting
 * no_new_privs) from the fd given with --seccomp; the kernel then applies it
 * to every process in the sandbox, inherited across fork and exec.
 *
 * It is a denylist, not an allowlist: the sandbox runs arbitrary user
 * programs (compilers, interpreters, package managers) whose syscall needs
 * are open-ended, so we remove only what no ordinary program needs and what
 * has a record of kernel escapes. The namespaces, dropped capabilities and
 * cgroups do the rest.
 */
#include "adapters/local_int.h"

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stddef.h>
#include <string.h>
#include <sys/syscall.h>

#include "osr/common.h"

#ifndef SECCOMP_RET_KILL_PROCESS
#define SECCOMP_RET_KILL_PROCESS 0x80000000U
#endif

/* Denied outright with EPERM. */
static const int denied[] = {
  SYS_keyctl, SYS_add_key, SYS_request_key,       /* kernel keyring (not namespaced) */
  SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev,
  SYS_mount, SYS_umount2, SYS_pivot_root, SYS_chroot,
  SYS_kexec_load, SYS_kexec_file_load, SYS_reboot,
  SYS_init_module, SYS_finit_module, SYS_delete_module,
  SYS_bpf, SYS_perf_event_open, SYS_userfaultfd,
  SYS_setns, SYS_unshare,                          /* no new namespaces from inside */
  SYS_acct, SYS_swapon, SYS_swapoff, SYS_syslog, SYS_quotactl,
  SYS_open_by_handle_at, SYS_name_to_handle_at,   /* the "shocker" escape */
  SYS_lookup_dcookie, SYS_iopl, SYS_ioperm,
  SYS_settimeofday, SYS_clock_settime, SYS_clock_adjtime, SYS_adjtimex,
  SYS_vhangup, SYS_nfsservctl,
#ifdef SYS_fsopen
  SYS_fsopen, SYS_fsconfig, SYS_fsmount, SYS_move_mount, SYS_open_tree, SYS_fspick,
#endif
#ifdef SYS_mount_setattr
  SYS_mount_setattr,
#endif
};

#define STMT(code, k) ((struct sock_filter)BPF_STMT((code), (k)))
#define JUMP(code, k, jt, jf) ((struct sock_filter)BPF_JUMP((code), (k), (jt), (jf)))

size_t osr__local_seccomp_bpf(void *out, size_t cap)
{
  struct sock_filter f[128];
  size_t n = 0;
  const unsigned ndeny = (unsigned)OSR_ARRAY_SIZE(denied);

  /* Only x86-64 syscalls are allowed in: a 32-bit or x32 entry point would
   * bypass every number below. */
  f[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
  f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
  f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
  f[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
  f[n++] = JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 1); /* x32 ABI */
  f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);

  /* Each denied number jumps to the shared EPERM return after the list:
   * from list entry i, (ndeny - 1 - i) more list entries and the six
   * instructions of the clone3/clone block below lie before it. */
  for (unsigned i = 0; i < ndeny; i++) {
    unsigned to_eperm = (ndeny - 1 - i) + 6;
    f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)denied[i], (unsigned char)to_eperm, 0);
  }
  /* clone3 takes its flags in memory BPF cannot read: answer ENOSYS, and
   * glibc falls back to clone(), whose flags register we can check. */
  f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1);
  f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA));
  /* clone with any CLONE_NEW* flag: no nested namespaces (a user namespace
   * would hand the sandbox a fresh set of capabilities to attack with). */
  f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 2);
  f[n++] = STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]));
  f[n++] = JUMP(BPF_JMP | BPF_JSET | BPF_K,
                CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUTS |
                  CLONE_NEWIPC | CLONE_NEWCGROUP,
                1, 0);
  f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  /* The EPERM target of the list and of the clone-flags match; keep it the
   * instruction right after the ALLOW above (see to_eperm). */
  f[n++] = STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA));

  if (n * sizeof(f[0]) > cap)
    return 0;
  memcpy(out, f, n * sizeof(f[0]));
  return n * sizeof(f[0]);
}
