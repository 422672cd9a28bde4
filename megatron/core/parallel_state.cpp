// Parallel state: ParallelDims validation, Megatron's RankGenerator, the ProcessGroups bundle.
// The rank arithmetic follows megatron/core/parallel_state.py line for line; the golden test
// (tests/unit/core/parallel_state_test.cpp) compares it with Megatron-Core's own output.
#include "megatron/core/parallel_state.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>

namespace mg::parallel_state {

namespace {

const std::vector<std::string>& all_axes() {
  static const std::vector<std::string> axes{"tp", "pp", "dp", "ep", "cp"};  // Megatron's order
  return axes;
}

std::vector<std::string> split(std::string_view s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = s.find('-', start);
    out.emplace_back(s.substr(start, end == std::string_view::npos ? s.npos : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return out;
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::vector<int64_t> prefix_product(const std::vector<int>& a) {
  std::vector<int64_t> r{1};
  for (int v : a) r.push_back(r.back() * v);
  return r;
}

// idx[i] = (index / stride[i]) % shape[i]
std::vector<int64_t> decompose(int64_t index, const std::vector<int>& shape) {
  const auto stride = prefix_product(shape);
  std::vector<int64_t> idx(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) idx[i] = (index / stride[i]) % shape[i];
  return idx;
}

}  // namespace

RankGroups generate_masked_orthogonal_rank_groups(int world_size,
                                                  const std::vector<int>& parallel_size,
                                                  const std::vector<bool>& mask) {
  MG_CHECK(parallel_size.size() == mask.size(),
           "generate_masked_orthogonal_rank_groups: " << parallel_size.size() << " sizes and "
                                                      << mask.size() << " mask entries");
  std::vector<int> masked_shape, unmasked_shape;
  std::vector<int64_t> masked_stride, unmasked_stride;
  const auto global_stride = prefix_product(parallel_size);
  for (std::size_t i = 0; i < mask.size(); ++i) {
    (mask[i] ? masked_shape : unmasked_shape).push_back(parallel_size[i]);
    (mask[i] ? masked_stride : unmasked_stride).push_back(global_stride[i]);
  }
  const int64_t group_size = prefix_product(masked_shape).back();
  const int64_t num_groups = world_size / group_size;
  RankGroups ranks;
  for (int64_t g = 0; g < num_groups; ++g) {
    const auto group_idx = decompose(g, unmasked_shape);
    int64_t base = 0;
    for (std::size_t i = 0; i < group_idx.size(); ++i) base += group_idx[i] * unmasked_stride[i];
    std::vector<int> group;
    for (int64_t r = 0; r < group_size; ++r) {
      const auto rank_idx = decompose(r, masked_shape);
      int64_t rank = base;
      for (std::size_t i = 0; i < rank_idx.size(); ++i) rank += rank_idx[i] * masked_stride[i];
      group.push_back(static_cast<int>(rank));
    }
    ranks.push_back(std::move(group));
  }
  return ranks;
}

RankGenerator::RankGenerator(int tp, int ep, int dp, int pp, int cp, std::string_view order,
                             int rank_offset)
    : rank_offset_(rank_offset) {
  MG_CHECK(ep == 1 || cp == 1, "RankGenerator: ep (" << ep << ") and cp (" << cp
                                                     << ") cannot both be > 1 in one generator "
                                                        "(CP lives in the dense one, EP in the "
                                                        "expert one)");
  const std::map<std::string, int> size{{"tp", tp}, {"pp", pp}, {"dp", dp}, {"ep", ep}, {"cp", cp}};
  for (const auto& [name, s] : size) {
    MG_CHECK(s >= 1, "RankGenerator: " << name << " size " << s << " must be >= 1");
  }
  std::string lowered = to_lower(order);
  std::vector<std::string> tokens = split(lowered);
  std::set<std::string> seen;
  for (const std::string& t : tokens) {
    MG_CHECK(size.count(t), "RankGenerator: unknown axis '" << t << "' in order '" << order
                                                            << "' (axes: tp, cp, ep, dp, pp)");
    MG_CHECK(seen.insert(t).second,
             "RankGenerator: axis '" << t << "' appears twice in order '" << order << "'");
  }
  for (const std::string& name : all_axes()) {
    if (seen.count(name)) continue;
    MG_CHECK(size.at(name) == 1, "RankGenerator: the size of " << name << " is " << size.at(name)
                                                               << " but the order '" << order
                                                               << "' does not name it");
    tokens.push_back(name);
  }
  for (const std::string& t : tokens) {
    order_ += (order_.empty() ? "" : "-") + t;
    sizes_.push_back(size.at(t));
    world_size_ *= size.at(t);
  }
  axes_ = std::move(tokens);
}

RankGroups RankGenerator::get_ranks(std::string_view token) const {
  std::vector<bool> mask(axes_.size(), false);
  for (const std::string& t : split(to_lower(token))) {
    const auto it = std::find(axes_.begin(), axes_.end(), t);
    MG_CHECK(it != axes_.end(), "RankGenerator::get_ranks: unknown axis '"
                                    << t << "' in '" << token << "' (order " << order_ << ")");
    mask[static_cast<std::size_t>(it - axes_.begin())] = true;
  }
  RankGroups ranks = generate_masked_orthogonal_rank_groups(world_size_, sizes_, mask);
  if (rank_offset_ > 0) {
    for (auto& g : ranks) {
      for (int& r : g) r += rank_offset_;
    }
  }
  return ranks;
}

std::vector<int> default_embedding_ranks(const std::vector<int>& pp_ranks) {
  MG_CHECK(!pp_ranks.empty(), "default_embedding_ranks: empty pipeline group");
  if (pp_ranks.size() == 1) return {pp_ranks.front()};
  return {pp_ranks.front(), pp_ranks.back()};
}

std::vector<int> default_position_embedding_ranks(const std::vector<int>& pp_ranks) {
  MG_CHECK(!pp_ranks.empty(), "default_position_embedding_ranks: empty pipeline group");
  return {pp_ranks.front()};
}

std::string ParallelDims::str() const {
  std::ostringstream os;
  os << "tp " << tp << " x cp " << cp << " x dp " << dp << " x pp " << pp << " (ep " << ep
     << ", etp " << expert_tp();
  if (dp > 0) os << ", expert dp " << expert_dp();
  os << "), order " << order;
  return os.str();
}

ParallelDims ParallelDims::resolved(int world_size) const {
  MG_CHECK(world_size >= 1, "world size " << world_size << " must be >= 1");
  auto describe = [this] {
    std::ostringstream os;
    os << "tensor-model-parallel-size " << tp << ", pipeline-model-parallel-size " << pp
       << ", context-parallel-size " << cp << ", expert-model-parallel-size " << ep
       << ", expert-tensor-parallel-size " << (etp > 0 ? etp : tp);
    if (dp > 0) os << ", data-parallel-size " << dp;
    return os.str();
  };
  MG_CHECK(tp >= 1 && pp >= 1 && cp >= 1 && ep >= 1 && etp >= 0 && dp >= 0,
           "parallel sizes must be >= 1: " << describe());
  ParallelDims d = *this;
  const int64_t model = int64_t{tp} * pp * cp;
  MG_CHECK(world_size % model == 0, "world size " << world_size << " is not divisible by tp (" << tp
                                                  << ") x pp (" << pp << ") x cp (" << cp
                                                  << ") = " << model << " [" << describe() << "]");
  const int derived_dp = static_cast<int>(world_size / model);
  MG_CHECK(dp == 0 || dp == derived_dp,
           "tp (" << tp << ") x pp (" << pp << ") x cp (" << cp << ") x dp (" << dp << ") = "
                  << model * dp << " != world size " << world_size << " [" << describe() << "]");
  d.dp = derived_dp;
  d.etp = expert_tp();
  const int64_t expert_model = int64_t{d.etp} * ep * pp;
  MG_CHECK(world_size % expert_model == 0,
           "world size " << world_size << " is not divisible by expert-tp (" << d.etp << ") x ep ("
                         << ep << ") x pp (" << pp << ") = " << expert_model << " [" << describe()
                         << "]");
  // Megatron's checks (initialize_model_parallel): a valid order, the same pipeline groups in the
  // dense and expert generators, and equal data-parallel sizes unless pp is the last axis.
  const RankGenerator dense(d.tp, 1, d.dp, d.pp, d.cp, d.order);
  const RankGenerator expert(d.etp, d.ep, d.expert_dp(), d.pp, 1, d.order);
  d.order = dense.order();
  const bool pp_last = d.order.size() >= 2 && d.order.substr(d.order.size() - 2) == "pp";
  MG_CHECK(pp_last || pp == 1 || d.expert_dp() == d.dp,
           "with order " << d.order << " (pp not last) the expert data-parallel size "
                         << d.expert_dp() << " must equal the data-parallel size " << d.dp << " ["
                         << describe() << "]");
  MG_CHECK(dense.get_ranks("pp") == expert.get_ranks("pp"),
           "the dense and expert layouts give different pipeline groups ["
               << describe() << ", order " << d.order << "]");
  return d;
}

std::map<std::string, RankGroups> rank_layout(const ParallelDims& dims_in, int world_size,
                                              const LayoutOptions& options) {
  const ParallelDims d = dims_in.resolved(world_size);
  const RankGenerator dense(d.tp, 1, d.dp, d.pp, d.cp, d.order);
  const RankGenerator expert(d.etp, d.ep, d.expert_dp(), d.pp, 1, d.order);
  std::map<std::string, RankGroups> layout;
  for (const auto& [name, token] :
       std::vector<std::pair<std::string, std::string>>{{"tp", "tp"},
                                                        {"pp", "pp"},
                                                        {"dp", "dp"},
                                                        {"dp-cp", "dp-cp"},
                                                        {"cp", "cp"},
                                                        {"mp", "tp-pp"},
                                                        {"tp-dp", "tp-dp"},
                                                        {"tp-cp", "tp-cp"},
                                                        {"tp-dp-cp", "tp-dp-cp"}}) {
    layout[name] = dense.get_ranks(token);
  }
  for (const auto& [name, token] :
       std::vector<std::pair<std::string, std::string>>{{"ep", "ep"},
                                                        {"expert-tp", "tp"},
                                                        {"expert-dp", "dp"},
                                                        {"tp-ep", "tp-ep"},
                                                        {"tp-ep-pp", "tp-ep-pp"}}) {
    layout[name] = expert.get_ranks(token);
  }
  const auto& emb = options.embedding_ranks ? options.embedding_ranks : default_embedding_ranks;
  const auto& pos = options.position_embedding_ranks ? options.position_embedding_ranks
                                                     : default_position_embedding_ranks;
  for (const auto& pp_ranks : layout.at("pp")) {
    layout["embedding"].push_back(emb(pp_ranks));
    layout["position-embedding"].push_back(pos(pp_ranks));
  }
  return layout;
}

namespace {

using Member = comm::ProcessGroupPtr ProcessGroups::*;

const std::vector<std::pair<std::string_view, Member>>& members() {
  static const std::vector<std::pair<std::string_view, Member>> m{
      {"world", &ProcessGroups::world},
      {"tp", &ProcessGroups::tp},
      {"pp", &ProcessGroups::pp},
      {"dp", &ProcessGroups::dp},
      {"dp-cp", &ProcessGroups::dp_cp},
      {"cp", &ProcessGroups::cp},
      {"mp", &ProcessGroups::mp},
      {"tp-dp", &ProcessGroups::tp_dp},
      {"tp-cp", &ProcessGroups::tp_cp},
      {"tp-dp-cp", &ProcessGroups::tp_dp_cp},
      {"embedding", &ProcessGroups::embedding},
      {"position-embedding", &ProcessGroups::position_embedding},
      {"ep", &ProcessGroups::ep},
      {"expert-tp", &ProcessGroups::expert_tp},
      {"expert-dp", &ProcessGroups::expert_dp},
      {"tp-ep", &ProcessGroups::tp_ep},
      {"tp-ep-pp", &ProcessGroups::tp_ep_pp}};
  return m;
}

Member member(std::string_view name) {
  std::ostringstream names;
  for (const auto& [n, m] : members()) {
    if (n == name) return m;
    names << " " << n;
  }
  MG_THROW("ProcessGroups: no group named '" << name << "'; groups:" << names.str());
}

}  // namespace

const comm::ProcessGroupPtr& ProcessGroups::get(std::string_view name) const {
  return this->*member(name);
}

ProcessGroups make_process_groups(comm::Communicator& comm, const ParallelDims& dims,
                                  const LayoutOptions& options) {
  ProcessGroups pg;
  pg.dims = dims.resolved(comm.world_size());
  pg.world = comm.world();
  // rank_layout is a std::map: every rank creates the groups in the same (name) order.
  for (const auto& [name, groups] : rank_layout(pg.dims, comm.world_size(), options)) {
    pg.*member(name) = comm.new_groups(groups, name);
  }
  return pg;
}

}  // namespace mg::parallel_state
