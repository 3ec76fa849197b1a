/*
 * The OSR gateway process: for now the HTTP front door with health and
 * version endpoints, on the shared network core. The control-plane API
 * (sandboxes, placement, bindings) is mounted here by the control-plane work.
 */
#ifndef OSR_GATEWAY_GATEWAY_H
#define OSR_GATEWAY_GATEWAY_H

#include <stdint.h>
#include "osr/common.h"

typedef struct osr_gateway_config_s {
  const char *listen[8];   /**< addresses (net/addr.h); default 127.0.0.1:8080 */
  size_t nlisten;
  const char *tls_cert;    /**< PEM; with tls_key enables HTTPS (h2 + http/1.1) */
  const char *tls_key;
  uint64_t drain_ms;       /**< graceful shutdown grace, default 10000 */
} osr_gateway_config_t;

/** Parse command-line flags (after the program/subcommand name). Returns 0,
 *  1 if --help was printed, or OSR_EINVAL with a message on stderr. */
int osr_gateway_parse_args(int argc, char **argv, osr_gateway_config_t *cfg, const char *prog);

/** Run the gateway until SIGTERM/SIGINT, then drain. Returns an exit code. */
int osr_gateway_run(const osr_gateway_config_t *cfg);

/**
 * The control-plane process (replaces the two functions above once the
 * control plane lands): load the configuration (gw.h osr_gw_config_load),
 * open the store, Redis and providers, recover interrupted creates, start
 * the reaper, serve the API until SIGTERM/SIGINT, drain, and return an exit
 * code (0 ok, 1 runtime failure, 2 usage error). argv excludes the program
 * or subcommand name; prog is used in messages ("osr serve", "osr-gateway").
 */
int osr_gateway_main(int argc, char **argv, const char *prog);

#endif
