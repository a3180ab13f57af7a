#include "model/model.h"

#include "model/cpu_executor.h"

namespace inferd {

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const LoadOptions& options) {
  auto file = gguf::File::open(path);
  if (!file) return file.error();
  std::unique_ptr<Model> m(new Model());
  m->file_ = std::move(*file);
  m->flavour_ = options.ggml_flavour;
  auto config = ModelConfig::from_gguf(*m->file_);
  if (!config) return make_error(path + ": " + config.error().message);
  m->config_ = *config;
  auto tok = Tokenizer::from_gguf(*m->file_);
  if (!tok) return make_error(path + ": " + tok.error().message);
  m->tokenizer_ = std::move(*tok);
  if (m->can_generate()) {
    auto w = ModelWeights::from_gguf(*m->file_, m->config_);
    if (!w) return make_error(path + ": " + w.error().message);
    m->weights_ = std::move(*w);
  }
  if (options.prefault) m->file_->prefault(options.progress ? options.progress : [](double) {});
  // The executor is made last: it may copy the weights into its own layouts.
  if (m->can_generate()) m->executor_ = make_executor(options.backend, *m);
  return m;
}

std::string Model::chat_template() const {
  if (file_->find("tokenizer.chat_template"))
    if (auto t = file_->get_string("tokenizer.chat_template")) return *t;
  return config_.traits ? std::string(config_.traits->default_chat_template) : std::string();
}

void Model::forward(const ForwardBatch& batch, KVCache& cache, std::vector<float>& logits, ThreadPool& pool) {
  executor_->forward(batch, cache, logits, pool);
}

std::unique_ptr<Executor> make_executor(Backend backend, const Model& model) {
  switch (backend) {
    case Backend::kCpu: return std::make_unique<CpuExecutor>(model);
  }
  return nullptr;
}

}  // namespace inferd
