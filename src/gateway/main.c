/* osr-gateway: the OSR control plane process. */
#include "gateway/gateway.h"

int main(int argc, char **argv)
{
  osr_gateway_config_t cfg;
  int rv = osr_gateway_parse_args(argc - 1, argv + 1, &cfg, "osr-gateway");
  if (rv != 0)
    return rv > 0 ? 0 : 2;
  return osr_gateway_run(&cfg);
}
