// `tqkv` subcommands that talk to a running server (status, stats, put,
// lookup, get, bench). Returns the exit code, or -1 when `cmd` is not one of
// them.
#ifndef TQKV_CLIENT_CLI_SERVICE_COMMANDS_H_
#define TQKV_CLIENT_CLI_SERVICE_COMMANDS_H_

#include <ostream>
#include <string>

namespace tqkv::cli {

int ServiceCommand(const std::string& cmd, int argc, char** argv, std::ostream& out,
                   std::ostream& err);

}  // namespace tqkv::cli

#endif  // TQKV_CLIENT_CLI_SERVICE_COMMANDS_H_
