/*
 * Internal helpers of the local provider (adapters/local*.c). Not an API:
 * everything here is osr__local_* and used only by adapters/local.c and its
 * integration driver.
 */
#ifndef OSR_ADAPTERS_LOCAL_INT_H
#define OSR_ADAPTERS_LOCAL_INT_H

#include <stddef.h>
#include <stdint.h>

/**
 * Build the classic-BPF seccomp program the container class hands to
 * bubblewrap (`bwrap --seccomp FD`): a denylist of the kernel interfaces a
 * sandbox never needs and that carry most container-escape history
 * (keyring, ptrace, mount, module loading, bpf, perf, userfaultfd, new user
 * namespaces, setns, kexec, ...). Denied calls fail with EPERM (ENOSYS for
 * clone3 so libc falls back to clone, whose flags we can inspect); foreign
 * architectures and x32 are killed.
 *
 * Writes the `struct sock_filter` array into `out` (at most `cap` bytes)
 * and returns its size in bytes, or 0 if `cap` is too small. Pure: no I/O.
 */
size_t osr__local_seccomp_bpf(void *out, size_t cap);

#endif
