// The table of architectures and the per-layer data ModelConfig derives from
// it, read from the real model files' metadata (no weights are touched).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "gguf/gguf.h"
#include "model/architecture.h"
#include "model/config.h"
#include "model/model.h"

namespace inferd {
namespace {

std::string model_file(const std::string& name) {
  const char* d = std::getenv("INFERD_MODEL_DIR");
  const char* home = std::getenv("HOME");
  const std::string dir = d && *d ? d : std::string(home ? home : ".") + "/.cache/inferd/models";
  for (const std::string& base : {dir, std::string(INFERD_TEST_DATA_DIR) + "/models"}) {
    if (std::ifstream(base + "/" + name).good()) return base + "/" + name;
  }
  ADD_FAILURE() << name << " not found: run scripts/fetch_models.sh --all";
  return "";
}

ModelConfig config_of(const std::string& name) {
  auto f = gguf::File::open(model_file(name));
  EXPECT_TRUE(f.ok()) << name;
  if (!f.ok()) return {};
  auto c = ModelConfig::from_gguf(**f);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return c.ok() ? *c : ModelConfig{};
}

TEST(ModelArchitecture, TableNamesWhatRunsAndRefusesTheRest) {
  for (const char* name : {"llama", "mistral", "qwen2", "qwen3", "gemma3", "qwen3moe", "gpt-oss"}) {
    ASSERT_NE(find_architecture(name), nullptr) << name;
    EXPECT_EQ(find_architecture(name)->name, name);
  }
  EXPECT_EQ(find_architecture("gpt2"), nullptr);
  EXPECT_EQ(find_architecture(""), nullptr);
  const std::string message = unsupported_architecture_message("phi3");
  EXPECT_NE(message.find("'phi3'"), std::string::npos) << message;
  EXPECT_NE(message.find("llama, mistral, qwen2, qwen3, gemma3"), std::string::npos) << message;
}

// gpt-oss's layers and RoPE from the tiny model's metadata (the real files'
// keys): every other layer windowed from layer 0 (no pattern key), YaRN with
// llama.cpp's defaults. The correction dimensions by hand: 64 ln(4096 /
// (beta 2 pi)) / (2 ln 150000) is 8.09 for beta 32 (floor 8) and 17.40 for
// beta 1 (ceil 18); the attention factor (1 + 0.1 ln 32) / (1 + 0.1 ln 32) is 1
// up to rounding.
TEST(ModelArchitecture, GptOssLayersAndYarnFromMetadata) {
  const ModelConfig c = config_of("tiny-gpt-oss.gguf");
  ASSERT_NE(c.traits, nullptr);
  EXPECT_EQ(c.activation, Activation::kSwiGLUOai);
  EXPECT_EQ(c.rope_style, RopeStyle::kNeox);
  EXPECT_TRUE(c.traits->attention_sinks);
  EXPECT_EQ(c.moe.gating, ExpertGating::kSoftmaxOfChosen);
  EXPECT_FALSE(c.moe.normalize_weights);
  EXPECT_EQ(c.moe.n_expert, 16);
  EXPECT_EQ(c.moe.n_expert_used, 4);
  ASSERT_EQ(c.layers.size(), 4u);
  for (int64_t l = 0; l < 4; ++l) {
    EXPECT_EQ(c.layers[l].sliding_window, l % 2 == 0 ? 128 : 0) << l;
    EXPECT_EQ(c.layers[l].rope, 0) << l;
    EXPECT_EQ(c.layers[l].ffn, FfnKind::kMixtureOfExperts) << l;
  }
  ASSERT_EQ(c.ropes.size(), 1u);
  const RopeConfig& r = c.ropes[0];
  EXPECT_EQ(r.freq_base, 150000.0f);
  EXPECT_EQ(r.freq_scale, 1.0f / 32.0f);
  EXPECT_EQ(r.ext_factor, 1.0f);
  EXPECT_EQ(r.corr_dims[0], 8.0f);
  EXPECT_EQ(r.corr_dims[1], 18.0f);
  EXPECT_NEAR(r.attn_factor, 1.0f, 1e-6f);
  EXPECT_EQ(c.kq_scale, 0.125f);  // 1 / sqrt(64)
}

TEST(ModelArchitecture, Gemma3LayersFromMetadata) {
  const ModelConfig c = config_of("gemma-3-270m-q4_k_m.gguf");
  ASSERT_TRUE(c.can_generate());
  EXPECT_EQ(c.rope_style, RopeStyle::kNeox);
  EXPECT_EQ(c.activation, Activation::kGeGLU);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.sandwich_norms);
  EXPECT_FLOAT_EQ(c.embedding_scale, std::sqrt(640.0f));
  // Q is scaled by 1/sqrt(256) before attention; the softmax then uses 1.
  EXPECT_FLOAT_EQ(c.query_scale, 1.0f / 16.0f);
  EXPECT_FLOAT_EQ(c.kq_scale, 1.0f);
  // Five windowed layers to one global: layers 5, 11 and 17 attend to everything,
  // with the file's RoPE base; the others see 512 positions with base 10,000.
  ASSERT_EQ(c.layers.size(), 18u);
  ASSERT_EQ(c.ropes.size(), 2u);
  EXPECT_FLOAT_EQ(c.ropes[0].freq_base, 1e6f);
  EXPECT_FLOAT_EQ(c.ropes[1].freq_base, 1e4f);
  for (int64_t l = 0; l < 18; ++l) {
    const bool global = l % 6 == 5;
    EXPECT_EQ(c.layers[l].sliding_window, global ? 0 : 512) << "layer " << l;
    EXPECT_EQ(c.layers[l].rope, global ? 0 : 1) << "layer " << l;
  }
}

TEST(ModelArchitecture, Qwen2IsLlamaWithBiasesAndNeoxRope) {
  const ModelConfig c = config_of("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
  ASSERT_TRUE(c.can_generate());
  EXPECT_TRUE(c.traits->qkv_bias);
  EXPECT_EQ(c.rope_style, RopeStyle::kNeox);
  EXPECT_EQ(c.activation, Activation::kSwiGLU);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.sandwich_norms);
  EXPECT_EQ(c.embedding_scale, 0.0f);
  EXPECT_FLOAT_EQ(c.kq_scale, 1.0f / 8.0f);
  ASSERT_EQ(c.ropes.size(), 1u);
  EXPECT_FLOAT_EQ(c.ropes[0].freq_base, 1e6f);
  for (const LayerConfig& l : c.layers) EXPECT_EQ(l.sliding_window, 0);
}

TEST(ModelArchitecture, Llama3RopeFactorsComeFromTheFile) {
  const ModelConfig c = config_of("tiny-llama3.gguf");
  ASSERT_TRUE(c.can_generate());
  EXPECT_EQ(c.rope_style, RopeStyle::kInterleaved);
  ASSERT_EQ(c.ropes.size(), 1u);
  EXPECT_TRUE(c.ropes[0].freq_factors);
}

TEST(ModelArchitecture, Gemma3DefaultChatTemplateIsTheOfficialOne) {
  // Used when a Gemma 3 file carries no template (the 270M one does not).
  std::ifstream in(std::string(INFERD_TEST_DATA_DIR) + "/chat/gemma3.jinja");
  ASSERT_TRUE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(find_architecture("gemma3")->default_chat_template, ss.str());
  EXPECT_TRUE(find_architecture("llama")->default_chat_template.empty());
}

// A file whose tokenizer inferd cannot read (here tiny-qwen3 with its
// pre-tokenizer renamed) is refused for running with a message naming what is
// missing, and still described (inferd info's describe-only load).
TEST(ModelArchitecture, UnreadableTokenizerIsRefusedYetDescribed) {
  std::ifstream in(model_file("tiny-qwen3.gguf"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "tokenizer.ggml.pre";
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  const size_t value = at + key.size() + 4 + 8;  // then the value's type (u32) and length (u64)
  ASSERT_EQ(bytes.substr(value, 5), "qwen2");
  bytes.replace(value, 5, "qwenx");
  const std::string path = ::testing::TempDir() + "/unreadable_tokenizer.gguf";
  std::ofstream(path, std::ios::binary) << bytes;

  auto refused = Model::load(path, LoadOptions{});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("\"qwenx\""), std::string::npos) << refused.error().message;
  LoadOptions describe;
  describe.describe_only = true;
  auto described = Model::load(path, describe);
  ASSERT_TRUE(described.ok()) << described.error().message;
  EXPECT_NE((*described)->tokenizer_error().find("\"qwenx\""), std::string::npos);
  EXPECT_EQ((*described)->config().architecture, "qwen3");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace inferd
