// Until the gRPC client lands, no server subcommand exists.
#include "client/cli/service_commands.h"

namespace tqkv::cli {

int ServiceCommand(const std::string&, int, char**, std::ostream&, std::ostream&) { return -1; }

}  // namespace tqkv::cli
