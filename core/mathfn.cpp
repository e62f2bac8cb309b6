#include "core/mathfn.h"

#include "core/mathfn_impl.h"

// One source for both executors: the definitions are in core/mathfn_impl.h.
namespace olmoref::det {

float expf(float x) { return impl::expf(x); }
float logf(float x) { return impl::logf(x); }
float sigmoidf(float x) { return impl::sigmoidf(x); }
float siluf(float x) { return impl::siluf(x); }
double exp(double x) { return impl::exp(x); }
double log(double x) { return impl::log(x); }
double sin(double x) { return impl::sin(x); }
double cos(double x) { return impl::cos(x); }
double pow(double base, double e) { return impl::pow(base, e); }

}  // namespace olmoref::det
