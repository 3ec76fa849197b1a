/* osr-gateway: the OSR control plane process (gateway mode). */
#include "gateway/gateway.h"

int main(int argc, char **argv)
{
  return osr_gateway_main(argc - 1, argv + 1, "osr-gateway");
}
