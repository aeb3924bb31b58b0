// The row layout (format.h) and the metadata validator (metadata.h) must agree
// on the high-precision channel count for every head dim they both accept.
#include <gtest/gtest.h>

#include "codec/format.h"
#include "codec/metadata.h"

namespace tqkv {
namespace {

TEST(FormatMetadataAgreement, HighChannelCounts) {
  for (int d = 16; d <= 1024; d += 16) {
    for (auto [name, kind] : {std::pair{"turboquant25", RecipeKind::kTurboQuant25},
                              std::pair{"turboquant35", RecipeKind::kTurboQuant35}}) {
      absl::StatusOr<int> meta = HighPrecisionChannelCount(name, d);
      ComponentSpec spec = ParseFormat(name)->k;
      absl::StatusOr<RowLayout> layout = MakeRowLayout(spec, d);
      ASSERT_EQ(meta.ok(), layout.ok()) << name << " d=" << d;
      if (meta.ok()) {
        EXPECT_EQ(*meta, RecipeHighChannels(kind, d)) << name << " d=" << d;
      }
    }
  }
}

}  // namespace
}  // namespace tqkv
