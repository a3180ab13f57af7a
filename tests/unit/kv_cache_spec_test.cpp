// KVCacheSpec: the sizes of a KV cache group's slots, segments and pages per
// dtype, what a spec refuses to describe, and how two specs differ.
#include "kv/kv_cache_spec.h"

#include <gtest/gtest.h>

namespace inferd::kv {
namespace {

TEST(KVCacheSpec, F16SizesAreTwoBytesAnElement) {
  // SmolLM2-135M's shape: 3 KV heads of 64, 16 tokens a block.
  const KVCacheSpec s = KVCacheSpec::full_attention(DType::F16, 3, 64, 16);
  EXPECT_TRUE(s.validate().ok());
  EXPECT_EQ(s.slot_elements(), 192);
  EXPECT_EQ(s.head_bytes(), 128u);
  EXPECT_EQ(s.slot_bytes(), 384u);
  EXPECT_EQ(s.segment_bytes(), 16u * 384);  // the 6 KiB a KV transfer reads per layer and side
  EXPECT_EQ(s.bytes_per_token(), 768u);
  EXPECT_EQ(s.page_bytes(), 2u * 16 * 384);
  EXPECT_NE(s.storage_format(), 1);  // 1: slot by slot, the layout before the head-by-head one
  EXPECT_EQ(s.kind, KVCacheKind::kFullAttention);
  EXPECT_EQ(s.sliding_window, 0);
}

TEST(KVCacheSpec, QuantizedSizesCountWholeBlocks) {
  // Q8_0: 34 bytes a block of 32; Q4_0: 18. (Sizes only: no executor reads them yet.)
  const KVCacheSpec q8 = KVCacheSpec::full_attention(DType::Q8_0, 2, 64, 16);
  EXPECT_TRUE(q8.validate().ok());
  EXPECT_EQ(q8.head_bytes(), 68u);
  EXPECT_EQ(q8.slot_bytes(), 136u);
  EXPECT_EQ(q8.page_bytes(), 2u * 16 * 136);
  const KVCacheSpec q4 = KVCacheSpec::full_attention(DType::Q4_0, 2, 64, 16);
  EXPECT_EQ(q4.head_bytes(), 36u);
  EXPECT_EQ(KVCacheSpec::full_attention(DType::F32, 2, 64, 16).head_bytes(), 256u);
}

TEST(KVCacheSpec, ForWindowPicksTheKind) {
  const KVCacheSpec w = KVCacheSpec::for_window(DType::F16, 1, 256, 16, 512);
  EXPECT_EQ(w.kind, KVCacheKind::kSlidingWindow);
  EXPECT_EQ(w.sliding_window, 512);
  EXPECT_TRUE(w.validate().ok());
  const KVCacheSpec f = KVCacheSpec::for_window(DType::F16, 1, 256, 16, 0);
  EXPECT_EQ(f.kind, KVCacheKind::kFullAttention);
  // A window changes what is read, not the bytes a block takes.
  EXPECT_EQ(w.page_bytes(), f.page_bytes());
  EXPECT_EQ(w.storage_format(), f.storage_format());
  EXPECT_NE(w, f);
}

TEST(KVCacheSpec, ValidateRefusesWhatCannotBeLaidOut) {
  KVCacheSpec s = KVCacheSpec::full_attention(DType::Q8_0, 2, 48, 16);  // 48 is not whole blocks of 32
  EXPECT_NE(s.validate().error().message.find("not whole blocks"), std::string::npos);
  s = KVCacheSpec::full_attention(DType::F16, 2, 64, 0);
  EXPECT_FALSE(s.validate().ok());
  s = KVCacheSpec::full_attention(DType::F16, 2, 64, 16);
  s.dtype = static_cast<DType>(4);  // a number GGML removed
  EXPECT_NE(s.validate().error().message.find("not a known type"), std::string::npos);
  s = KVCacheSpec::full_attention(DType::F16, 2, 64, 16);
  s.kind = KVCacheKind::kSlidingWindow;  // without a window
  EXPECT_FALSE(s.validate().ok());
  s = KVCacheSpec::full_attention(DType::F16, 2, 64, 16);
  s.sliding_window = 64;  // a window on full attention
  EXPECT_FALSE(s.validate().ok());
}

TEST(KVCacheSpec, EveryOtherFormatHasANumberOfItsOwn) {
  const int64_t f16 = KVCacheSpec::full_attention(DType::F16, 2, 64, 16).storage_format();
  const int64_t bf16 = KVCacheSpec::full_attention(DType::BF16, 2, 64, 16).storage_format();
  const int64_t q8 = KVCacheSpec::full_attention(DType::Q8_0, 2, 64, 16).storage_format();
  const int64_t q4 = KVCacheSpec::full_attention(DType::Q4_0, 2, 64, 16).storage_format();
  EXPECT_NE(f16, 1);
  EXPECT_NE(bf16, f16);
  EXPECT_NE(q8, f16);
  EXPECT_NE(q8, bf16);
  EXPECT_NE(q4, q8);
}

TEST(KVCacheSpec, ALatentSlotHasKeysOnly) {
  // DeepSeek-V2-Lite's latent cache: a 512-wide latent and a 64-wide RoPE key, one "head".
  const KVCacheSpec s = KVCacheSpec::latent(DType::F16, 576, 16);
  EXPECT_TRUE(s.validate().ok());
  EXPECT_EQ(s.kind, KVCacheKind::kLatent);
  EXPECT_FALSE(s.has_values());
  EXPECT_EQ(s.n_stores(), 1);
  EXPECT_EQ(s.slot_bytes(), 1152u);
  EXPECT_EQ(s.bytes_per_token(), 1152u);  // llama.cpp's K-only MLA cache: 576 f16 a token and layer
  EXPECT_EQ(s.page_bytes(), 16u * 1152);
  // The same bytes a slot as one full-attention head of 576, but another format.
  const KVCacheSpec mha = KVCacheSpec::full_attention(DType::F16, 1, 576, 16);
  EXPECT_EQ(mha.bytes_per_token(), 2 * s.bytes_per_token());
  EXPECT_NE(s.storage_format(), mha.storage_format());
  EXPECT_NE(s.describe().find("latent attention"), std::string::npos);
  KVCacheSpec two_heads = s;
  two_heads.num_kv_heads = 2;
  EXPECT_FALSE(two_heads.validate().ok());
}

TEST(KVCacheSpec, ARecurrentStateIsF32PerSequenceAndTakesNoBlocks) {
  // Qwen3.5-0.8B's Gated DeltaNet layer: a conv of 4 taps over 2 * 16 * 128 +
  // 16 * 128 channels (3 rows kept), 16 value heads of 128 x 128.
  const int64_t channels = 2 * 16 * 128 + 16 * 128;
  const KVCacheSpec s = KVCacheSpec::recurrent_state(3 * channels, 16 * 128 * 128);
  EXPECT_TRUE(s.validate().ok()) << s.validate().error().message;
  EXPECT_EQ(s.kind, KVCacheKind::kRecurrentState);
  EXPECT_EQ(s.dtype, DType::F32);
  EXPECT_FALSE(s.per_token());
  EXPECT_EQ(s.bytes_per_token(), 0u);
  EXPECT_EQ(s.page_bytes(), 0u);
  EXPECT_EQ(s.conv_state_bytes(), 4u * 3 * channels);
  EXPECT_EQ(s.recurrent_state_bytes(), 4u * 16 * 128 * 128);
  EXPECT_EQ(s.state_bytes(), s.conv_state_bytes() + s.recurrent_state_bytes());
  EXPECT_NE(s.describe().find("recurrent state"), std::string::npos);
  EXPECT_NE(s.storage_format(), KVCacheSpec::full_attention(DType::F32, 1, 64, 16).storage_format());
  KVCacheSpec f16 = s;
  f16.dtype = DType::F16;
  EXPECT_FALSE(f16.validate().ok());
  KVCacheSpec empty = s;
  empty.recurrent_elements = 0;
  EXPECT_FALSE(empty.validate().ok());
  KVCacheSpec attention = KVCacheSpec::full_attention(DType::F16, 2, 64, 16);
  attention.conv_elements = 4;
  EXPECT_FALSE(attention.validate().ok());
}

TEST(KVCacheSpec, MismatchNamesTheGroupAndBothSpecs) {
  const std::vector<KVCacheSpec> mine = {KVCacheSpec::full_attention(DType::F16, 1, 256, 16),
                                         KVCacheSpec::sliding(DType::F16, 1, 256, 16, 512)};
  EXPECT_EQ(spec_mismatch(mine, mine), std::nullopt);
  std::vector<KVCacheSpec> theirs = mine;
  theirs[1].dtype = DType::Q8_0;
  EXPECT_EQ(spec_mismatch(mine, theirs).value_or(""),
            "KV group 1 differs (here sliding window 512, F16, 1 KV heads x 256, 16 tokens a block; "
            "peer sliding window 512, Q8_0, 1 KV heads x 256, 16 tokens a block)");
  theirs.pop_back();
  EXPECT_EQ(spec_mismatch(mine, theirs).value_or(""), "KV group count differs (here 2, peer 1)");
  // A peer's numbers that name no dtype or kind are described, never trusted.
  theirs = mine;
  theirs[0].dtype = static_cast<DType>(999);
  theirs[0].kind = static_cast<KVCacheKind>(7);
  EXPECT_NE(spec_mismatch(mine, theirs).value_or("").find("unknown, dtype 999"), std::string::npos);
}

// Which specs store keys and values Walsh-Hadamard-rotated (kernels/cpu/hadamard.h).
TEST(KVCacheSpec, QuantizedCachesRotateWholeMultiplesOf64Only) {
  EXPECT_EQ(KVCacheSpec::full_attention(DType::F16, 4, 128, 16).key_rotation(), 0);
  EXPECT_EQ(KVCacheSpec::full_attention(DType::Q8_0, 4, 64, 16).key_rotation(), 64);
  EXPECT_EQ(KVCacheSpec::full_attention(DType::Q8_0, 4, 128, 16).key_rotation(), 128);
  EXPECT_EQ(KVCacheSpec::full_attention(DType::Q4_0, 4, 192, 16).key_rotation(), 64);
  EXPECT_EQ(KVCacheSpec::full_attention(DType::Q4_0, 4, 256, 16).value_rotation(), 64);
  EXPECT_EQ(KVCacheSpec::full_attention(DType::Q4_0, 4, 96, 16).key_rotation(), 0);
  EXPECT_EQ(KVCacheSpec::full_attention(DType::Q4_0, 4, 96, 16).value_rotation(), 0);
  // fp8_e4m3 is rotated (it measured better so), bf16 not (kv_cache_spec.cpp).
  EXPECT_EQ(KVCacheSpec::full_attention(DType::F8_E4M3, 4, 128, 16).key_rotation(), 128);
  EXPECT_EQ(KVCacheSpec::full_attention(DType::F8_E4M3, 4, 128, 16).value_rotation(), 64);
  EXPECT_EQ(KVCacheSpec::full_attention(DType::BF16, 4, 128, 16).key_rotation(), 0);
  EXPECT_EQ(KVCacheSpec::full_attention(DType::BF16, 4, 128, 16).value_rotation(), 0);
}

}  // namespace
}  // namespace inferd::kv
