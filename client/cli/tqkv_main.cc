// tqkv: the command-line tool. `tqkv help` lists the subcommands.
#include <cstring>
#include <iostream>
#include <string>

#include "client/cli/codec_commands.h"
#include "client/cli/service_commands.h"
#include "client/cli/sharded_commands.h"

namespace {

void Help(std::ostream& out) {
  out << "tqkv — TurboQuant KV-cache store\n\n"
         "codec (no server needed):\n"
         "  codebook   --dim D --bits B        Lloyd-Max centroids and d*MSE\n"
         "  formats    --dim D                 row bytes and ratio of every format\n"
         "  calibrate  ...                     recipe metadata from captured K/V\n"
         "  verify     ...                     check recipe metadata against a model\n"
         "server (--server HOST:PORT, default localhost:50051):\n"
         "  status | stats | models | unregister | put | lookup | get | bench   (tqkv CMD --help)\n"
         "many servers (--servers HOST:PORT,... or --dns HOST:PORT; routed by chain):\n"
         "  status | stats | put | lookup | get           (tqkv CMD --servers ... --help)\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "help") || !std::strcmp(argv[1], "--help")) {
    Help(std::cout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "codebook") return tqkv::cli::CodebookCommand(argc, argv, std::cout, std::cerr);
  if (cmd == "formats") return tqkv::cli::FormatsCommand(argc, argv, std::cout, std::cerr);
  if (cmd == "calibrate") return tqkv::cli::CalibrateCommand(argc, argv, std::cout, std::cerr);
  if (cmd == "verify") return tqkv::cli::VerifyCommand(argc, argv, std::cout, std::cerr);
  int rc = tqkv::cli::WantsShardedClient(argc, argv, 2)
               ? tqkv::cli::ShardedCommand(cmd, argc, argv, std::cout, std::cerr)
               : tqkv::cli::ServiceCommand(cmd, argc, argv, std::cout, std::cerr);
  if (rc >= 0) return rc;
  std::cerr << "unknown command '" << cmd << "'\n";
  Help(std::cerr);
  return 2;
}
