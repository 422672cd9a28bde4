// A checkpoint's model rebuilt from its recorded flags (checkpoint_model.h).
#include "megatron/training/checkpoint_model.h"

#include <algorithm>
#include <set>

#include "megatron/core/common/error.h"
#include "megatron/core/dist_checkpointing/storage.h"
#include "megatron/core/tokenizers/build_tokenizer.h"
#include "megatron/core/transformer/moe/moe_utils.h"
#include "megatron/training/model_provider.h"

namespace mg::training {

nlohmann::json read_checkpoint_metadata(const std::string& root, std::optional<int64_t> iteration) {
  const auto storage = dist_checkpointing::storage_for(root);
  const std::string dir = resolve_checkpoint_dir(root, iteration);
  const std::string meta = dist_checkpointing::join_path(dir, dist_checkpointing::kMetadataFile);
  MG_CHECK(storage->exists(meta),
           "checkpoint '" << dir << "' has no metadata.json (incomplete or missing)");
  try {
    return nlohmann::json::parse(storage->read_object(meta));
  } catch (const nlohmann::json::exception& e) {
    MG_THROW("checkpoint metadata '" << meta << "' is corrupt: " << e.what());
  }
}

std::vector<std::string> checkpoint_command_line(const nlohmann::json& metadata,
                                                 const std::vector<std::string>& overrides) {
  std::set<std::string> overridden;
  for (const auto& a : overrides)
    if (a.rfind("--", 0) == 0) overridden.insert(a.substr(0, a.find('=')));
  std::vector<std::string> cmd;
  std::set<std::string> present;
  const nlohmann::json args = metadata.value("args", nlohmann::json::object());
  for (auto it = args.begin(); it != args.end(); ++it) {
    const std::string& flag = it.key();
    if (flag == "--yaml-cfg" || overridden.count(flag)) continue;
    cmd.push_back(flag);
    present.insert(flag);
    if (it.value().is_array())
      for (const auto& v : it.value()) cmd.push_back(v.get<std::string>());
    else if (it.value().is_string())
      cmd.push_back(it.value().get<std::string>());
  }
  cmd.insert(cmd.end(), overrides.begin(), overrides.end());
  present.insert(overridden.begin(), overridden.end());
  // Training-only flags parse_args requires; they do not affect the model.
  const std::pair<const char*, const char*> placeholders[] = {
      {"--micro-batch-size", "1"}, {"--lr", "0"}, {"--train-iters", "1"}};
  for (const auto& [flag, value] : placeholders)
    if (!present.count(flag) &&
        !(std::string(flag) == "--train-iters" && present.count("--train-samples"))) {
      cmd.emplace_back(flag);
      cmd.emplace_back(value);
    }
  return cmd;
}

CheckpointModel load_model_from_checkpoint(const std::string& root, const ops::OpTable& ops,
                                           Device device, const std::vector<std::string>& overrides,
                                           std::optional<int64_t> iteration,
                                           const CheckpointRanks& ranks) {
  const nlohmann::json meta = read_checkpoint_metadata(root, iteration);
  MG_CHECK(
      meta.contains("args") && !meta["args"].empty(),
      "checkpoint '" << root
                     << "' records no flags (metadata.json \"args\"): cannot rebuild its model");
  CheckpointModel cm;
  try {
    cm.args = parse_args(checkpoint_command_line(meta, overrides));
  } catch (const std::exception& e) {
    MG_THROW("the flags recorded in checkpoint '" << root << "' do not parse: " << e.what());
  }
  cm.tokenizer = tokenizers::build_tokenizer(cm.args.tokenizer);
  // The model's vocabulary: the tokenizer's, or the checkpoint's real vocabulary when that is
  // larger (an HF model whose embedding has rows past its tokenizer, e.g. Qwen2's 151936 rows
  // for 151665 tokens; generation then samples only the tokenizer's ids).
  int64_t vocab = cm.tokenizer->vocab_size();
  vocab = std::max(vocab, meta.value("vocab_size", int64_t{0}));
  models::GPTModelParallel par;
  if (ranks.tp_group && ranks.tp_group->size() > 1) par.tp_group = ranks.tp_group.get();
  if (ranks.ep_group && ranks.ep_group->size() > 1) par.ep_group = ranks.ep_group.get();
  par.inference_only = true;  // forward only: MoE under TP needs no sequence parallelism
  cm.model = model_provider(cm.args.model, vocab, ops, device, par);
  LoadOptions o;
  o.load_optimizer = false;
  o.load_rng = false;
  o.iteration = iteration;
  o.vocab_size = cm.model->vocab_size();  // the padding may differ from the saved layout's
  cm.state = load_checkpoint(root, cm.model->parameters(), o, ranks);
  // The routers' expert biases (--moe-router-enable-expert-bias) route inference too.
  if (cm.args.model.moe_router_enable_expert_bias && cm.state.extra.contains("moe_expert_bias"))
    cm.model->moe_state().load_expert_bias_state(
        cm.state.extra.at("moe_expert_bias").get<std::map<std::string, std::vector<float>>>());
  return cm;
}

}  // namespace mg::training
