// Forward-backward calls of an FP8 GPT on the CPU platform, shared by the FP8 tests
// (fp8_recipe_test, fp8_attention_test): losses, gradients, the Fp8State after the calls, and,
// under the op profiler, how often each op ran.
#pragma once

#include <string>
#include <vector>

#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/ops/op_profiler.h"
#include "megatron/core/pipeline_parallel/schedules.h"
#include "megatron/runtime.h"
#include "tests/unit/core/models/gpt_test_util.h"
#include "tests/unit/test_util.h"

namespace mg::test {

struct FbRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> grads;
  std::vector<float> fwd_history, bwd_history, fwd_scale;
  nlohmann::json state;  // Fp8State::state_json() after the calls
  int64_t casts = 0;     // weight casts per forward-backward call
  int64_t linears = 0, attentions = 0;
  ops::OpProfileReport report;  // run_fb_profiled only
  // Calls of `op` in the run (run_fb_profiled; 0 for an op that never ran).
  int64_t calls(const char* op) const {
    const ops::OpProfileRow* row = report.find(op);
    return row ? row->calls : int64_t{0};
  }
};

// `calls` forward-backward calls of `micro` micro-batches (batch 1, seq 16, vocabulary 64), the
// weights moved between calls (as an optimizer step would). ops: the table (null: the CPU
// platform's).
inline FbRun run_fb(const transformer::TransformerConfig& c, int64_t micro, int calls,
                    bool forward_only, const ops::OpTable* table = nullptr) {
  const auto& ops = table ? *table : ops_on("cpu");
  models::GPTModel m(c, 64, ops, Device::cpu());
  m.init_weights(3);
  const models::GPTBatch full = random_batch(micro, 16, 64, 11);
  FbRun r;
  r.linears = m.fp8_state()->num_linears();
  r.attentions = m.fp8_state()->num_attentions();
  for (int call = 0; call < calls; ++call) {
    int64_t next = 0;
    const pipeline_parallel::NextBatchFn feed = [&] { return batch_rows(full, next++, 1); };
    pipeline_parallel::ForwardBackwardConfig cfg;
    cfg.forward_only = forward_only;
    m.zero_grad();
    const int64_t before = m.fp8_state()->weight_casts();
    const auto res = pipeline_parallel::forward_backward_no_pipelining(m, feed, micro, cfg,
                                                                       models::StepRng{1, call, 0});
    r.casts = m.fp8_state()->weight_casts() - before;
    for (const auto& mb : res.microbatches) r.losses.push_back(mb.loss_sum);
    for (auto& p : m.parameters()) {
      r.grads.push_back(p.main_grad.to_vector<float>());
      std::vector<float> w = p.param.to_vector<float>();
      for (float& v : w) v *= 1.01f;  // the "optimizer step": new weights, new amaxes
      p.param.copy_(Tensor::from_vector(w, p.param.shape()));
    }
  }
  r.fwd_history = m.fp8_state()->history(true);
  r.bwd_history = m.fp8_state()->history(false);
  r.fwd_scale = m.fp8_state()->scale(true);
  r.state = m.fp8_state()->state_json();
  return r;
}

// run_fb through the CPU platform's table under the op profiler (FbRun::calls).
inline FbRun run_fb_profiled(const transformer::TransformerConfig& c, int64_t micro, int calls,
                             bool forward_only) {
  Runtime& rt = mg::init({.platform = "cpu"});
  ops::OpProfiler prof(*rt.ops, *rt.platform, rt.device);
  prof.start();
  prof.begin_step();
  FbRun r = run_fb(c, micro, calls, forward_only, &prof.table());
  prof.end_step();
  prof.stop();
  r.report = prof.report();
  return r;
}

}  // namespace mg::test
