// generate: text from a checkpoint (Megatron's tools/run_text_generation_server.py and
// examples/inference, as one command line).
//
//   generate --load CKPT --prompt "And God said" --max-new-tokens 40 --greedy
//   generate --load CKPT --prompt "..." --temperature 0.8 --top-k 40 --top-p 0.95 --seed 7
//
// The model is rebuilt from the flags the checkpoint records (training/checkpoint_model.h) and
// its weights loaded; under mpirun it is tensor-parallel over all the ranks, or TP x EP with
// --expert-model-parallel-size for MoE models (any layout the checkpoint loader can reshard
// from), rank 0 printing; tokenizer flags given here
// (--tokenizer-type, --tokenizer-model,
// --vocab-file, --merge-file, --vocab-size) replace the recorded ones. The prompt is tokenized
// (with NullTokenizer: whitespace-separated ids), generation runs with the KV cache
// (megatron/core/inference/text_generation.h) and stops at the tokenizer's EOD (unless
// --ignore-eod) or after --max-new-tokens. Prints the prompt and the generated text, then a line
// with the token counts, the stop reason and tokens/s. --print-tokens also prints the ids.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/common/error.h"
#include "megatron/core/inference/text_generation.h"
#include "megatron/core/parallel_state.h"
#include "megatron/runtime.h"
#include "megatron/training/checkpoint_model.h"

int main(int argc, char** argv) {
  CLI::App app{"generate: sample text from a Megatron-CPP checkpoint"};
  std::string load, prompt, platform;
  std::vector<std::string> overrides;
  mg::inference::GenerationOptions go;
  bool print_tokens = false, ignore_eod = false, no_cache = false;
  app.add_option("--load", load, "checkpoint directory (its recorded flags build the model)")
      ->required();
  app.add_option("--prompt", prompt, "prompt text (NullTokenizer: whitespace-separated ids)")
      ->required();
  app.add_option("--max-new-tokens,--num-tokens-to-generate", go.max_new_tokens,
                 "tokens to generate at most (64)");
  app.add_flag("--greedy", go.sampling.greedy, "argmax decoding (same as --top-k 1)");
  app.add_option("--temperature", go.sampling.temperature, "softmax temperature (1.0)");
  app.add_option("--top-k,--top_k", go.sampling.top_k, "sample from the k most likely (0: all)");
  app.add_option("--top-p,--top_p", go.sampling.top_p,
                 "sample from the smallest set with this probability mass (0: all)");
  app.add_option("--seed", go.sampling.seed, "sampling seed (1234)");
  app.add_flag("--ignore-eod", ignore_eod, "do not stop at the end-of-document token");
  app.add_flag("--print-tokens", print_tokens, "also print the prompt and generated token ids");
  app.add_flag("--no-kv-cache", no_cache, "recompute the whole prefix for every token (slow)");
  app.add_option("--platform", platform, "cpu | cuda | ... (default: MG_PLATFORM, then auto)");
  int tp = 0, ep = 1;
  app.add_option("--tensor-model-parallel-size", tp,
                 "tensor-parallel ranks under mpirun (default: every rank of the job / EP)");
  app.add_option("--expert-model-parallel-size", ep,
                 "expert-parallel ranks under mpirun (MoE models; TP x EP = the ranks)");
  for (const char* f :
       {"--tokenizer-type", "--tokenizer-model", "--vocab-file", "--merge-file", "--vocab-size"}) {
    app.add_option_function<std::string>(
        f,
        [&overrides, f](const std::string& v) {
          overrides.emplace_back(f);
          overrides.push_back(v);
        },
        "replaces the checkpoint's recorded tokenizer flag");
  }
  CLI11_PARSE(app, argc, argv);
  try {
    mg::RuntimeOptions ro;
    ro.platform = platform;
    mg::Runtime& rt = mg::init(ro);
    // Under mpirun: the model tensor-parallel over the job's ranks (the world must equal TP: one
    // copy of the model, no data or pipeline parallelism); rank 0 prints.
    auto comm = mg::comm::init_communicator("");
    const int world = comm->world_size();
    MG_CHECK(ep >= 1 && world % ep == 0, "generate: --expert-model-parallel-size "
                                             << ep << " must divide the number of ranks " << world);
    if (tp == 0) tp = world / ep;
    MG_CHECK(tp * ep == world, "generate: --tensor-model-parallel-size "
                                   << tp << " x --expert-model-parallel-size " << ep
                                   << " must equal the number of ranks " << world
                                   << " (generation runs one copy of the model)");
    mg::training::CheckpointRanks ranks;
    if (world > 1) {
      mg::parallel_state::ParallelDims dims;
      dims.tp = tp;
      dims.ep = ep;  // carved out of the data-parallel ranks, which all run the same prompt
      const auto groups = mg::parallel_state::make_process_groups(*comm, dims.resolved(world));
      ranks.tp_group = groups.tp;
      ranks.ep_group = groups.ep;
      ranks.group = groups.dp_cp;
      ranks.world = groups.world;
    }
    const bool printer = comm->world()->rank() == 0;
    if (!printer) {
      std::cout.setstate(std::ios::failbit);
      std::cerr.setstate(std::ios::failbit);
    }
    mg::training::CheckpointModel cm = mg::training::load_model_from_checkpoint(
        load, *rt.ops, rt.device, overrides, std::nullopt, ranks);
    const auto& tok = *cm.tokenizer;
    const std::vector<int32_t> ids = tok.tokenize(prompt);
    if (!ignore_eod) go.eod = tok.eod();
    go.use_kv_cache = !no_cache;
    go.sample_vocab = tok.vocab_size();  // the model's may be larger (checkpoint_model.h)
    // Streamed as the text grows: the whole sequence is detokenized each time and the new suffix
    // printed (token-by-token decoding loses SentencePiece's word-boundary spaces).
    std::vector<int32_t> all = ids;
    std::size_t printed = tok.detokenize(ids).size();
    go.on_token = [&tok, &all, &printed](int32_t t) {
      all.push_back(t);
      const std::string text = tok.detokenize(all);
      if (text.size() > printed) std::cout << text.substr(printed) << std::flush;
      printed = std::max(printed, text.size());
    };
    std::cerr << "generate: tensor parallel " << tp << ", expert parallel " << ep << "\n";
    std::cerr << "generate: " << cm.model->num_parameters() << " parameters from " << load
              << " (iteration " << cm.state.iteration << "), " << tok.name() << " vocab "
              << tok.vocab_size() << ", prompt " << ids.size() << " tokens, "
              << (go.sampling.greedy || go.sampling.top_k == 1
                      ? std::string("greedy")
                      : "temperature " + std::to_string(go.sampling.temperature) + " top-k " +
                            std::to_string(go.sampling.top_k) + " top-p " +
                            std::to_string(go.sampling.top_p) + " seed " +
                            std::to_string(go.sampling.seed))
              << "\n";
    std::cout << prompt << std::flush;
    const mg::inference::GenerationResult r = mg::inference::generate(*cm.model, ids, go);
    std::cout << "\n";
    if (print_tokens) {
      std::cout << "prompt tokens:";
      for (int32_t t : ids) std::cout << " " << t;
      std::cout << "\ngenerated tokens:";
      for (int32_t t : r.tokens) std::cout << " " << t;
      std::cout << "\n";
    }
    char line[256];
    std::snprintf(line, sizeof(line),
                  "generated %zu tokens (stop: %s) in %.3f s: %.1f tokens/s (prefill of %zu "
                  "tokens %.1f ms, decode %.2f ms/token)%s\n",
                  r.tokens.size(), r.stop_reason.c_str(), r.prefill_seconds + r.decode_seconds,
                  r.tokens_per_second(), ids.size(), r.prefill_seconds * 1e3,
                  r.tokens.size() > 1 ? r.decode_seconds * 1e3 / double(r.tokens.size() - 1) : 0.0,
                  go.use_kv_cache ? "" : " [no KV cache]");
    std::cout << line;
  } catch (const std::exception& e) {
    std::cerr.clear();
    mg::comm::abort_on_error(e, "generate");  // one line, exit 1 (all ranks under mpirun)
  }
  return 0;
}
