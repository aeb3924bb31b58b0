// Minimal subcommand argument parsing for the tqkv CLI: `--name value` or
// `--name=value`, plus positional words.
#ifndef TQKV_CLIENT_CLI_ARGS_H_
#define TQKV_CLIENT_CLI_ARGS_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tqkv::cli {

class Args {
 public:
  // Parses argv[first..argc). INVALID_ARGUMENT for a flag outside `known`
  // (names without dashes) or a flag missing its value.
  static absl::StatusOr<Args> Parse(int argc, char** argv, int first,
                                    const std::set<std::string>& known);

  bool Has(const std::string& name) const { return flags_.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& fallback) const;
  // INVALID_ARGUMENT when present but not an integer / number.
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;
  // INVALID_ARGUMENT naming the flag when absent.
  absl::StatusOr<std::string> Require(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> flags_;
  std::vector<std::string> positional_;
};

}  // namespace tqkv::cli

#endif  // TQKV_CLIENT_CLI_ARGS_H_
