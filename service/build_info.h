// What this binary is: the tqkv release and the git commit it was built
// from, exported as tqkv_build_info{version,commit,backend} 1.
#ifndef TQKV_SERVICE_BUILD_INFO_H_
#define TQKV_SERVICE_BUILD_INFO_H_

#include <string>

#include <prometheus/metric_family.h>

namespace tqkv::service {

// The release this source tree is.
inline constexpr char kTqkvVersion[] = "0.1.0";

struct BuildInfo {
  // Release, e.g. "0.1.0". Default: empty (exported as "unknown").
  std::string version;
  // Git commit the binary was built from. Default: empty (exported as
  // "unknown").
  std::string commit;
};

// kTqkvVersion, and the commit compiled into build_info.cc: a build sets it
// with --per_file_copt=service/build_info.cc@-DTQKV_COMMIT=<hex> (tools/serve.sh
// does); without it the commit is empty.
BuildInfo CurrentBuildInfo();

// The gauge family tqkv_build_info with one sample of value 1, labelled
// backend, commit and version (empty values read "unknown").
prometheus::MetricFamily BuildInfoFamily(const BuildInfo& build, const std::string& backend);

}  // namespace tqkv::service

#endif  // TQKV_SERVICE_BUILD_INFO_H_
