#include "model/model.h"

#include "model/cpu_encoder_executor.h"
#include "model/cpu_executor.h"

namespace inferd {

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const LoadOptions& options) {
  auto file = gguf::File::open(path);
  if (!file) return file.error();
  std::unique_ptr<Model> m(new Model());
  m->file_ = std::move(*file);
  m->flavour_ = options.ggml_flavour;
  m->numerics_ = options.numerics;
  auto config = ModelConfig::from_gguf(*m->file_);
  if (!config) return make_error(path + ": " + config.error().message);
  m->config_ = *config;
  auto tok = Tokenizer::from_gguf(*m->file_);
  if (!tok) {
    if (!options.describe_only) return make_error(path + ": " + tok.error().message);
    m->tokenizer_error_ = tok.error().message;
    return m;
  }
  m->tokenizer_ = std::move(*tok);
  if (options.describe_only) return m;
  if (m->can_generate()) {
    m->programs_ = build_layer_programs(m->config_);
    auto w = ModelWeights::from_gguf(*m->file_, m->config_, m->programs_);
    if (!w) return make_error(path + ": " + w.error().message);
    m->weights_ = std::move(*w);
    // The first rows of a row-major matrix are a view of their own.
    if (options.max_output_rows > 0 && options.max_output_rows < m->weights_.output.rows)
      m->weights_.output.rows = options.max_output_rows;
  }
  if (options.prefault) m->file_->prefault(options.progress ? options.progress : [](double) {});
  // The executor is made last: it may copy the weights into its own layouts.
  if (m->can_generate()) m->executor_ = make_executor(*m, options);
  return m;
}

std::string Model::chat_template() const {
  if (file_->find("tokenizer.chat_template"))
    if (auto t = file_->get_string("tokenizer.chat_template")) return *t;
  return config_.traits ? std::string(config_.traits->default_chat_template) : std::string();
}

void Model::forward(const ForwardBatch& batch, KVCache& cache, std::vector<float>& logits) {
  executor_->forward(batch, cache, logits);
}

Status Model::check_kv_cache(const KVLayout& layout) const {
  if (!executor_) return make_error("this model has no executor (it cannot generate)");
  for (const kv::KVCacheSpec& spec : layout.group_specs) {
    if (Status s = spec.validate(); !s) return s;
    if (Status s = executor_->supports_kv_cache(spec); !s) return s;
  }
  return {};
}

std::unique_ptr<Executor> make_executor(const Model& model, const LoadOptions& options) {
  switch (options.backend) {
    case Backend::kCpu: {
      auto pool = options.thread_pool ? options.thread_pool
                                      : std::make_shared<ThreadPool>(options.n_threads > 0
                                                                         ? options.n_threads
                                                                         : ThreadPool::hardware_threads());
      if (model.config().is_encoder()) return std::make_unique<CpuEncoderExecutor>(model, std::move(pool));
      return std::make_unique<CpuExecutor>(model, std::move(pool));
    }
  }
  return nullptr;
}

}  // namespace inferd
