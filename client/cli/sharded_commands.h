// `tqkv` server commands over many servers, through the sharded C++ client
// (client/cpp/sharded_client.h): given --servers HOST:PORT[=W],... or
// --dns HOST:PORT instead of --server.
//
//   status                        each shard's health; exit 1 unless all SERVE
//   stats  [--model_id ID]        blocks and bytes per shard
//   put    [model flags] --chains C --blocks N [--seed S] [--durable]
//                                 C synthetic chains of N dense blocks
//                                 (seeds S..S+C-1), each on its chain's shard
//   lookup [model flags] --chains C --blocks N [--seed S]
//                                 hits per shard; a down shard's chains miss
//   get    [model flags] --chains C --blocks N [--seed S] [--dense]
// Model flags as for one server (--model, --layers, --kv_heads, --q_heads,
// --head_dim, --block_size, --format); --token T, --timeout_ms MS.
// Returns the exit code (2, with a message, for any other command).
#ifndef TQKV_CLIENT_CLI_SHARDED_COMMANDS_H_
#define TQKV_CLIENT_CLI_SHARDED_COMMANDS_H_

#include <ostream>
#include <string>

namespace tqkv::cli {

// Whether argv[first..argc) selects the sharded client (--servers or --dns).
bool WantsShardedClient(int argc, char** argv, int first);

int ShardedCommand(const std::string& cmd, int argc, char** argv, std::ostream& out, std::ostream& err);

}  // namespace tqkv::cli

#endif  // TQKV_CLIENT_CLI_SHARDED_COMMANDS_H_
