/*
 * The provider adapter interface: what a sandbox provider (local, Kubernetes,
 * E2B, Modal, Vercel, Daytona, sim) implements so the gateway can place,
 * create, find and destroy sandboxes on it. One adapter = one file under
 * adapters/ plus its contract test (docs/adapters.md).
 *
 * Threading: every function and callback runs on the gateway's loop thread.
 * Adapters do network I/O with the OSR network core (net/http.h client) or
 * libuv; anything blocking goes to the thread pool (uv_queue_work).
 *
 * Callback contract (STYLE 7): an operation that returns 0 calls its callback
 * exactly once, later (never from inside the call); one that returns an error
 * never calls it.
 *
 * Labels: every resource an adapter creates carries OSR's sandbox id as a
 * label/tag/metadata entry (OSR_LABEL_SANDBOX_ID), so that after a crash the
 * gateway can ask the provider which resources are OSR's (list) and adopt or
 * destroy them. An adapter whose provider cannot label must say so in
 * osr_provider_info_t.flags (OSR_PROVIDER_F_NO_LABELS) and keep its own
 * durable record.
 */
#ifndef OSR_ADAPTER_H
#define OSR_ADAPTER_H

#include <jansson.h>
#include <stdint.h>
#include <uv.h>

#include "osr/common.h"

#define OSR_ADAPTER_VERSION 1
#define OSR_LABEL_SANDBOX_ID "osr.dev/sandbox-id"
#define OSR_LABEL_TENANT "osr.dev/tenant"

/** Isolation classes, ordered: a request's floor is met by any class >= it. */
typedef enum osr_isolation_e {
  OSR_ISO_NONE = 0,
  OSR_ISO_CONTAINER = 1,   /**< namespaces + seccomp (runc, crun, bubblewrap) */
  OSR_ISO_GVISOR = 2,      /**< user-space kernel (runsc) */
  OSR_ISO_FIRECRACKER = 3, /**< microVM (Firecracker, Kata, cloud VMs) */
} osr_isolation_t;

/** "container" | "gvisor" | "firecracker" <-> enum. Unknown → OSR_ISO_NONE / NULL. */
OSR_API osr_isolation_t osr_isolation_parse(const char *s);
OSR_API const char *osr_isolation_name(osr_isolation_t iso);

#define OSR_MAX_PORTS 32
#define OSR_NAME_MAX 64

/** What a create request asks for (and, in a binding, what was granted). */
typedef struct osr_capabilities_s {
  uint32_t gpu_count;
  char gpu_type[OSR_NAME_MAX]; /**< "" = any type */
  int snapshot;                /**< needs filesystem snapshot/restore */
  uint16_t ports[OSR_MAX_PORTS];
  size_t nports;
  uint32_t min_memory_mib;     /**< 0 = provider default */
  uint32_t vcpus;              /**< 0 = provider default */
  char region[OSR_NAME_MAX];   /**< "" = any */
  osr_isolation_t isolation;   /**< floor */
} osr_capabilities_t;

/** A provider's capability manifest and price table. Filled by describe();
 *  must be honest: placement trusts it, and never hands out a sandbox that
 *  lacks what was asked. */
typedef struct osr_provider_info_s {
  unsigned isolation_mask;     /**< bit (1 << osr_isolation_t) per class offered */
  uint32_t gpu_max;            /**< 0 = no GPUs */
  const char *gpu_types[8];    /**< NULL-terminated; static or owned by the adapter */
  double gpu_price_per_s[8];   /**< USD per GPU-second, same order */
  int snapshot;
  int pause;
  uint32_t max_ports;
  uint32_t max_memory_mib;
  uint32_t max_vcpus;
  uint32_t default_memory_mib;
  uint32_t default_vcpus;
  const char *regions[16];     /**< NULL-terminated; empty = region-less (local) */
  double price_vcpu_per_s;     /**< USD */
  double price_gib_per_s;      /**< USD per GiB of memory */
  double price_per_create;     /**< USD, e.g. Vercel's per-creation fee */
  double expected_create_ms;   /**< prior for the latency estimate */
  unsigned flags;
} osr_provider_info_t;

#define OSR_PROVIDER_F_NO_LABELS (1u << 0)

/** States of a provider resource as the provider reports it. */
typedef enum osr_resource_state_e {
  OSR_RES_UNKNOWN = 0,
  OSR_RES_STARTING = 1,
  OSR_RES_RUNNING = 2,
  OSR_RES_PAUSED = 3,
  OSR_RES_STOPPED = 4, /**< exists but is not running (failed, exited) */
  OSR_RES_GONE = 5,
} osr_resource_state_t;

/** What a provider reports about one of its resources. */
typedef struct osr_resource_s {
  char provider_id[128];       /**< the provider's own id */
  char sandbox_id[OSR_NAME_MAX]; /**< our label; "" if missing */
  char region[OSR_NAME_MAX];
  osr_isolation_t isolation;
  /** How the data plane reaches the agent (envd contract) in the sandbox:
   *  "unix:/path", "http://host:port", "https://host". */
  char agent_endpoint[1024]; /**< may end in a sealed upstream credential (token.h) */
  osr_resource_state_t state;
  osr_capabilities_t granted;  /**< what the sandbox really has */
} osr_resource_t;

/** Everything a provider needs to create one sandbox. Strings are borrowed
 *  for the duration of the create() call; copy what you keep. */
typedef struct osr_sandbox_spec_s {
  const char *sandbox_id;      /**< OSR's id: label the resource with it */
  const char *tenant;
  const char *template_id;
  osr_capabilities_t caps;     /**< requested; placement checked the manifest */
  osr_isolation_t isolation;   /**< the class placement chose (>= caps.isolation) */
  const char *region;          /**< the region placement chose, or "" */
  uint32_t timeout_s;          /**< absolute TTL; providers that enforce TTLs get it too */
  const json_t *env;           /**< object of string values; may be NULL */
  const json_t *metadata;      /**< object of string values; may be NULL */
  const char *agent_token;     /**< the token the agent must check; may be NULL */
} osr_sandbox_spec_t;

/* Provider error classes: create failures with these codes are retried on the
 * next candidate (retryable) or not. Adapters map their vendor's answers onto
 * them (HTTP 429 → RATE_LIMITED, 401/403 → AUTH, 400/422 → INVALID, 5xx and
 * connection failures → UNAVAILABLE, quota/capacity → CAPACITY). */
#define OSR_PERR_CAPACITY (-31001)     /**< retryable: no room */
#define OSR_PERR_RATE_LIMITED (-31002) /**< retryable */
#define OSR_PERR_TIMEOUT (-31003)      /**< retryable: no answer in time */
#define OSR_PERR_UNAVAILABLE (-31004)  /**< retryable: provider down / 5xx */
#define OSR_PERR_BOOT_FAILED (-31005)  /**< retryable: accepted, then never became ready */
#define OSR_PERR_AUTH (-31006)         /**< not retryable: credentials rejected */
#define OSR_PERR_INVALID (-31007)      /**< not retryable: the request is wrong */
#define OSR_PERR_NOT_FOUND (-31008)    /**< get/destroy: no such resource */
#define OSR_PERR_UNSUPPORTED (-31009)  /**< the adapter lacks this operation */

/** 1 if create should be retried on another provider after `err`. */
OSR_API int osr_provider_err_retryable(int err);
/** Stable machine name of a provider error ("capacity", "rate_limited", ...). */
OSR_API const char *osr_provider_err_name(int err);

typedef struct osr_provider_s osr_provider_t;

typedef void (*osr_provider_create_cb)(osr_provider_t *p, int status, const osr_resource_t *res,
                                       void *data);
typedef void (*osr_provider_done_cb)(osr_provider_t *p, int status, void *data);
typedef void (*osr_provider_get_cb)(osr_provider_t *p, int status, const osr_resource_t *res,
                                    void *data);
/** `res` is an array of `n` resources carrying OSR's label; valid during the call. */
typedef void (*osr_provider_list_cb)(osr_provider_t *p, int status, const osr_resource_t *res,
                                     size_t n, void *data);

/** One page of list_page(): `n` resources carrying OSR's label, and `next`,
 *  the cursor of the following page (NULL on the last page); both valid
 *  during the call. */
typedef void (*osr_provider_list_page_cb)(osr_provider_t *p, int status, const osr_resource_t *res,
                                          size_t n, const char *next, void *data);

/** Snapshot result: `snapshot` names the snapshot (for the local provider,
 *  the path of the tar file written); valid during the call. */
typedef void (*osr_provider_snapshot_cb)(osr_provider_t *p, int status, const char *snapshot,
                                         void *data);

/** The operations table an adapter exports (one static const per adapter). */
typedef struct osr_adapter_s {
  uint32_t version;            /**< OSR_ADAPTER_VERSION */
  const char *type;            /**< "sim", "local", "kubernetes", "e2b", ... */
  /** Validate `config` (the provider's YAML section as JSON) and set p->impl.
   *  No I/O. On error write a human reason into err and return OSR_EINVAL. */
  int (*init)(osr_provider_t *p, const json_t *config, char *err, size_t errlen);
  /** Fill the manifest (called after init; may be called again). */
  void (*describe)(osr_provider_t *p, osr_provider_info_t *info);
  /** Create and wait until the sandbox is ready (the agent answers), or fail
   *  with an OSR_PERR_* code. Boot failures after the provider accepted are
   *  OSR_PERR_BOOT_FAILED, and the adapter destroys what it created. */
  int (*create)(osr_provider_t *p, const osr_sandbox_spec_t *spec, osr_provider_create_cb cb,
                void *data);
  /** Destroy; OSR_PERR_NOT_FOUND counts as done for the caller. */
  int (*destroy)(osr_provider_t *p, const char *provider_id, osr_provider_done_cb cb, void *data);
  int (*get)(osr_provider_t *p, const char *provider_id, osr_provider_get_cb cb, void *data);
  /** Every resource that carries OSR's label. */
  int (*list)(osr_provider_t *p, osr_provider_list_cb cb, void *data);
  /** Optional (NULL if unsupported). */
  int (*pause)(osr_provider_t *p, const char *provider_id, osr_provider_done_cb cb, void *data);
  int (*resume)(osr_provider_t *p, const char *provider_id, osr_provider_create_cb cb, void *data);
  /** Stop accepting work, cancel in-flight requests (their callbacks fire
   *  with OSR_ECANCELED), free p->impl, then call cb. */
  void (*close)(osr_provider_t *p, void (*cb)(osr_provider_t *p));
  /** Optional (NULL if unsupported; added after version 1 without a bump:
   *  tables that do not set them get NULL). Filesystem snapshot of a
   *  running sandbox's writable layer into `snapshot` (provider-specific
   *  name; the local provider takes an absolute path for a tar file). The
   *  sandbox keeps running. */
  int (*snapshot)(osr_provider_t *p, const char *provider_id, const char *snapshot,
                  osr_provider_snapshot_cb cb, void *data);
  /** Optional: create a new sandbox from `spec` whose writable layer starts
   *  as `snapshot` (from snapshot()); otherwise exactly like create(). */
  int (*restore)(osr_provider_t *p, const osr_sandbox_spec_t *spec, const char *snapshot,
                 osr_provider_create_cb cb, void *data);
  /** Optional (added without a version bump, NULL = not asked): can this
   *  adapter run real sandboxes here with its default configuration?
   *  Returns 1, or 0 with a human reason in `why` (what is missing). It may
   *  start a runtime once to find out, and BLOCKS while doing so (bounded,
   *  seconds at most): only configuration loading calls it, before any loop
   *  runs, to pick the embedded default provider (docs/configuration.md). */
  int (*available)(char *why, size_t whylen);
  /** Optional (added without a version bump, NULL = not needed): complete a
   *  resource that list() found, before crash recovery adopts it. Some
   *  providers hand out what the data plane needs to reach a sandbox only per
   *  sandbox, and it must be sealed under the sandbox's agent token, which
   *  only create's spec carries (e2b: the envdAccessToken is only in
   *  GET /sandboxes/{id}, so its list() and get() report no endpoint). The
   *  gateway passes OSR's sandbox id (the resource's label) and its agent
   *  token; cb gets the resource with a usable agent_endpoint, or
   *  OSR_PERR_NOT_FOUND if it is gone or no longer carries that label. */
  int (*adopt)(osr_provider_t *p, const char *provider_id, const char *sandbox_id,
               const char *agent_token, osr_provider_get_cb cb, void *data);
  /** Optional (added without a version bump, NULL = only list()): list()
   *  one page at a time, so that a caller walking many thousands of
   *  resources never holds the loop thread for the whole list (the reaper
   *  uses it when present). `cursor` is NULL for the first page, then the
   *  `next` of the page before (an opaque string of at most 511 bytes);
   *  `limit` (>= 1) bounds the resources of one page, which may hold fewer
   *  (even none) without being the last. Every resource that exists from the
   *  first page's call to the last page's answer is in exactly one page;
   *  one created or destroyed meanwhile may be in none. */
  int (*list_page)(osr_provider_t *p, const char *cursor, size_t limit,
                   osr_provider_list_page_cb cb, void *data);
} osr_adapter_t;

/** A configured provider instance (one adapter may back several). Owned by
 *  the gateway's provider registry. */
struct osr_provider_s {
  const osr_adapter_t *adapter;
  char name[OSR_NAME_MAX];     /**< configured name, e.g. "local", "e2b-eu" */
  uv_loop_t *loop;
  void *impl;                  /**< the adapter's state */
  osr_provider_info_t info;    /**< from describe(), possibly with price overrides */
};

/** The built-in adapter for `type` ("sim", later "local", "kubernetes", ...),
 *  or NULL if none is compiled in. The table lives in adapters/registry.c:
 *  adding a provider is one line there plus its file. */
OSR_API const osr_adapter_t *osr_adapter_find(const char *type);

/** Fill `names` with up to `max` built-in adapter type names (static
 *  strings, table order) and return how many exist in total (which may be
 *  more than `max`). */
OSR_API size_t osr_adapter_types(const char **names, size_t max);

#endif
