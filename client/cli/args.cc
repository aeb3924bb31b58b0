#include "client/cli/args.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tqkv::cli {

absl::StatusOr<Args> Args::Parse(int argc, char** argv, int first,
                                 const std::set<std::string>& known) {
  Args a;
  for (int i = first; i < argc; ++i) {
    std::string w = argv[i];
    if (w.rfind("--", 0) != 0) {
      a.positional_.push_back(w);
      continue;
    }
    std::string name = w.substr(2), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (!known.count(name))
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    if (!has_value) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = argv[++i];
    }
    a.flags_[name] = value;
  }
  return a;
}

std::string Args::Get(const std::string& name, const std::string& fallback) const {
  auto it = flags_.find(name);
  return it == flags_.end() ? fallback : it->second;
}

absl::StatusOr<int64_t> Args::GetInt(const std::string& name, int64_t fallback) const {
  auto it = flags_.find(name);
  if (it == flags_.end()) return fallback;
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v))
    return absl::InvalidArgumentError(absl::StrCat("--", name, " must be an integer, got '", it->second, "'"));
  return v;
}

absl::StatusOr<double> Args::GetDouble(const std::string& name, double fallback) const {
  auto it = flags_.find(name);
  if (it == flags_.end()) return fallback;
  double v;
  if (!absl::SimpleAtod(it->second, &v))
    return absl::InvalidArgumentError(absl::StrCat("--", name, " must be a number, got '", it->second, "'"));
  return v;
}

absl::StatusOr<std::string> Args::Require(const std::string& name) const {
  auto it = flags_.find(name);
  if (it == flags_.end()) return absl::InvalidArgumentError(absl::StrCat("--", name, " is required"));
  return it->second;
}

}  // namespace tqkv::cli
