// Megatron-Core's quick start (examples/run_simple_mcore_train_loop.py) in C++: build a small GPT,
// mock data, the no-pipelining forward-backward function, 5 training iterations with Adam, then
// save a checkpoint and load it back. Reads top to bottom like the Python original.
//
//   build/bin/run_simple_train_loop [checkpoint_dir]   (default /tmp/mg_simple_train_loop)
#include <cstdio>
#include <iostream>

#include "megatron/core/datasets/blended_megatron_dataset_builder.h"
#include "megatron/core/datasets/data_samplers.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/pipeline_parallel/schedules.h"
#include "megatron/runtime.h"
#include "megatron/training/checkpointing.h"

using namespace mg;

constexpr int64_t kSequenceLength = 64;
constexpr int64_t kVocabSize = 100;

// model_provider(): a 2-layer GPT.
std::unique_ptr<models::GPTModel> model_provider(const Runtime& rt) {
  transformer::TransformerConfig config;
  config.num_layers = 2;
  config.hidden_size = 12;
  config.num_attention_heads = 4;
  config.seq_length = kSequenceLength;
  auto model = std::make_unique<models::GPTModel>(config, kVocabSize, *rt.ops, rt.device);
  model->init_weights(/*seed=*/123);
  return model;
}

// get_train_data_iterator(): Megatron's MockGPTDataset, micro-batches of 8.
std::unique_ptr<datasets::DataIterator> get_train_data_iterator() {
  datasets::DataConfig config;
  config.mock = true;
  config.seq_length = kSequenceLength;
  config.vocab_size = kVocabSize;
  config.eod_id = 0;
  auto splits =
      datasets::BlendedMegatronDatasetBuilder(config, {1000, std::nullopt, std::nullopt}).build();
  datasets::DataIteratorOptions options;
  options.micro_batch_size = 8;
  return std::make_unique<datasets::DataIterator>(splits[0], options);
}

int main(int argc, char** argv) {
  try {
    const std::string checkpoint_path = argc > 1 ? argv[1] : "/tmp/mg_simple_train_loop";
    Runtime& rt = mg::init();

    auto gpt_model = model_provider(rt);
    optimizer::OptimizerConfig optim_config;
    optim_config.lr = 0.01;
    optimizer::MegatronOptimizer optim(optim_config, gpt_model->parameters(), gpt_model->buffer(),
                                       *rt.ops);
    auto train_iterator = get_train_data_iterator();
    auto next_batch = [&] {
      datasets::MicroBatch mb = *train_iterator->next();
      return models::GPTBatch{mb.tokens, mb.labels, mb.loss_mask, mb.position_ids, {}};
    };

    // The training loop: zero grads, forward-backward, optimizer step.
    for (int64_t iteration = 0; iteration < 5; ++iteration) {
      optim.zero_grad();
      auto losses = pipeline_parallel::forward_backward_no_pipelining(
          *gpt_model, next_batch, /*num_microbatches=*/1, {}, models::StepRng{123, iteration, 0});
      optim.step(*optim_config.lr, optim_config.weight_decay);
      std::printf("Losses reduced :  {'lm loss': %.6f}\n", losses.lm_loss);
    }

    // Saving the model, then loading it into a fresh one.
    training::CheckpointState state;
    state.iteration = 5;
    state.optimizer = optim.state_dict();
    training::save_checkpoint(checkpoint_path, gpt_model->parameters(), state);
    std::printf("Successfully saved the model to %s\n", checkpoint_path.c_str());

    auto loaded_model = model_provider(rt);
    training::load_checkpoint(checkpoint_path, loaded_model->parameters());
    std::printf("Successfully loaded the model from %s\n", checkpoint_path.c_str());
  } catch (const mg::Error& e) {
    std::fprintf(stderr, "run_simple_train_loop: error: %s\n", e.message().c_str());
    return 1;
  }
  return 0;
}
