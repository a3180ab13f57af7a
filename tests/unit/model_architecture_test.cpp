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
#include "gguf_test_util.h"
#include "model/architecture.h"
#include "model/config.h"
#include "model/layer_program.h"
#include "model/model.h"
#include "model/weights.h"
#include "test_data.h"

namespace inferd {
namespace {

std::string model_file(const std::string& name) {
  const char* d = std::getenv("INFERD_MODEL_DIR");
  const char* home = std::getenv("HOME");
  const std::string dir = d && *d ? d : std::string(home ? home : ".") + "/.cache/inferd/models";
  for (const std::string& base : {dir, inferd::test::test_data_root() + "/models"}) {
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
  for (const char* name : {"llama", "mistral", "qwen2", "qwen3", "gemma3", "qwen3moe", "gpt-oss", "glm4moe",
                           "nemotron_h"}) {
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

// glm4moe (GLM-4.5) from the tiny model's metadata: block_count 5 of which the
// last is a NextN block (not run, its tensors not loaded), two dense leading
// layers, then MoE layers routed by sigmoid with a selection bias, renormalized
// and scaled (the file's keys), with a shared expert 1 x 64 wide; partial NeoX
// RoPE (16 of 32 dimensions); biases taken from the file, no QK norms.
TEST(ModelArchitecture, Glm4MoeLayersAndRoutingFromMetadata) {
  const ModelConfig c = config_of("tiny-glm4moe.gguf");
  ASSERT_TRUE(c.can_generate());
  EXPECT_EQ(c.rope_style, RopeStyle::kNeox);
  EXPECT_EQ(c.activation, Activation::kSwiGLU);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.rope_dim, 16);
  EXPECT_FALSE(c.qk_norm);  // the file has none (GLM-4.5-Air's shape)
  EXPECT_EQ(c.traits->ffn_norm_tensor, "post_attention_norm.weight");
  EXPECT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.n_layer_nextn, 1);
  EXPECT_EQ(c.moe.gating, ExpertGating::kSigmoid);
  EXPECT_TRUE(c.moe.normalize_weights);  // expert_weights_norm, which the row alone leaves off
  EXPECT_EQ(c.moe.weights_scale, 2.5f);
  EXPECT_TRUE(c.moe.selection_bias);
  EXPECT_EQ(c.moe.n_expert_shared, 1);
  EXPECT_EQ(c.moe.shared_width(), 64);
  EXPECT_EQ(c.moe.n_leading_dense, 2);
  ASSERT_EQ(c.layers.size(), 4u);
  for (int64_t l = 0; l < 4; ++l)
    EXPECT_EQ(c.layers[l].ffn, l < 2 ? FfnKind::kDense : FfnKind::kMixtureOfExperts) << l;

  const std::vector<LayerProgram> programs = build_layer_programs(c);
  ASSERT_EQ(programs.size(), 4u);
  const auto* dense = std::get_if<DenseFfnPhase>(&programs[1].phases.back());
  EXPECT_NE(dense, nullptr);
  const auto* moe = std::get_if<MoeFfnPhase>(&programs[2].phases.back());
  ASSERT_NE(moe, nullptr);
  EXPECT_TRUE(moe->selection_bias);
  EXPECT_TRUE(moe->shared_expert);

  auto f = gguf::File::open(model_file("tiny-glm4moe.gguf"));
  ASSERT_TRUE(f.ok());
  auto w = ModelWeights::from_gguf(**f, c, programs);
  ASSERT_TRUE(w.ok()) << w.error().message;
  ASSERT_EQ(w->layers.size(), 4u);  // blk.4, the NextN block, is left in the file
  for (int64_t l = 0; l < 4; ++l) {
    const LayerWeights& L = w->layers[l];
    EXPECT_TRUE(L.bq && L.bk && L.bv) << l;
    EXPECT_EQ(static_cast<bool>(L.moe), l >= 2) << l;
    if (l < 2) continue;
    EXPECT_EQ(L.moe.selection_bias.cols, 16) << l;
    EXPECT_EQ(L.moe.gate_shexp.rows, 64) << l;
    EXPECT_EQ(L.moe.down_shexp.cols, 64) << l;
  }
}

// nemotron_h from the tiny model's metadata: each layer's one branch from the
// per-layer feed_forward_length and head_count_kv arrays (both 0: Mamba-2),
// the programs that run them (attention without RoPE, a non-gated MLP), and
// the Mamba-2 layers' tensors in the shapes convert_hf_to_gguf.py writes.
TEST(ModelArchitecture, NemotronHLayersOfOneBranchFromMetadata) {
  const ModelConfig c = config_of("tiny-nemotron-h.gguf");
  ASSERT_TRUE(c.can_generate());
  EXPECT_EQ(c.activation, Activation::kReluSquared);
  EXPECT_EQ(c.n_ff, 128);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.mamba2.n_heads, 4);
  EXPECT_EQ(c.mamba2.head_dim(), 16);
  EXPECT_EQ(c.mamba2.n_groups, 2);
  EXPECT_EQ(c.mamba2.d_state, 80);
  EXPECT_EQ(c.mamba2.conv_channels(), 64 + 2 * 2 * 80);
  const std::string pattern = "M-M*-M*-";
  ASSERT_EQ(c.layers.size(), pattern.size());
  const std::vector<LayerProgram> programs = build_layer_programs(c);
  ASSERT_EQ(programs.size(), pattern.size());
  for (size_t l = 0; l < pattern.size(); ++l) {
    const LayerConfig& layer = c.layers[l];
    EXPECT_EQ(layer.recurrent, pattern[l] == 'M') << l;
    EXPECT_EQ(layer.ffn_only, pattern[l] == '-') << l;
    EXPECT_EQ(layer.keeps_kv(), pattern[l] == '*') << l;
    std::string phases;
    for (const Phase& ph : programs[l].phases) phases += std::string(phases.empty() ? "" : " ") + phase_name(ph);
    const char* want = pattern[l] == 'M' ? "norm mamba2" : pattern[l] == '*' ? "norm qkv attention output" : "norm dense_ffn";
    EXPECT_EQ(phases, want) << l;
    if (const auto* qkv = std::get_if<QkvPhase>(&programs[l].phases[1])) EXPECT_EQ(qkv->rope, QkvPhase::kNoRope);
    if (const auto* ffn = std::get_if<DenseFfnPhase>(&programs[l].phases[1])) EXPECT_FALSE(ffn->gated);
  }

  auto f = gguf::File::open(model_file("tiny-nemotron-h.gguf"));
  ASSERT_TRUE(f.ok());
  auto w = ModelWeights::from_gguf(**f, c, programs);
  ASSERT_TRUE(w.ok()) << w.error().message;
  for (size_t l = 0; l < pattern.size(); ++l) {
    const LayerWeights& L = w->layers[l];
    EXPECT_EQ(static_cast<bool>(L.mamba2), pattern[l] == 'M') << l;
    EXPECT_TRUE(L.attn_norm || L.ffn_norm) << l;
    if (pattern[l] != 'M') continue;
    EXPECT_EQ(L.mamba2.in.rows, 2 * 64 + 2 * 2 * 80 + 4) << l;
    EXPECT_EQ(L.mamba2.norm.cols, 32) << l;  // inner / groups per group
    EXPECT_TRUE(L.mamba2.conv_b) << l;
  }
}

// deepseek2 from the two tiny models' metadata: latent attention with and
// without query compression (V3, V2-Lite), the latent cache's slot as the
// key length, the softmax scale of llama.cpp's graph (YaRN's mscale squared
// over the per-head query width), and the routing each file asks for.
TEST(ModelArchitecture, Deepseek2LatentAttentionAndRoutingFromMetadata) {
  const ModelConfig lite = config_of("tiny-deepseek2-lite.gguf");
  ASSERT_TRUE(lite.can_generate());
  EXPECT_EQ(lite.rope_style, RopeStyle::kInterleaved);
  EXPECT_EQ(lite.mla.q_lora_rank, 0);
  EXPECT_EQ(lite.mla.kv_lora_rank, 64);
  EXPECT_EQ(lite.mla.qk_nope, 32);
  EXPECT_EQ(lite.mla.qk_rope, 16);
  EXPECT_EQ(lite.mla.v_head, 32);
  EXPECT_EQ(lite.head_dim, 80);  // the latent cache's slot: latent + RoPE key
  EXPECT_EQ(lite.attn_out_dim(), 4 * 32);
  EXPECT_NEAR(lite.mla.yarn_log_mul, 0.707f, 1e-6f);
  // mscale = 1 + 0.1 * 0.707 * ln 40 (the YaRN attention factors cancel), squared over sqrt(48).
  const float m = 1.0f + 0.1f * 0.707f * std::log(40.0f);
  EXPECT_NEAR(lite.kq_scale, m * m / std::sqrt(48.0f), 1e-5f);
  EXPECT_EQ(lite.moe.gating, ExpertGating::kSoftmax);
  EXPECT_FALSE(lite.moe.normalize_weights);
  EXPECT_FALSE(lite.moe.selection_bias);  // V2 has no exp_probs_b
  EXPECT_EQ(lite.moe.n_expert_shared, 2);
  EXPECT_EQ(lite.moe.n_leading_dense, 1);
  const std::vector<LayerProgram> lite_programs = build_layer_programs(lite);
  ASSERT_EQ(lite_programs.size(), 3u);
  const std::vector<Phase>& phases = lite_programs[1].phases;
  ASSERT_EQ(phases.size(), 6u);
  const auto* qkv = std::get_if<MlaQkvPhase>(&phases[1]);
  ASSERT_NE(qkv, nullptr);
  EXPECT_FALSE(qkv->q_lora);
  EXPECT_STREQ(phase_name(phases[2]), "mla_attention");

  const ModelConfig v3 = config_of("tiny-deepseek2.gguf");
  ASSERT_TRUE(v3.can_generate());
  EXPECT_EQ(v3.mla.q_lora_rank, 64);
  EXPECT_EQ(v3.mla.kv_lora_rank, 96);
  EXPECT_EQ(v3.head_dim, 112);
  EXPECT_EQ(v3.moe.gating, ExpertGating::kSigmoid);
  EXPECT_TRUE(v3.moe.normalize_weights);
  EXPECT_EQ(v3.moe.weights_scale, 2.5f);
  EXPECT_TRUE(v3.moe.selection_bias);
  EXPECT_EQ(v3.moe.n_leading_dense, 2);
  const std::vector<LayerProgram> v3_programs = build_layer_programs(v3);
  EXPECT_TRUE(std::get<MlaQkvPhase>(v3_programs[0].phases[1]).q_lora);
  auto f = gguf::File::open(model_file("tiny-deepseek2.gguf"));
  ASSERT_TRUE(f.ok());
  auto w = ModelWeights::from_gguf(**f, v3, v3_programs);
  ASSERT_TRUE(w.ok()) << w.error().message;
  for (const LayerWeights& L : w->layers) {
    EXPECT_FALSE(L.mla.q);
    EXPECT_EQ(L.mla.q_b.rows, 4 * 48);
    EXPECT_EQ(L.mla.kv_a.rows, 112);
    EXPECT_EQ(L.mla.k_b.n_expert, 4);  // one matrix per head
    EXPECT_EQ(L.mla.k_b.rows, 96);
    EXPECT_EQ(L.mla.v_b.rows, 32);
    EXPECT_FALSE(L[Projection::kQ]);
    EXPECT_EQ(L[Projection::kO].cols, 4 * 32);
  }
}

// Without expert_gating_func and expert_weights_norm, glm4moe routes as
// llama.cpp's loader defaults it: sigmoid, weights not renormalized; a qwen3moe
// file's keys are not read (its graph fixes softmax and renormalization).
// A decoder's pooling type makes it an embedding model (its pass pools, it
// generates nothing); one it cannot run as llama.cpp does is refused by name:
// bidirectional attention (attention.causal false), rank pooling.
TEST(ModelArchitecture, DecoderPoolingFromMetadata) {
  auto config = [](std::optional<int64_t> pooling, std::optional<bool> causal) {
    gguf::testing::Writer w;
    w.str("general.architecture", "qwen3")
        .u32("qwen3.block_count", 1)
        .u32("qwen3.embedding_length", 32)
        .u32("qwen3.feed_forward_length", 64)
        .u32("qwen3.attention.head_count", 4)
        .u32("qwen3.vocab_size", 100);
    if (pooling) w.u32("qwen3.pooling_type", static_cast<uint32_t>(*pooling));
    if (causal) w.boolean("qwen3.attention.causal", *causal);
    const gguf::testing::Bytes bytes = w.build();
    auto f = gguf::File::from_memory(bytes.data(), bytes.size());
    EXPECT_TRUE(f.ok()) << f.error().message;
    return ModelConfig::from_gguf(**f);
  };
  auto generative = config(std::nullopt, std::nullopt);
  ASSERT_TRUE(generative.ok()) << generative.error().message;
  EXPECT_FALSE(generative->returns_pooled());
  EXPECT_FALSE(generative->can_embed());
  auto last = config(3, true);
  ASSERT_TRUE(last.ok()) << last.error().message;
  EXPECT_TRUE(last->returns_pooled());
  EXPECT_TRUE(last->can_embed());
  EXPECT_FALSE(last->is_encoder());
  auto bidirectional = config(1, false);
  ASSERT_FALSE(bidirectional.ok());
  EXPECT_NE(bidirectional.error().message.find("'qwen3.attention.causal' is false"), std::string::npos)
      << bidirectional.error().message;
  auto rank = config(4, std::nullopt);
  ASSERT_FALSE(rank.ok());
  EXPECT_NE(rank.error().message.find("decoder reranker"), std::string::npos) << rank.error().message;
}

TEST(ModelArchitecture, Glm4MoeRoutingDefaultsAndOtherRowsIgnoreTheKeys) {
  const ArchitectureTraits* glm = find_architecture("glm4moe");
  ASSERT_NE(glm, nullptr);
  EXPECT_EQ(glm->moe.gating, ExpertGating::kSigmoid);
  EXPECT_FALSE(glm->moe.normalize_weights);
  EXPECT_TRUE(glm->moe.routing_from_file);
  EXPECT_FALSE(find_architecture("qwen3moe")->moe.routing_from_file);
  EXPECT_FALSE(find_architecture("gpt-oss")->moe.shared_experts);
  const ModelConfig q = config_of("tiny-qwen3moe.gguf");
  EXPECT_EQ(q.moe.n_expert_shared, 0);
  EXPECT_FALSE(q.moe.selection_bias);
  EXPECT_EQ(q.n_layer_nextn, 0);
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
  std::ifstream in(inferd::test::test_data_root() + "/chat/gemma3.jinja");
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
