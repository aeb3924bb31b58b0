#include "service/build_info.h"

namespace tqkv::service {
namespace {

#define TQKV_STRINGIFY_(x) #x
#define TQKV_STRINGIFY(x) TQKV_STRINGIFY_(x)

std::string OrUnknown(const std::string& s) { return s.empty() ? "unknown" : s; }

}  // namespace

BuildInfo CurrentBuildInfo() {
#ifdef TQKV_COMMIT
  return {kTqkvVersion, TQKV_STRINGIFY(TQKV_COMMIT)};
#else
  return {kTqkvVersion, ""};
#endif
}

prometheus::MetricFamily BuildInfoFamily(const BuildInfo& build, const std::string& backend) {
  prometheus::MetricFamily f;
  f.name = "tqkv_build_info";
  f.help = "The tqkv release, git commit and compute backend of this process (value 1).";
  f.type = prometheus::MetricType::Gauge;
  prometheus::ClientMetric m;
  m.label = {{"backend", OrUnknown(backend)},
             {"commit", OrUnknown(build.commit)},
             {"version", OrUnknown(build.version)}};
  m.gauge.value = 1;
  f.metric.push_back(std::move(m));
  return f;
}

}  // namespace tqkv::service
