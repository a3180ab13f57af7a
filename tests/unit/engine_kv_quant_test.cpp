// A KV cache in Q8_0 or Q4_0 (and on the default model and tiny-deepseek2's
// latent cache BF16 and F8_E4M3)
// against the F16 one, end to end: greedy
// 64-token continuations of the reference prompts (tests/data/logits/<model>/
// prompts.json, the ones engine_llamacpp_reference_test feeds) with the F16
// cache, then each quantized cache fed the same tokens (teacher forcing): the
// share of tokens before the first divergence (where greedy decoding with
// that cache would part) and the share of positions whose argmax agrees.
// Quantized keys and values move the logits (the second tier of
// correctness: a documented tolerance, not llama.cpp's bits). Beside them,
// the F16 cache in GGML's AVX2 arithmetic, whose logits differ from the
// AVX-512 build's in the last bits only: the noise floor. On the default
// model Q8_0 sits at that floor (97.1% and 97.7% of argmaxes; greedy
// continuations part at near-ties after about half the tokens either way);
// the tiny random-weight models have flatter logits and part sooner.
// Emulating the Q8_0/Q4_0 rounding of K and V inside the exact F16 kernel
// gives the same agreement as these kernels (measured while writing this
// test), so what is lost is the quantization's, not the kernels'.
// (Batching, chunking, preemption and prefix caching with quantized caches:
// engine_batching_test.)
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "engine/sequence_generator.h"
#include "engine_test_util.h"
#include "kernels/cpu/flavour.h"
#include "model/model.h"
#include "test_data.h"

namespace inferd {
namespace {

constexpr int64_t kContinuation = 64;

struct Agreement {
  int64_t before_divergence = 0;  // greedy tokens before the first divergence, over all prompts
  int64_t top1 = 0;               // positions whose argmax is the F16 continuation's token
  int64_t total = 0;
  int identical = 0;  // continuations identical throughout
  double divergence_share() const { return static_cast<double>(before_divergence) / static_cast<double>(total); }
  double top1_share() const { return static_cast<double>(top1) / static_cast<double>(total); }
};

int32_t argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

std::vector<int32_t> continuation(Model& model, const std::vector<int32_t>& prompt, DType kv_dtype) {
  SequenceGenerator gen(model, static_cast<int64_t>(prompt.size()) + kContinuation, kv_dtype);
  GenerationOptions o;
  o.max_tokens = kContinuation;
  o.sampling.temperature = 0.0f;
  o.stop_at_end_of_generation = false;
  auto out = gen.generate(prompt, o, [](int32_t) { return true; });
  EXPECT_TRUE(out.ok()) << out.error().message;
  return out.ok() ? *out : std::vector<int32_t>{};
}

// Feeds `want` after the prompt one token at a time (teacher forcing) and
// compares each position's argmax with it: the first mismatch is where greedy
// decoding with this cache parts from `want` (up to it the two runs feed the
// same tokens in the same passes), and the mismatches after it say whether
// the cache keeps agreeing once it has seen the same text.
void compare(Model& model, const std::vector<int32_t>& prompt, const std::vector<int32_t>& want, DType kv_dtype,
             Agreement& a) {
  SequenceGenerator gen(model, static_cast<int64_t>(prompt.size()) + kContinuation, kv_dtype);
  std::vector<int32_t> fed = prompt;
  bool diverged = false;
  for (int64_t i = 0; i < kContinuation; ++i) {
    auto logits = gen.prompt_logits(fed);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    const bool same = argmax(*logits) == want[i];
    diverged |= !same;
    a.top1 += same;
    a.before_divergence += !diverged;
    fed.push_back(want[i]);
  }
  a.total += kContinuation;
  a.identical += !diverged;
}

struct Case {
  std::string logits_dir;  // tests/data/logits/<this>
  double min_q8_0_top1;    // the share of Q8_0's argmaxes that must agree with F16's continuation
  // Where set (the default model), BF16 and F8_E4M3 caches too, and the
  // shares of their argmaxes that must agree.
  double min_bf16_top1 = 0, min_fp8_top1 = 0;
};

class EngineKVQuant : public ::testing::TestWithParam<Case> {};

TEST_P(EngineKVQuant, GreedyContinuationsFollowTheF16Cache) {
  const std::string dir = inferd::test::test_data_root() + "/logits/" + GetParam().logits_dir;
  std::ifstream meta_in(dir + "/meta.json"), prompts_in(dir + "/prompts.json");
  ASSERT_TRUE(meta_in && prompts_in) << dir;
  const nlohmann::json meta = nlohmann::json::parse(meta_in), prompts = nlohmann::json::parse(prompts_in);
  const std::string file = meta["model_file"].get<std::string>();
  const std::string path = test::find_model_file(file);
  if (path.empty()) GTEST_SKIP() << file << " not found (scripts/fetch_models.sh --all)";
  if (const std::string why = test::large_model_skip(path); !why.empty()) GTEST_SKIP() << why;
  LoadOptions lo;
  lo.prefault = false;
  // One thread: the bits do not depend on the count (EngineModelThreads), and
  // under ctest -j a second thread per process mostly spins at barriers.
  lo.n_threads = 1;
  lo.ggml_flavour = kernels::GgmlFlavour::kAvx512;
  auto model = Model::load(path, lo);
  ASSERT_TRUE(model.ok()) << model.error().message;
  // The noise floor: the same F16 cache in GGML's other build's arithmetic
  // (last-bit differences in attention, softmax and SiLU).
  lo.ggml_flavour = kernels::GgmlFlavour::kAvx2;
  auto other_build = Model::load(path, lo);
  ASSERT_TRUE(other_build.ok()) << other_build.error().message;

  const bool floats = GetParam().min_bf16_top1 > 0;
  Agreement q8, q4, floor, bf16, fp8;
  for (const nlohmann::json& p : prompts) {
    const std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = continuation(**model, ids, DType::F16);
    ASSERT_EQ(static_cast<int64_t>(want.size()), kContinuation);
    ASSERT_NO_FATAL_FAILURE(compare(**model, ids, want, DType::Q8_0, q8));
    ASSERT_NO_FATAL_FAILURE(compare(**model, ids, want, DType::Q4_0, q4));
    ASSERT_NO_FATAL_FAILURE(compare(**other_build, ids, want, DType::F16, floor));
    if (floats) {
      ASSERT_NO_FATAL_FAILURE(compare(**model, ids, want, DType::BF16, bf16));
      ASSERT_NO_FATAL_FAILURE(compare(**model, ids, want, DType::F8_E4M3, fp8));
    }
  }
  const auto n = static_cast<int>(prompts.size());
  auto line = [&](const char* what, const Agreement& a) {
    std::printf("[ info ] %s, %s: %.1f%% of tokens before the first divergence from the F16 cache (%d/%d "
                "continuations identical); %.1f%% of argmaxes agree under teacher forcing\n",
                file.c_str(), what, 100 * a.divergence_share(), a.identical, n, 100 * a.top1_share());
  };
  line("Q8_0 cache", q8);
  line("Q4_0 cache", q4);
  line("F16 cache, GGML AVX2 arithmetic", floor);
  EXPECT_GE(q8.top1_share(), GetParam().min_q8_0_top1);
  if (floats) {
    line("BF16 cache", bf16);
    line("F8_E4M3 cache", fp8);
    EXPECT_GE(bf16.top1_share(), GetParam().min_bf16_top1);
    EXPECT_GE(fp8.top1_share(), GetParam().min_fp8_top1);
  }
  EXPECT_GT(q8.top1_share(), q4.top1_share());  // 8 bits a weight keep more than 4
}

// Bounds a few points under what was measured (AVX-512 machine): the
// default model 97.1% (BF16 97.7%, F8_E4M3 95.6%), tiny-llama3 95.5%, tiny-qwen3 95.2%, tiny-qwen3moe
// 90.2%, tiny-gpt-oss 83.4%, tiny-gemma3 70.2%; the latent caches
// (kernels' quantized latent attention) tiny-deepseek2 80.2% (BF16 82.4%,
// F8_E4M3 60.4%; Q4_0 32.3%, the F16 floor 94.4%), tiny-deepseek2-lite 90.9%.
INSTANTIATE_TEST_SUITE_P(Models, EngineKVQuant,
                         ::testing::Values(Case{"smollm2-135m", 0.95, 0.95, 0.93}, Case{"tiny-llama3", 0.90},
                                           Case{"tiny-qwen3", 0.90}, Case{"tiny-qwen3moe", 0.85},
                                           Case{"tiny-gemma3", 0.65}, Case{"tiny-gpt-oss", 0.78},
                                           Case{"tiny-deepseek2", 0.75, 0.77, 0.55},
                                           Case{"tiny-deepseek2-lite", 0.85}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string n = info.param.logits_dir;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace inferd
