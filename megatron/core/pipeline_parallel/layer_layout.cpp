// Pipeline layer layout (layer_layout.h).
#include "megatron/core/pipeline_parallel/layer_layout.h"

#include <numeric>
#include <sstream>

#include "megatron/core/common/error.h"

namespace mg::pipeline_parallel {
namespace {

std::string opt_str(const std::optional<int64_t>& v) {
  std::ostringstream s;
  if (v)
    s << *v;
  else
    s << "(none)";
  return s.str();
}

}  // namespace

std::vector<models::PipelineChunk> PipelineLayout::chunks(int p) const {
  MG_CHECK(p >= 0 && p < pp, "pipeline rank " << p << " is outside [0, " << pp << ")");
  std::vector<models::PipelineChunk> out;
  int64_t before = 0;  // layers per chunk of the ranks before p
  for (int q = 0; q < p; ++q) before += rank_layers[static_cast<std::size_t>(q)] / vp;
  const int64_t per_chunk = rank_layers[static_cast<std::size_t>(p)] / vp;
  for (int v = 0; v < vp; ++v) {
    models::PipelineChunk c;
    c.layer_offset = v * (num_layers / vp) + before;
    c.num_layers = per_chunk;
    c.pre_process = v == 0 && p == 0;
    c.post_process = v == vp - 1 && p == pp - 1;
    out.push_back(c);
  }
  return out;
}

std::string PipelineLayout::str() const {
  std::ostringstream s;
  s << "PP " << pp;
  if (vp > 1) s << " x VP " << vp;
  s << ":";
  for (int p = 0; p < pp; ++p) {
    s << (p ? "," : "") << " rank " << p << " layers";
    for (const auto& c : chunks(p))
      s << " [" << c.layer_offset << ", " << c.layer_offset + c.num_layers << ")";
  }
  return s.str();
}

PipelineLayout make_pipeline_layout(int64_t num_layers, int pp, int vp,
                                    std::optional<int64_t> num_layers_per_virtual_stage,
                                    std::optional<int64_t> first, std::optional<int64_t> last) {
  MG_CHECK(pp >= 1, "--pipeline-model-parallel-size must be >= 1, got " << pp);
  MG_CHECK(num_layers >= 1, "--num-layers must be >= 1, got " << num_layers);
  MG_CHECK(!(num_layers_per_virtual_stage && vp > 1),
           "--num-layers-per-virtual-pipeline-stage and --virtual-pipeline-model-parallel-size "
           "are mutually exclusive");
  MG_CHECK(pp > 1 || (!first && !last),
           "--decoder-first/last-pipeline-num-layers need "
           "--pipeline-model-parallel-size > 1");
  PipelineLayout l;
  l.num_layers = num_layers;
  l.pp = pp;
  l.vp = vp < 1 ? 1 : vp;
  if (first)
    MG_CHECK(*first >= 1, "--decoder-first-pipeline-num-layers must be >= 1, got " << *first);
  if (last) MG_CHECK(*last >= 1, "--decoder-last-pipeline-num-layers must be >= 1, got " << *last);
  if (!first && !last) {
    MG_CHECK(num_layers % pp == 0, "--num-layers " << num_layers
                                                   << " is not divisible by "
                                                      "--pipeline-model-parallel-size "
                                                   << pp
                                                   << "; give the first/last stage's count with "
                                                      "--decoder-first-pipeline-num-layers / "
                                                      "--decoder-last-pipeline-num-layers");
    l.rank_layers.assign(static_cast<std::size_t>(pp), num_layers / pp);
  } else {
    const int64_t f = first.value_or(0), z = last.value_or(0);
    const int middle_ranks = pp - (first ? 1 : 0) - (last ? 1 : 0);
    const int64_t middle = num_layers - f - z;
    MG_CHECK(middle >= 0 && (middle_ranks > 0 ? middle % middle_ranks == 0 && middle >= middle_ranks
                                              : middle == 0),
             "--num-layers " << num_layers << " with --decoder-first-pipeline-num-layers "
                             << opt_str(first) << " and --decoder-last-pipeline-num-layers "
                             << opt_str(last) << " leaves " << middle << " layer(s) for the other "
                             << middle_ranks
                             << " pipeline rank(s); they must divide evenly (at least one each)");
    for (int p = 0; p < pp; ++p) {
      int64_t n = middle_ranks > 0 ? middle / middle_ranks : 0;
      if (p == 0 && first) n = f;
      if (p == pp - 1 && last) n = z;
      l.rank_layers.push_back(n);
    }
  }
  if (num_layers_per_virtual_stage) {
    const int64_t n = *num_layers_per_virtual_stage;
    MG_CHECK(!first && !last,
             "--num-layers-per-virtual-pipeline-stage with an uneven split: give "
             "--virtual-pipeline-model-parallel-size instead");
    MG_CHECK(n >= 1 && (num_layers / pp) % n == 0,
             "--num-layers-per-virtual-pipeline-stage "
                 << n << " must divide the layers per pipeline rank (" << num_layers << " / " << pp
                 << " = " << num_layers / pp << ")");
    l.vp = static_cast<int>((num_layers / pp) / n);
  }
  if (l.vp > 1) {
    MG_CHECK(pp > 1, "the interleaved schedule (virtual pipeline size "
                         << l.vp << ") needs --pipeline-model-parallel-size > 1");
    for (int p = 0; p < pp; ++p)
      MG_CHECK(l.rank_layers[static_cast<std::size_t>(p)] % l.vp == 0,
               "pipeline rank " << p << " has " << l.rank_layers[static_cast<std::size_t>(p)]
                                << " layers, not divisible by the virtual pipeline size " << l.vp);
    // Every chunk v starts at v * L / V: the per-chunk layers of all ranks must add up to L / V.
    MG_CHECK(num_layers % l.vp == 0, "--num-layers " << num_layers
                                                     << " is not divisible by the virtual "
                                                        "pipeline size "
                                                     << l.vp);
  }
  const int64_t total = std::accumulate(l.rank_layers.begin(), l.rank_layers.end(), int64_t{0});
  MG_CHECK(total == num_layers,
           "the pipeline stages hold " << total << " layers, --num-layers is " << num_layers);
  return l;
}

}  // namespace mg::pipeline_parallel
