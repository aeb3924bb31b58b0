#include "client/cli/codec_commands.h"

#include <cstdio>
#include <fstream>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/cli/args.h"
#include "codec/calibration.h"
#include "codec/codebook.h"
#include "codec/format.h"
#include "codec/metadata.h"
#include "codec/model_codec.h"

namespace tqkv::cli {
namespace {

int Usage(std::ostream& err, const absl::Status& s, const char* usage) {
  err << "error: " << s.message() << "\nusage: " << usage << "\n";
  return 2;
}

}  // namespace

int CodebookCommand(int argc, char** argv, std::ostream& out, std::ostream& err) {
  const char* usage = "tqkv codebook --dim D --bits B";
  auto args = Args::Parse(argc, argv, 2, {"dim", "bits"});
  if (!args.ok()) return Usage(err, args.status(), usage);
  auto dim = args->GetInt("dim", 128);
  auto bits = args->GetInt("bits", 4);
  if (!dim.ok()) return Usage(err, dim.status(), usage);
  if (!bits.ok()) return Usage(err, bits.status(), usage);
  auto cb = GetCodebook(static_cast<int>(*dim), static_cast<int>(*bits));
  if (!cb.ok()) return Usage(err, cb.status(), usage);
  for (double c : (*cb)->centroids) out << absl::StrFormat("%.15g\n", c);
  out << absl::StrFormat("d_mse=%.12g\n", (*cb)->d_mse());
  return 0;
}

int FormatsCommand(int argc, char** argv, std::ostream& out, std::ostream& err) {
  const char* usage = "tqkv formats --dim D";
  auto args = Args::Parse(argc, argv, 2, {"dim"});
  if (!args.ok()) return Usage(err, args.status(), usage);
  auto dim = args->GetInt("dim", 128);
  if (!dim.ok()) return Usage(err, dim.status(), usage);
  const int d = static_cast<int>(*dim);
  out << absl::StrFormat("%-20s %8s %8s %10s %s\n", "format", "k_bytes", "v_bytes", "vs_fp16", "notes");
  for (const std::string& name : AllFormatNames()) {
    Format f = *ParseFormat(name);
    auto k = MakeRowLayout(f.k, d), v = MakeRowLayout(f.v, d);
    if (!k.ok() || !v.ok()) {
      out << absl::StrFormat("%-20s %8s %8s %10s %s\n", name, "-", "-", "-",
                             std::string((k.ok() ? v : k).status().message()));
      continue;
    }
    double ratio = 4.0 * d / double(k->row_bytes + v->row_bytes);
    out << absl::StrFormat("%-20s %8d %8d %9.2fx %s\n", name, k->row_bytes, v->row_bytes, ratio,
                           f.needs_metadata() ? "needs metadata" : "");
  }
  return 0;
}

int CalibrateCommand(int argc, char** argv, std::ostream& out, std::ostream& err) {
  const char* usage =
      "tqkv calibrate --input capture.f32 --recipe turboquant35 --layers L --kv-heads H --dim D "
      "--out metadata.json [--model-name NAME]\n"
      "  capture.f32: raw little-endian fp32 [layers][2 (K,V)][tokens][H][D] of CACHED "
      "(post-RoPE) K/V";
  auto args = Args::Parse(argc, argv, 2,
                          {"input", "recipe", "layers", "kv-heads", "dim", "out", "model-name"});
  if (!args.ok()) return Usage(err, args.status(), usage);
  auto input = args->Require("input");
  auto recipe = args->Require("recipe");
  auto path = args->Require("out");
  auto layers = args->GetInt("layers", 0), heads = args->GetInt("kv-heads", 0),
       dim = args->GetInt("dim", 0);
  for (const absl::Status& s : {input.status(), recipe.status(), path.status(), layers.status(),
                                heads.status(), dim.status()})
    if (!s.ok()) return Usage(err, s, usage);
  if (*layers <= 0 || *heads <= 0 || *dim <= 0)
    return Usage(err, absl::InvalidArgumentError("--layers, --kv-heads and --dim must be > 0"), usage);
  std::ifstream in(*input, std::ios::binary | std::ios::ate);
  if (!in) {
    err << "error: cannot open " << *input << "\n";
    return 1;
  }
  const int64_t bytes = in.tellg();
  const int64_t per_token = *heads * *dim * 4;
  const int64_t per_layer_component_divisor = 2 * *layers * per_token;
  if (bytes % per_layer_component_divisor != 0) {
    err << "error: " << *input << " has " << bytes << " bytes, not a multiple of layers*2*H*D*4 = "
        << per_layer_component_divisor << "\n";
    return 1;
  }
  const int64_t tokens = bytes / per_layer_component_divisor;
  in.seekg(0);
  ActivationEnergyAccumulator acc(static_cast<int>(*layers), static_cast<int>(*heads),
                                  static_cast<int>(*dim));
  std::vector<float> buf(static_cast<size_t>(tokens) * *heads * *dim);
  for (int l = 0; l < *layers; ++l) {
    for (Component c : {Component::kKey, Component::kValue}) {
      in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size() * 4));
      absl::Status s = acc.Observe(l, c, buf.data(), tokens);
      if (!s.ok()) {
        err << "error: " << s.message() << "\n";
        return 1;
      }
    }
    err << absl::StrFormat("\rcalibrate: layer %d/%d", l + 1, *layers);
  }
  err << "\n";
  auto meta = acc.BuildMetadata(*recipe, args->Get("model-name", ""));
  if (!meta.ok()) {
    err << "error: " << meta.status().message() << "\n";
    return 1;
  }
  absl::Status s = SaveMetadataFile(*meta, *path);
  if (!s.ok()) {
    err << "error: " << s.message() << "\n";
    return 1;
  }
  out << "wrote " << *path << " (" << *layers << " layers, " << tokens << " tokens observed)\n";
  return 0;
}

int VerifyCommand(int argc, char** argv, std::ostream& out, std::ostream& err) {
  const char* usage =
      "tqkv verify --metadata M --format turboquant35 --dim D --kv-heads H --layers L "
      "[--tp-rank R --tp-size T]";
  auto args = Args::Parse(argc, argv, 2,
                          {"metadata", "format", "dim", "kv-heads", "layers", "tp-rank", "tp-size"});
  if (!args.ok()) return Usage(err, args.status(), usage);
  auto path = args->Require("metadata");
  auto format = args->Require("format");
  auto dim = args->GetInt("dim", 128), heads = args->GetInt("kv-heads", 8),
       layers = args->GetInt("layers", 1), rank = args->GetInt("tp-rank", 0),
       size = args->GetInt("tp-size", 1);
  for (const absl::Status& s : {path.status(), format.status(), dim.status(), heads.status(),
                                layers.status(), rank.status(), size.status()})
    if (!s.ok()) return Usage(err, s, usage);
  auto meta = LoadMetadataFile(*path);
  if (!meta.ok()) {
    err << "FAIL: " << meta.status().message() << "\n";
    return 1;
  }
  auto sliced = SliceForTensorParallel(*meta, static_cast<int>(*rank), static_cast<int>(*size));
  if (!sliced.ok()) {
    err << "FAIL: " << sliced.status().message() << "\n";
    return 1;
  }
  const int heads_per_rank = static_cast<int>(sliced->layers.empty() ? 0 : sliced->layers.begin()->second.num_kv_heads());
  ModelShape shape{static_cast<int>(*layers), heads_per_rank, heads_per_rank,
                   static_cast<int>(*dim), 16};
  CodecOptions opts;
  opts.format = *format;
  auto codec = ModelCodec::Create(shape, opts, &*sliced);
  if (!codec.ok()) {
    err << "FAIL: " << codec.status().message() << "\n";
    return 1;
  }
  out << "OK: " << *path << " fits format " << *format << ", head dim " << *dim << ", "
      << heads_per_rank << " kv heads per rank (of " << *heads << "), " << *layers
      << " layers; row bytes K " << (*codec)->layer(0).k_row_bytes() << " V "
      << (*codec)->layer(0).v_row_bytes() << "\n";
  return 0;
}

}  // namespace tqkv::cli
