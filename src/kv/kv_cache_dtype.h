// The KV cache's element type as people name it: vLLM's --kv-cache-dtype
// (auto, bfloat16, fp8_e4m3, ...) and llama.cpp's --cache-type-k/-v (f16,
// q8_0, q4_0, ...). Which of them a model's executor can read is the
// executor's to say (Executor::supports_kv_cache); this only maps names to
// DTypes and back.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/result.h"

namespace inferd::kv {

// The dtypes a KV cache may be asked for by name, in the order they are shown
// (f16 first): llama.cpp's cache types, then vLLM's fp8_e4m3.
const std::vector<DType>& kv_cache_dtype_choices();

// The name a dtype is asked for by ("f16", "q8_0"); GGML's lower-cased, and
// vLLM's "fp8_e4m3" for F8_E4M3.
std::string kv_cache_dtype_name(DType dtype);

// The dtype a name asks for: "auto" is the default (f16 today), the rest as
// kv_cache_dtype_choices() names them, plus vLLM's float16/bfloat16 and fp8
// (= fp8_e4m3, DType::F8_E4M3); fp8_e5m2 is refused. An unknown name is
// refused with the names that are known.
Result<DType> parse_kv_cache_dtype(std::string_view name);

// "auto, f16, bf16, q8_0, ...": every name parse_kv_cache_dtype accepts, for
// help texts and errors.
std::string kv_cache_dtype_names();

// vLLM's --kv-cache-dtype-skip-layers: the layers that keep f16 whatever the
// KV cache dtype, as a comma-separated list of layer kinds. Only
// "sliding_window" is a kind (the windowed layers of Gemma 3 or gpt-oss);
// empty or "none" names none. Returns whether sliding-window layers are
// named; anything else (a layer index, an unknown kind) is refused, naming it
// and what is accepted.
Result<bool> parse_kv_cache_dtype_skip_layers(std::string_view list);

}  // namespace inferd::kv
