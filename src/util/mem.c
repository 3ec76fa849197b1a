/*
 * The allocator hooks. The default is libc; tests swap in a counting or
 * failing allocator with osr_mem_set().
 */
#include "util/mem.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

/* osr_iovec_t must be usable wherever uv_buf_t or struct iovec is. */
_Static_assert(sizeof(osr_iovec_t) == sizeof(uv_buf_t), "osr_iovec_t/uv_buf_t size");
_Static_assert(offsetof(osr_iovec_t, base) == offsetof(uv_buf_t, base), "iov base");
_Static_assert(offsetof(osr_iovec_t, len) == offsetof(uv_buf_t, len), "iov len");
_Static_assert(sizeof(osr_iovec_t) == sizeof(struct iovec), "osr_iovec_t/iovec size");

static void *libc_malloc(size_t size, void *ud)
{
  (void)ud;
  return malloc(size);
}

static void *libc_realloc(void *ptr, size_t size, void *ud)
{
  (void)ud;
  return realloc(ptr, size);
}

static void libc_free(void *ptr, void *ud)
{
  (void)ud;
  free(ptr);
}

static osr_mem_t mem = {libc_malloc, libc_realloc, libc_free, NULL};
static unsigned long fail_after;

void osr_mem_set(const osr_mem_t *m)
{
  if (m == NULL) {
    mem.malloc_fn = libc_malloc;
    mem.realloc_fn = libc_realloc;
    mem.free_fn = libc_free;
    mem.ud = NULL;
    return;
  }
  mem = *m;
}

const osr_mem_t *osr_mem_get(void)
{
  return &mem;
}

void osr_mem_fail_after(unsigned long n)
{
  fail_after = n;
}

static int should_fail(void)
{
  if (fail_after == 0)
    return 0;
  if (--fail_after == 0)
    return 1;
  return 0;
}

static void oom(size_t size)
{
  fprintf(stderr, "osr: out of memory allocating %zu bytes\n", size);
  abort();
}

void *osr_xmalloc(size_t size)
{
  void *p = mem.malloc_fn(size ? size : 1, mem.ud);
  if (p == NULL)
    oom(size);
  return p;
}

void *osr_xcalloc(size_t n, size_t size)
{
  if (size != 0 && n > SIZE_MAX / size)
    oom(SIZE_MAX);
  void *p = osr_xmalloc(n * size);
  memset(p, 0, n * size);
  return p;
}

void *osr_xrealloc(void *ptr, size_t size)
{
  void *p = mem.realloc_fn(ptr, size ? size : 1, mem.ud);
  if (p == NULL)
    oom(size);
  return p;
}

char *osr_xstrndup(const char *s, size_t n)
{
  char *p = osr_xmalloc(n + 1);
  memcpy(p, s, n);
  p[n] = '\0';
  return p;
}

char *osr_xstrdup(const char *s)
{
  return osr_xstrndup(s, strlen(s));
}

void *osr_try_malloc(size_t size)
{
  if (should_fail())
    return NULL;
  return mem.malloc_fn(size ? size : 1, mem.ud);
}

void *osr_try_realloc(void *ptr, size_t size)
{
  if (should_fail())
    return NULL;
  return mem.realloc_fn(ptr, size ? size : 1, mem.ud);
}

void osr_free(void *ptr)
{
  if (ptr != NULL)
    mem.free_fn(ptr, mem.ud);
}

/* libuv and jansson want plain malloc-style functions. */
static void *dep_malloc(size_t size)
{
  return mem.malloc_fn(size ? size : 1, mem.ud);
}

static void *dep_realloc(void *ptr, size_t size)
{
  return mem.realloc_fn(ptr, size, mem.ud);
}

static void *dep_calloc(size_t n, size_t size)
{
  if (size != 0 && n > SIZE_MAX / size)
    return NULL;
  void *p = dep_malloc(n * size);
  if (p != NULL)
    memset(p, 0, n * size);
  return p;
}

static void dep_free(void *ptr)
{
  if (ptr != NULL)
    mem.free_fn(ptr, mem.ud);
}

int osr_mem_install_deps(void)
{
  json_set_alloc_funcs(dep_malloc, dep_free);
  if (uv_replace_allocator(dep_malloc, dep_realloc, dep_calloc, dep_free) != 0)
    return OSR_EBUSY;
  return 0;
}

void osr_json_free(void *ptr)
{
  json_free_t free_fn = NULL;
  json_get_alloc_funcs(NULL, &free_fn);
  if (ptr != NULL && free_fn != NULL)
    free_fn(ptr);
}

const char *osr_strerror(int err)
{
  switch (err) {
  case 0:
    return "success";
  case OSR_ETLS:
    return "TLS failure";
  case OSR_ECERT:
    return "certificate verification failed";
  case OSR_EHTTP:
    return "malformed HTTP message";
  case OSR_ETOOLARGE:
    return "size limit exceeded";
  case OSR_EWS:
    return "WebSocket protocol error";
  case OSR_EH2:
    return "HTTP/2 protocol error";
  case OSR_ECLOSED:
    return "closed";
  case OSR_EDNS:
    return "name resolution failed";
  case OSR_ESHUTDOWN:
    return "shutting down";
  case -30010:
    return "store unavailable";
  case -30011:
    return "conflict";
  case -30012:
    return "not found";
  default:
    /* libuv allocates (and leaks) a string for codes it does not know, so
     * only hand it errno-range codes. Provider codes (-31xxx) are named by
     * osr_provider_err_name(). */
    if (err <= -30000)
      return err <= -31000 && err > -32000 ? "provider error" : "OSR error";
    return uv_strerror(err);
  }
}
