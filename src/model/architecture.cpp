#include "model/architecture.h"

#include <iterator>

namespace inferd {

namespace {

// The official Gemma 3 chat template (Gemma has no system role: a system
// message opens the first user turn). Some Gemma 3 GGUFs, such as the 270M
// one we test on, carry no template of their own.
constexpr std::string_view kGemma3ChatTemplate = R"jinja({{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
)jinja";

// Field order: name, RoPE style, activation, QKV bias, QK-norm, sandwich norms,
// scaled embeddings, scaled queries, sliding-window pattern, windowed layers'
// RoPE base, default chat template (then, for mixtures of experts, the FFN kind and routing). Sources: each architecture's graph in llama.cpp (src/models/).
constexpr ArchitectureTraits kArchitectures[] = {
    {"llama", RopeStyle::kInterleaved, Activation::kSwiGLU, false, false, false, false, false, 0, 0.0f},
    {"mistral", RopeStyle::kInterleaved, Activation::kSwiGLU, false, false, false, false, false, 0, 0.0f},
    {"qwen2", RopeStyle::kNeox, Activation::kSwiGLU, true, false, false, false, false, 0, 0.0f},
    {"qwen3", RopeStyle::kNeox, Activation::kSwiGLU, false, true, false, false, false, 0, 0.0f},
    {"gemma3", RopeStyle::kNeox, Activation::kGeGLU, false, true, true, true, true, 6, 10000.0f, kGemma3ChatTemplate},
    // Then the FFN kind and the routing: src/models/qwen3moe.cpp (softmax, weights renormalized).
    {"qwen3moe", RopeStyle::kNeox, Activation::kSwiGLU, false, true, false, false, false, 0, 0.0f, {},
     FfnKind::kMixtureOfExperts, MoeTraits{ExpertGating::kSoftmax, true}},
    // Then attention sinks and the FFN norm's name: src/models/openai-moe.cpp
    // (every other layer windowed, from layer 0; softmax over the chosen
    // experts' logits; biases on Q/K/V, the output, the router and the experts).
    {"gpt-oss", RopeStyle::kNeox, Activation::kSwiGLUOai, false, false, false, false, false, 2, 0.0f, {},
     FfnKind::kMixtureOfExperts, MoeTraits{ExpertGating::kSoftmaxOfChosen, false}, true, "post_attention_norm.weight"},
    // Then optional QK norms and NextN blocks: src/models/glm4-moe.cpp
    // (GLM-4.5/4.6: Q/K/V biases (taken when present, as everywhere), partial NeoX RoPE from rope.dimension_count,
    // the FFN norm stored as post_attention_norm; dense leading layers; sigmoid
    // gating with a selection bias, one shared expert; the routing keys read
    // from the file, sigmoid and no renormalization when absent).
    {"glm4moe", RopeStyle::kNeox, Activation::kSwiGLU, false, false, false, false, false, 0, 0.0f, {},
     FfnKind::kMixtureOfExperts,
     MoeTraits{ExpertGating::kSigmoid, false, /*routing_from_file=*/true, /*selection_bias=*/true,
               /*shared_experts=*/true},
     false, "post_attention_norm.weight", /*qk_norm_if_present=*/true, /*nextn_layers=*/true},
    // Then latent attention: src/models/deepseek2.cpp (DeepSeek V2/V2-Lite/V3/R1:
    // MLA with or without query compression, normal RoPE of rope.dimension_count
    // dims with YaRN; dense leading layers, softmax gating unless the file says
    // sigmoid, a selection bias where the file has one, shared experts).
    {"deepseek2", RopeStyle::kInterleaved, Activation::kSwiGLU, false, false, false, false, false, 0, 0.0f, {},
     FfnKind::kMixtureOfExperts,
     MoeTraits{ExpertGating::kSoftmax, false, /*routing_from_file=*/true, /*selection_bias=*/false,
               /*shared_experts=*/true, /*selection_bias_if_present=*/true},
     false, "ffn_norm.weight", false, false, /*latent_attention=*/true},
    // An encoder: src/models/bert.cpp (Q/K/V and output biases, no RoPE;
    // the tensors named as convert_hf_to_gguf.py names BERT's).
    {"bert", RopeStyle::kNeox, Activation::kGelu, true, false, false, false, false, 0, 0.0f, {}, FfnKind::kDense, {},
     false, "ffn_norm.weight", false, false, /*latent_attention=*/false, /*encoder=*/true},
    // Hybrid: src/models/qwen35.cpp (Qwen3.5 dense): Gated DeltaNet layers
    // beside gated full-attention layers with per-head QK norms and NeoX
    // rotation of rope.dimension_count dims (its interleaved M-RoPE turns text
    // positions exactly as NeoX does: every section gets the same position);
    // the FFN's norm stored as post_attention_norm; trailing MTP blocks skipped.
    {"qwen35", RopeStyle::kNeox, Activation::kSwiGLU, false, true, false, false, false, 0, 0.0f, {}, FfnKind::kDense,
     {}, false, "post_attention_norm.weight", false, /*nextn_layers=*/true, false, false, /*gated_delta_net=*/true,
     /*last_layer_on_every_token=*/true},
    // Then a mixture of experts: src/models/qwen35moe.cpp (Qwen3.5 MoE):
    // qwen35's layers with softmax routing, the chosen weights renormalized,
    // and a shared expert gated by sigmoid(ffn_gate_inp_shexp . x).
    {"qwen35moe", RopeStyle::kNeox, Activation::kSwiGLU, false, true, false, false, false, 0, 0.0f, {},
     FfnKind::kMixtureOfExperts,
     MoeTraits{ExpertGating::kSoftmax, true, false, false, false, false, /*gated_shared_expert=*/true}, false,
     "post_attention_norm.weight", false, /*nextn_layers=*/true, false, false, /*gated_delta_net=*/true,
     /*last_layer_on_every_token=*/true},
    // Hybrid: src/models/nemotron-h.cpp (NVIDIA Nemotron-H, Nemotron Nano 2):
    // each layer one branch after its attn_norm: a Mamba-2 mixer
    // (src/models/mamba-base.cpp, build_mamba2_layer), attention without
    // RoPE (llama.cpp's rope type none for nemotron_h), or a non-gated
    // squared-ReLU MLP; the final norm's output cut to the wanted rows.
    // Chosen over granitehybrid, which would cost the same Mamba-2 layer plus
    // Granite's four multipliers (embedding, residual, attention, logits).
    {"nemotron_h", RopeStyle::kNeox, Activation::kReluSquared, false, false, false, false, false, 0, 0.0f, {},
     FfnKind::kDense, {}, false, "attn_norm.weight", false, false, false, false, false,
     /*last_layer_on_every_token=*/true, /*mamba2_single_branch_layers=*/true},
};

}  // namespace

const ArchitectureTraits* find_architecture(std::string_view name) {
  for (const ArchitectureTraits& a : kArchitectures)
    if (a.name == name) return &a;
  return nullptr;
}

std::string supported_architectures() {
  std::string out;
  for (const ArchitectureTraits& a : kArchitectures) {
    if (!out.empty()) out += ", ";
    out += a.name;
  }
  return out;
}

std::string unsupported_architecture_message(std::string_view name) {
  return "architecture '" + std::string(name) + "' is not supported (inferd runs " + supported_architectures() + ")";
}

}  // namespace inferd
