// make_model (see model.h): the tokenizer.json "model" object -> the model of its type.
#include "megatron/core/tokenizers/hf/model.h"

#include <nlohmann/json.hpp>

#include "megatron/core/common/error.h"
#include "megatron/core/tokenizers/hf/bpe_model.h"

namespace mg::tokenizers::hf {

std::unique_ptr<Model> make_model(const nlohmann::json& model, const std::string& file) {
  MG_CHECK(model.is_object(), "HuggingFaceTokenizer: '" << file
                                                        << "': \"model\" must be an object, "
                                                        << "got " << model.dump().substr(0, 200));
  auto it = model.find("type");
  const std::string type = it == model.end() || it->is_null() ? "BPE" : it->get<std::string>();
  if (type == "BPE") return std::make_unique<BpeModel>(model, file);
  if (type == "Unigram") return make_unigram_model(model, file);
  if (type == "WordPiece") return make_wordpiece_model(model, file);
  if (type == "WordLevel") return make_wordlevel_model(model, file);
  MG_THROW("HuggingFaceTokenizer: model type '"
           << type << "' is not supported (supported: " << kSupportedModels << ")");
}

}  // namespace mg::tokenizers::hf
