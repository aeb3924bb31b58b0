// `tqkv` subcommands that need only the codec (no server):
//   codebook  --dim D --bits B      centroids, one per line, then d_mse=...
//   formats   --dim D               every format's K/V row bytes and ratio
//   calibrate --input F --recipe R --layers L --kv-heads H --dim D --out M
//                                   activation-energy metadata from a raw
//                                   fp32 capture [layers][2][tokens][H][D]
//   verify    --metadata M --format F --dim D --kv-heads H [--layers L]
//                                   checks recipe metadata against a model
#ifndef TQKV_CLIENT_CLI_CODEC_COMMANDS_H_
#define TQKV_CLIENT_CLI_CODEC_COMMANDS_H_

#include <ostream>

namespace tqkv::cli {

// Each returns the process exit code (0 ok, 1 failure, 2 usage error) and
// writes results to `out`, errors to `err`.
int CodebookCommand(int argc, char** argv, std::ostream& out, std::ostream& err);
int FormatsCommand(int argc, char** argv, std::ostream& out, std::ostream& err);
int CalibrateCommand(int argc, char** argv, std::ostream& out, std::ostream& err);
int VerifyCommand(int argc, char** argv, std::ostream& out, std::ostream& err);

}  // namespace tqkv::cli

#endif  // TQKV_CLIENT_CLI_CODEC_COMMANDS_H_
