/*
 * The table of built-in adapters, and the small shared helpers every adapter
 * and the gateway use (isolation names, provider error classes).
 *
 * Adding a provider: write adapters/<name>.c exporting one
 * `const osr_adapter_t osr_adapter_<name>`, add it to osr_adapter_src in
 * adapters/meson.build, add one line to `table` below, and give it a contract
 * test (docs/adapters.md).
 */
#include <string.h>

#include "osr/adapter.h"

extern const osr_adapter_t osr_adapter_sim;
extern const osr_adapter_t osr_adapter_local;
extern const osr_adapter_t osr_adapter_e2b;

static const osr_adapter_t *const table[] = {
  &osr_adapter_sim,
  &osr_adapter_local,
  &osr_adapter_e2b,
};

const osr_adapter_t *osr_adapter_find(const char *type)
{
  if (type == NULL)
    return NULL;
  for (size_t i = 0; i < OSR_ARRAY_SIZE(table); i++)
    if (strcmp(table[i]->type, type) == 0)
      return table[i];
  return NULL;
}

size_t osr_adapter_types(const char **names, size_t max)
{
  for (size_t i = 0; i < OSR_ARRAY_SIZE(table) && i < max; i++)
    names[i] = table[i]->type;
  return OSR_ARRAY_SIZE(table);
}

osr_isolation_t osr_isolation_parse(const char *s)
{
  if (s == NULL)
    return OSR_ISO_NONE;
  if (strcmp(s, "container") == 0)
    return OSR_ISO_CONTAINER;
  if (strcmp(s, "gvisor") == 0)
    return OSR_ISO_GVISOR;
  if (strcmp(s, "firecracker") == 0)
    return OSR_ISO_FIRECRACKER;
  return OSR_ISO_NONE;
}

const char *osr_isolation_name(osr_isolation_t iso)
{
  switch (iso) {
  case OSR_ISO_CONTAINER:
    return "container";
  case OSR_ISO_GVISOR:
    return "gvisor";
  case OSR_ISO_FIRECRACKER:
    return "firecracker";
  case OSR_ISO_NONE:
    break;
  }
  return NULL;
}

int osr_provider_err_retryable(int err)
{
  /* Retry elsewhere when this provider could not serve now (no room, too
   * many requests, slow, down, or a sandbox that never booted); never when
   * the request itself or our credentials are wrong: another provider would
   * only fail the same way, or worse, the mistake would be hidden. */
  switch (err) {
  case OSR_PERR_CAPACITY:
  case OSR_PERR_RATE_LIMITED:
  case OSR_PERR_TIMEOUT:
  case OSR_PERR_UNAVAILABLE:
  case OSR_PERR_BOOT_FAILED:
    return 1;
  default:
    return 0;
  }
}

const char *osr_provider_err_name(int err)
{
  switch (err) {
  case 0:
    return "ok";
  case OSR_PERR_CAPACITY:
    return "capacity";
  case OSR_PERR_RATE_LIMITED:
    return "rate_limited";
  case OSR_PERR_TIMEOUT:
    return "timeout";
  case OSR_PERR_UNAVAILABLE:
    return "unavailable";
  case OSR_PERR_BOOT_FAILED:
    return "boot_failed";
  case OSR_PERR_AUTH:
    return "auth";
  case OSR_PERR_INVALID:
    return "invalid";
  case OSR_PERR_NOT_FOUND:
    return "not_found";
  case OSR_PERR_UNSUPPORTED:
    return "unsupported";
  case OSR_ECANCELED:
    return "cancelled";
  default:
    return "internal";
  }
}
