/*
 * Prometheus text format helpers (see prom.h).
 */
#include "util/prom.h"

int osr_prom_family(osr_buf_t *out, int rv, const char *name, const char *type, const char *help)
{
  if (rv != 0)
    return rv;
  return osr_buf_appendf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

int osr_prom_u64(osr_buf_t *out, int rv, const char *name, uint64_t v)
{
  if (rv != 0)
    return rv;
  return osr_buf_appendf(out, "%s %llu\n", name, (unsigned long long)v);
}

int osr_prom_single(osr_buf_t *out, int rv, const char *name, const char *type, const char *help,
                    uint64_t v)
{
  return osr_prom_u64(out, osr_prom_family(out, rv, name, type, help), name, v);
}

int osr_prom_label(osr_buf_t *out, int rv, const char *v)
{
  /* Runs of plain bytes go out in one append; only the three escapes of
   * format 0.0.4 are rewritten. */
  const char *run = v;
  for (const char *p = v; rv == 0; p++) {
    if (*p != '\0' && *p != '\\' && *p != '"' && *p != '\n')
      continue;
    if (p > run)
      rv = osr_buf_append(out, run, (size_t)(p - run));
    if (*p == '\0' || rv != 0)
      break;
    rv = osr_buf_append(out, *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : "\\n", 2);
    run = p + 1;
  }
  return rv;
}
