// Which decoder layers each pipeline stage (and each virtual stage) builds: Megatron's
// get_num_layers_to_build / get_transformer_layer_offset.
//
//   * even split: num_layers / PP per rank (it must divide: never silently fewer layers,
//     PITFALLS #9);
//   * uneven: --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers give the
//     first / last rank's count, the other ranks share the rest evenly (it must divide);
//   * virtual pipeline (interleaving) with V chunks per rank: each rank's layers are split into V
//     equal chunks; virtual stage v * PP + p (chunk v of rank p) holds the next layers in
//     virtual-stage order, so chunk v of rank p starts at v * (L / V) + sum_{q < p} n_q / V.
// The sum of the layers of all stages is checked to equal num_layers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/models/common/language_module.h"

namespace mg::pipeline_parallel {

struct PipelineLayout {
  int64_t num_layers = 0;
  int pp = 1;                        // pipeline ranks
  int vp = 1;                        // model chunks per rank (virtual pipeline size)
  std::vector<int64_t> rank_layers;  // layers of each pipeline rank (all its chunks)

  // The model chunks of pipeline rank p, in virtual-stage order (GPTModelParallel's
  // pipeline_chunks): the first virtual stage has pre_process, the last post_process.
  std::vector<models::PipelineChunk> chunks(int p) const;
  // "PP 2 x VP 2: rank 0 layers [0, 2) [4, 6), rank 1 layers [2, 4) [6, 8)"
  std::string str() const;
};

// Validates and builds the layout. num_layers_per_virtual_stage (--num-layers-per-virtual-
// pipeline-stage) and vp (--virtual-pipeline-model-parallel-size, 0 or 1: none) are mutually
// exclusive; first / last: --decoder-first/last-pipeline-num-layers. Throws naming the numbers.
PipelineLayout make_pipeline_layout(int64_t num_layers, int pp, int vp,
                                    std::optional<int64_t> num_layers_per_virtual_stage,
                                    std::optional<int64_t> first, std::optional<int64_t> last);

}  // namespace mg::pipeline_parallel
