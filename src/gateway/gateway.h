/*
 * The OSR gateway process (`osr-gateway` and `osr serve`): configuration,
 * store, Redis, providers, crash recovery, the reaper and the HTTP API,
 * assembled and torn down in order (gateway.c).
 */
#ifndef OSR_GATEWAY_GATEWAY_H
#define OSR_GATEWAY_GATEWAY_H

#include <stdint.h>
#include <uv.h>
#include "osr/common.h"

/**
 * The control-plane process: load the configuration (gw.h osr_gw_config_load),
 * open the store, Redis and providers, recover interrupted creates, start
 * the reaper, serve the API until SIGTERM/SIGINT, drain, and return an exit
 * code (0 ok, 1 runtime failure, 2 usage error). argv excludes the program
 * or subcommand name; prog is used in messages ("osr serve", "osr-gateway").
 */
int osr_gateway_main(int argc, char **argv, const char *prog);

typedef struct osr_gw_config_s osr_gw_config_t;
typedef struct osr_keyring_s osr_keyring_t;
struct osr_gw_s; /* gateway/gw.h */

/**
 * (Additive.) Something the process runs next to the gateway on the same
 * loop: `osr serve` embeds the data plane this way (cli/cmd_serve.c), so the
 * gateway library never depends on the data-plane library.
 *
 * start is called once, on the loop thread, once the API listens (after its
 * "listening on" lines) and before "ready". It borrows the gateway's
 * configuration, keyring and agent secret (NULL when none) until stop's done
 * fired. It returns 0 or an error (logged by the hook); on error the gateway
 * stops with exit code 1.
 *
 * stop is called once if start succeeded, during the drain after the API
 * closed and before Redis and the store close; it calls done(arg) exactly
 * once, on the loop thread.
 */
typedef struct osr_gateway_embed_s {
  int (*start)(void *data, uv_loop_t *loop, const osr_gw_config_t *cfg, const osr_keyring_t *kr,
               const uint8_t *agent_secret);
  void (*stop)(void *data, uint64_t grace_ms, void (*done)(void *arg), void *arg);
  void *data;
  /** (Additive, may be NULL.) Called once right before start with the
   *  gateway itself, valid until stop's done fired: `osr serve` hands its
   *  data plane's activity reports to osr_gw_activity_report (activity.h). */
  void (*attach)(void *data, struct osr_gw_s *gw);
} osr_gateway_embed_t;

/** (Additive.) osr_gateway_main with an embedded component (may be NULL). */
int osr_gateway_main_embed(int argc, char **argv, const char *prog,
                           const osr_gateway_embed_t *embed);

#endif
