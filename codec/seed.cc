#include "codec/seed.h"

#include <cmath>
#include <numbers>

namespace tqkv {

double SplitMixStream::NextGaussian() {
  double u1 = NextUniform();
  double u2 = NextUniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace tqkv
