// tests/kernels/host_order.h — included by the kernels' host tests: OLMOREF_TEST_HOST_BLOCK_ORDER=forward|reverse|
// snapshot runs every HostBlock phase in that order (kernels/block.h, the race check); meson runs each test in all
// three, and every order must give ref/'s bits.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/block.h"

namespace olmoref::testing {

inline const bool host_order_set = [] {
  const char* v = std::getenv("OLMOREF_TEST_HOST_BLOCK_ORDER");
  if (!v || !*v) return false;
  const std::string order = v;
  if (order == "forward") kernels::host_block_order() = kernels::HostOrder::forward;
  else if (order == "reverse") kernels::host_block_order() = kernels::HostOrder::reverse;
  else if (order == "snapshot") kernels::host_block_order() = kernels::HostOrder::snapshot;
  else {
    std::fprintf(stderr, "OLMOREF_TEST_HOST_BLOCK_ORDER=%s: forward, reverse or snapshot\n", v);
    std::exit(2);
  }
  std::fprintf(stderr, "HostBlock phases in %s order (the race check)\n", v);
  return true;
}();

}  // namespace olmoref::testing
