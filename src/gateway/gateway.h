/*
 * The OSR gateway process (`osr-gateway` and `osr serve`): configuration,
 * store, Redis, providers, crash recovery, the reaper and the HTTP API,
 * assembled and torn down in order (gateway.c).
 */
#ifndef OSR_GATEWAY_GATEWAY_H
#define OSR_GATEWAY_GATEWAY_H

#include <stdint.h>
#include "osr/common.h"

/**
 * The control-plane process: load the configuration (gw.h osr_gw_config_load),
 * open the store, Redis and providers, recover interrupted creates, start
 * the reaper, serve the API until SIGTERM/SIGINT, drain, and return an exit
 * code (0 ok, 1 runtime failure, 2 usage error). argv excludes the program
 * or subcommand name; prog is used in messages ("osr serve", "osr-gateway").
 */
int osr_gateway_main(int argc, char **argv, const char *prog);

#endif
