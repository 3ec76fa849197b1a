/* See osr_llhttp_dispatch.h. api.c is compiled with llhttp__internal_execute
 * renamed to osr_llhttp_execute, so every llhttp_execute() comes here. */
#include <llhttp.h>

#include "osr_llhttp_dispatch.h"

int osr_llhttp_execute(llhttp__internal_t *s, const char *p, const char *endp);
int llhttp__internal_execute_sse42(llhttp__internal_t *s, const char *p, const char *endp);

static int have_sse42;
static int use_sse42;

__attribute__((constructor)) static void choose(void)
{
  __builtin_cpu_init();
  have_sse42 = __builtin_cpu_supports("sse4.2") != 0;
  use_sse42 = have_sse42;
}

int osr_llhttp_execute(llhttp__internal_t *s, const char *p, const char *endp)
{
  /* Both copies keep their state in the same llhttp_t fields, with the
   * same state numbers; the choice never changes while a message parses
   * (osr_llhttp_simd_select is for tests, between messages). */
  if (use_sse42)
    return llhttp__internal_execute_sse42(s, p, endp);
  return llhttp__internal_execute(s, p, endp);
}

int osr_llhttp_simd(void)
{
  return use_sse42;
}

int osr_llhttp_simd_select(int on)
{
  int prev = use_sse42;
  if (on && !have_sse42)
    return -1;
  use_sse42 = on != 0;
  return prev;
}
