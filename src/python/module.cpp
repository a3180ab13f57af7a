// inferd._core: the Python bindings of Session and RequestGroup (session.h).
// The public API (LLM, SamplingParams, AsyncLLM) is Python, in python/inferd;
// this layer converts arguments, turns engine errors into ValueError, and
// releases the GIL wherever it waits for the engine or loads a model.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "engine/engine_args.h"
#include "engine/stats_json.h"
#include "model/pooling.h"
#include "python/session.h"

namespace py = pybind11;

namespace inferd::python {
namespace {

// Engine text is whole UTF-8 characters; bytes a model emits that are not
// valid UTF-8 become U+FFFD rather than an exception.
py::str utf8(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

template <class T>
T value_or_raise(Result<T> r) {
  if (!r) throw py::value_error(r.error().message);
  return std::move(*r);
}

std::chrono::nanoseconds seconds(double s) {
  if (!(s > 0)) return std::chrono::nanoseconds(0);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(std::min(s, 3600.0)));
}

std::unique_ptr<Session> open_session(const std::string& model, const EngineArgs& args, int threads,
                                      const std::string& chat_template) {
  if (threads < 0) throw py::value_error("threads must be positive (or 0: one per hardware thread)");
  SessionOptions o;
  o.model = model;
  o.threads = threads;
  o.chat_template = chat_template;
  o.engine = value_or_raise(args.config(EngineArgs::Naming::kKeyword));
  Result<std::unique_ptr<Session>> session = [&] {
    py::gil_scoped_release release;  // loading pages in the weights and warms up
    return Session::open(o);
  }();
  return value_or_raise(std::move(session));
}

GenerationParams make_params(std::vector<int32_t> prompt_token_ids, float temperature, float top_p, int32_t top_k,
                             float min_p, float repetition_penalty, float frequency_penalty, float presence_penalty,
                             std::optional<uint64_t> seed, int64_t max_tokens, std::vector<std::string> stop,
                             std::vector<int32_t> stop_token_ids, bool ignore_eos, int32_t logprobs,
                             bool skip_special_tokens, std::string request_id, int32_t prompt_logprobs) {
  GenerationParams p;
  p.request_id = std::move(request_id);
  p.prompt_token_ids = std::move(prompt_token_ids);
  p.sampling.temperature = temperature;
  p.sampling.top_p = top_p;
  p.sampling.top_k = top_k;
  p.sampling.min_p = min_p;
  p.sampling.repetition_penalty = repetition_penalty;
  p.sampling.frequency_penalty = frequency_penalty;
  p.sampling.presence_penalty = presence_penalty;
  p.sampling.seed = seed;
  // The engine checks the rest when the request is added; these it takes as given.
  if (Status st = p.sampling.validate(); !st) throw py::value_error(st.error().message);
  p.max_tokens = max_tokens;
  p.stop = std::move(stop);
  p.stop_token_ids = std::move(stop_token_ids);
  p.ignore_eos = ignore_eos;
  p.logprobs = logprobs;
  p.prompt_logprobs = prompt_logprobs;
  p.render_special = !skip_special_tokens;
  return p;
}

py::list logprob_tuples(const std::vector<SampledLogprobs>& lps) {
  py::list out;
  for (const SampledLogprobs& lp : lps) {
    py::list top;
    for (const TokenLogprob& t : lp.top) top.append(py::make_tuple(t.token, t.logprob));
    out.append(py::make_tuple(lp.token, lp.logprob, lp.rank, top));
  }
  return out;
}

// messages: (role, content, tool_calls_json, tool_call_id) tuples, made by the Python side.
using MessageTuple = std::tuple<std::string, std::string, std::string, std::string>;

}  // namespace
}  // namespace inferd::python

PYBIND11_MODULE(_core, m) {
  using namespace inferd;
  using namespace inferd::python;
  m.doc() = "inferd's engine (C++), driven by the inferd Python package";

  py::class_<GenerationParams>(m, "GenerationParams");
  m.def("make_params", &make_params, py::arg("prompt_token_ids"), py::arg("temperature"), py::arg("top_p"),
        py::arg("top_k"), py::arg("min_p"), py::arg("repetition_penalty"), py::arg("frequency_penalty"),
        py::arg("presence_penalty"), py::arg("seed"), py::arg("max_tokens"), py::arg("stop"),
        py::arg("stop_token_ids"), py::arg("ignore_eos"), py::arg("logprobs"), py::arg("skip_special_tokens"),
        py::arg("request_id"), py::arg("prompt_logprobs") = -1);

  // An embedding request (GenerationParams::pooled): the prompt's pooled vector, no tokens.
  m.def(
      "make_embed_params",
      [](std::vector<int32_t> prompt_token_ids) {
        GenerationParams p;
        p.prompt_token_ids = std::move(prompt_token_ids);
        p.pooled = true;
        return p;
      },
      py::arg("prompt_token_ids"));

  py::class_<RequestOutput>(m, "Output")
      .def_property_readonly("request_id", [](const RequestOutput& o) { return o.request_id; })
      .def_property_readonly("token_ids", [](const RequestOutput& o) { return o.token_ids; })
      .def_property_readonly("text", [](const RequestOutput& o) { return utf8(o.text); })
      .def_property_readonly("finished", [](const RequestOutput& o) { return o.finished; })
      .def_property_readonly("finish_reason",
                             [](const RequestOutput& o) -> py::object {
                               if (!o.finished) return py::none();
                               return py::str(o.finish_reason());
                             })
      .def_property_readonly("stop_string",
                             [](const RequestOutput& o) -> py::object {
                               if (o.stop_string.empty()) return py::none();
                               return utf8(o.stop_string);
                             })
      .def_property_readonly("error", [](const RequestOutput& o) { return o.error; })
      // An embedding request's pooled vector, L2-normalized as /v1/embeddings returns it.
      .def_property_readonly("embedding", [](const RequestOutput& o) { return l2_normalized(o.embedding); })
      // Per token: (token id, logprob, rank, [(id, logprob) of the most likely, best first]).
      .def_property_readonly("logprobs", [](const RequestOutput& o) { return logprob_tuples(o.logprobs); })
      // The same per prompt token from the second on (GenerationParams::prompt_logprobs).
      .def_property_readonly("prompt_logprobs", [](const RequestOutput& o) { return logprob_tuples(o.prompt_logprobs); })
      // RequestMetrics' fields in the order of inferd.RequestMetrics.
      .def_property_readonly("metrics", [](const RequestOutput& o) {
        const RequestMetrics& m = o.metrics;
        return py::make_tuple(m.arrival_time, m.first_scheduled_time, m.first_token_time, m.last_token_time,
                              m.finished_time, m.num_prompt_tokens, m.num_cached_tokens, m.num_output_tokens,
                              m.num_preemptions);
      });

  // The engine's arguments (engine_args.h), filled in by the Python side's EngineArgs.
  py::class_<EngineArgs>(m, "EngineArgs")
      .def(py::init<>())
      .def_readwrite("max_num_seqs", &EngineArgs::max_num_seqs)
      .def_readwrite("max_num_batched_tokens", &EngineArgs::max_num_batched_tokens)
      .def_readwrite("max_model_len", &EngineArgs::max_model_len)
      .def_readwrite("kv_cache_memory", &EngineArgs::kv_cache_memory)
      .def_readwrite("kv_cache_memory_fraction", &EngineArgs::kv_cache_memory_fraction)
      .def_readwrite("num_gpu_blocks_override", &EngineArgs::num_gpu_blocks_override)
      .def_readwrite("block_size", &EngineArgs::block_size)
      .def_readwrite("enable_prefix_caching", &EngineArgs::enable_prefix_caching)
      .def_readwrite("speculative_config", &EngineArgs::speculative_config)
      .def_readwrite("max_logprobs", &EngineArgs::max_logprobs)
      .def_readwrite("long_prefill_token_threshold", &EngineArgs::long_prefill_token_threshold)
      .def_readwrite("chunk_attention_cost", &EngineArgs::chunk_attention_cost)
      .def_readwrite("kv_offload_size", &EngineArgs::kv_offload_size)
      .def_readwrite("kv_store_path", &EngineArgs::kv_store_path)
      .def_readwrite("kv_store_size", &EngineArgs::kv_store_size)
      .def_readwrite("kv_cache_dtype", &EngineArgs::kv_cache_dtype)
      .def_readwrite("kv_cache_dtype_skip_layers", &EngineArgs::kv_cache_dtype_skip_layers)
      .def_readwrite("numerics", &EngineArgs::numerics);

  py::class_<Session>(m, "Session")
      .def(py::init(&open_session), py::arg("model"), py::arg("args"), py::arg("threads"), py::arg("chat_template"))
      .def(
          "encode",
          [](const Session& s, const std::string& text, bool add_special_tokens, bool parse_special) {
            return s.tokenizer().encode(text, add_special_tokens, parse_special);
          },
          py::arg("text"), py::arg("add_special_tokens") = true, py::arg("parse_special") = true)
      .def(
          "decode",
          [](const Session& s, const std::vector<int32_t>& ids, bool skip_special_tokens) {
            const int32_t n_vocab = s.tokenizer().n_vocab();
            for (int32_t id : ids)
              if (id < 0 || id >= n_vocab)
                throw py::value_error("token id " + std::to_string(id) + " is outside the vocabulary of " +
                                      std::to_string(n_vocab) + " tokens");
            return utf8(s.tokenizer().decode(ids, !skip_special_tokens));
          },
          py::arg("token_ids"), py::arg("skip_special_tokens") = true)
      .def("token_piece",
           [](const Session& s, int32_t id) {
             if (id < 0 || id >= s.tokenizer().n_vocab()) throw py::value_error("token id outside the vocabulary");
             return utf8(s.tokenizer().token_to_piece(id, true));
           })
      .def("is_control", [](const Session& s, int32_t id) { return s.tokenizer().is_control(id); })
      .def_property_readonly("n_vocab", [](const Session& s) { return s.tokenizer().n_vocab(); })
      .def_property_readonly("bos_token_id", [](const Session& s) { return s.tokenizer().bos_id(); })
      .def_property_readonly("eos_token_id", [](const Session& s) { return s.tokenizer().eos_id(); })
      .def_property_readonly("max_model_len", [](const Session& s) { return s.config().max_model_len; })
      .def_property_readonly("max_logprobs", [](const Session& s) { return s.config().max_logprobs; })
      .def_property_readonly("model_name", [](const Session& s) { return s.model().config().name; })
      .def_property_readonly("has_chat_template", &Session::has_chat_template)
      .def(
          "render_chat",
          [](const Session& s, const std::vector<MessageTuple>& messages, bool add_generation_prompt,
             const std::string& chat_template_kwargs_json, const std::string& tools_json,
             const std::string& template_source) {
            std::vector<ChatMessage> msgs;
            for (const auto& [role, content, tool_calls, call_id] : messages)
              msgs.push_back(ChatMessage{role, content, tool_calls, call_id});
            ChatPromptOptions o;
            o.add_generation_prompt = add_generation_prompt;
            o.extra_context_json = chat_template_kwargs_json;
            o.tools_json = tools_json;
            Session::RenderedChat r = value_or_raise(s.render_chat(msgs, o, template_source));
            return py::make_tuple(utf8(r.text), r.token_ids);
          },
          py::arg("messages"), py::arg("add_generation_prompt"), py::arg("chat_template_kwargs_json"),
          py::arg("tools_json"), py::arg("template_source"))
      .def("stats_json", [](Session& s) { return engine_stats_json(s.engine().stats()).dump(); });

  py::class_<RequestGroup>(m, "RequestGroup")
      .def(py::init<Session&, bool>(), py::arg("session"), py::arg("with_fd") = false,
           py::keep_alive<1, 2>())  // the session outlives its groups
      .def(
          "add",
          [](RequestGroup& g, const GenerationParams& p, int32_t n) { return value_or_raise(g.add(p, n)); },
          py::arg("params"), py::arg("n") = 1)
      .def(
          "poll",
          [](RequestGroup& g, double timeout) {
            std::vector<RequestOutput> outs;
            {
              py::gil_scoped_release release;
              outs = g.poll(seconds(timeout));
            }
            return outs;
          },
          py::arg("timeout"))
      .def(
          "gather",
          [](RequestGroup& g, double timeout) {
            py::gil_scoped_release release;
            return g.gather(seconds(timeout));
          },
          py::arg("timeout"))
      .def("whole",
           [](const RequestGroup& g, const std::string& id) {
             const RequestOutput* o = g.whole(id);
             if (!o) throw py::key_error(id);
             return *o;
           })
      .def("abort", &RequestGroup::abort)
      .def("abort_unfinished", &RequestGroup::abort_unfinished)
      .def_property_readonly("unfinished", &RequestGroup::unfinished)
      .def("fileno", &RequestGroup::fd);
}
