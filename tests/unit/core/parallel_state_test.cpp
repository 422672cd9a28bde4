// parallel_state: the rank layout against Megatron-Core's own RankGenerator (golden fixture
// tests/fixtures/parallel_state/rank_layouts.json, from gen_rank_layouts.py beside it), the
// validation messages, and ProcessGroups built from a Communicator. As a unit test the world is one
// rank; tests/CMakeLists.txt also runs this file under mpirun -np 4 and 8 (label mpi), where each
// rank checks that its groups hold the ranks of the layout and reduce over exactly them.
#include "megatron/core/parallel_state.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

namespace mg::parallel_state {
namespace {

using namespace std::chrono_literals;

nlohmann::json load_fixture() {
  const std::string path = std::string(MG_TEST_FIXTURES_DIR) + "/parallel_state/rank_layouts.json";
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "missing fixture " << path;
  return nlohmann::json::parse(f);
}

std::string case_name(const nlohmann::json& c) {
  std::ostringstream os;
  os << "world " << c["world"] << " tp " << c["tp"] << " pp " << c["pp"] << " cp " << c["cp"]
     << " ep " << c["ep"] << " etp " << c["etp"] << " order " << c["order"];
  return os.str();
}

TEST(ParallelStateGolden, LayoutsEqualMegatronCore) {
  const auto fixture = load_fixture();
  ASSERT_GE(fixture["cases"].size(), 20u);
  int checked = 0, rejected = 0;
  for (const auto& c : fixture["cases"]) {
    ParallelDims dims;
    dims.tp = c["tp"];
    dims.pp = c["pp"];
    dims.cp = c["cp"];
    dims.ep = c["ep"];
    dims.etp = c["etp"];
    dims.order = c["order"].get<std::string>();
    const int world = c["world"];
    if (c.contains("rejected")) {
      EXPECT_THROW(dims.resolved(world), Error) << case_name(c) << ": Megatron refuses it";
      ++rejected;
      continue;
    }
    const auto layout = rank_layout(dims, world);
    EXPECT_EQ(dims.resolved(world).dp, c["dp"].get<int>()) << case_name(c);
    ASSERT_EQ(layout.size(), c["groups"].size()) << case_name(c);
    for (const auto& [name, groups] : c["groups"].items()) {
      ASSERT_TRUE(layout.count(name)) << case_name(c) << ": no group '" << name << "'";
      EXPECT_EQ(layout.at(name), groups.get<RankGroups>()) << case_name(c) << ", group " << name;
      ++checked;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(checked, 300);
}

// FORMATS.md §4.4: world 16, TP 2, CP 2, PP 2 (DP 2); expert ETP 1, EP 4 (EDP 2).
TEST(ParallelState, FormatsExample) {
  ParallelDims d;
  d.tp = 2;
  d.cp = 2;
  d.pp = 2;
  d.ep = 4;
  d.etp = 1;
  const auto l = rank_layout(d, 16);
  EXPECT_EQ(l.at("cp")[1], (std::vector<int>{1, 3}));
  EXPECT_EQ(l.at("dp")[4], (std::vector<int>{8, 12}));
  EXPECT_EQ(l.at("dp-cp")[0], (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(l.at("pp")[7], (std::vector<int>{7, 15}));
  EXPECT_EQ(l.at("mp")[1], (std::vector<int>{2, 3, 10, 11}));
  EXPECT_EQ(l.at("tp-dp")[0], (std::vector<int>{0, 1, 4, 5}));
  EXPECT_EQ(l.at("ep")[2], (std::vector<int>{8, 9, 10, 11}));
  EXPECT_EQ(l.at("expert-dp")[3], (std::vector<int>{3, 7}));
  EXPECT_EQ(l.at("tp-ep-pp")[0], (std::vector<int>{0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(l.at("embedding")[0], (std::vector<int>{0, 8}));
  EXPECT_EQ(l.at("position-embedding")[0], (std::vector<int>{0}));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "(no error)";
}

TEST(ParallelState, ValidationNamesEveryFactor) {
  ParallelDims d;
  d.tp = 4;
  d.pp = 2;
  std::string m = error_of([&] { d.resolved(12); });
  EXPECT_NE(m.find("world size 12 is not divisible by tp (4) x pp (2) x cp (1) = 8"),
            std::string::npos)
      << m;
  d.dp = 4;
  m = error_of([&] { d.resolved(16); });
  EXPECT_NE(m.find("x dp (4) = 32 != world size 16"), std::string::npos) << m;
  d.dp = 0;
  d.ep = 3;
  m = error_of([&] { d.resolved(16); });
  EXPECT_NE(m.find("expert-tp (4) x ep (3) x pp (2) = 24"), std::string::npos) << m;
  d.ep = 1;
  d.order = "tp-xx-dp-pp";
  m = error_of([&] { d.resolved(16); });
  EXPECT_NE(m.find("unknown axis 'xx'"), std::string::npos) << m;
  d.order = "tp-dp-pp";
  EXPECT_EQ(d.resolved(16).order, "tp-dp-pp-ep-cp");  // missing axes of size 1 appended
  d.tp = 0;
  m = error_of([&] { d.resolved(16); });
  EXPECT_NE(m.find("tensor-model-parallel-size 0"), std::string::npos) << m;
  EXPECT_THROW(RankGenerator(1, 2, 1, 1, 2, kDefaultOrder), Error);  // ep and cp in one generator
  EXPECT_THROW(RankGenerator(2, 1, 1, 1, 1, "dp-pp"), Error);        // tp 2 not in the order
}

TEST(ParallelState, StrShowsTheLayout) {
  ParallelDims d;
  d.tp = 2;
  EXPECT_EQ(d.resolved(8).str(),
            "tp 2 x cp 1 x dp 4 x pp 1 (ep 1, etp 2, expert dp 4), order tp-cp-ep-dp-pp");
}

comm::Communicator& communicator() {
  static std::unique_ptr<comm::Communicator> c = [] {
    auto p = comm::init_communicator("");
    p->set_default_timeout(20s);
    return p;
  }();
  return *c;
}

// Every group of this rank holds the layout's group containing this rank, in order, and a sum over
// it adds exactly those ranks.
void check_groups(const ParallelDims& dims) {
  auto& c = communicator();
  const int me = c.world_rank();
  const ProcessGroups pg = make_process_groups(c, dims);
  EXPECT_EQ(pg.world->size(), c.world_size());
  for (const auto& [name, groups] : rank_layout(dims, c.world_size())) {
    const std::vector<int>* mine = nullptr;
    for (const auto& g : groups) {
      if (std::find(g.begin(), g.end(), me) != g.end()) mine = &g;
    }
    const auto& group = pg.get(name);
    ASSERT_EQ(group == nullptr, mine == nullptr) << name << " on rank " << me;
    if (!group) continue;
    EXPECT_EQ(group->name(), name);
    EXPECT_EQ(group->ranks(), *mine) << name << " on rank " << me << " (" << pg.dims.str() << ")";
    Tensor x = Tensor::from_vector(std::vector<double>{1.0 * me}, {1}, DType::f64);
    group->all_reduce(x)->wait();
    double want = 0;
    for (int r : *mine) want += r;
    EXPECT_EQ(x.to_vector<double>()[0], want) << name << " on rank " << me;
  }
  EXPECT_EQ(pg.is_pipeline_first_stage(), pg.pp->rank() == 0);
}

TEST(ProcessGroupsTest, EveryLayoutOfThisWorld) {
  const int n = communicator().world_size();
  int layouts = 0;
  for (int tp = 1; tp <= n; tp *= 2) {
    for (int pp = 1; tp * pp <= n; pp *= 2) {
      for (int ep : {1, 2}) {
        for (auto order : {kDefaultOrder, kTpPpDpOrder}) {
          ParallelDims d;
          d.tp = tp;
          d.pp = pp;
          d.ep = ep;
          d.etp = ep > 1 ? 1 : 0;
          d.order = std::string(order);
          if (n % (tp * pp) != 0 || n % (ep * pp * d.expert_tp()) != 0) continue;
          try {
            d.resolved(n);
          } catch (const Error&) {
            continue;  // a layout Megatron refuses
          }
          SCOPED_TRACE(d.resolved(n).str());
          check_groups(d);
          ++layouts;
        }
      }
    }
  }
  EXPECT_GT(layouts, 0);
}

TEST(ProcessGroupsTest, ContextParallel) {
  const int n = communicator().world_size();
  if (n % 4 != 0) GTEST_SKIP() << "needs a world divisible by 4, have " << n;
  ParallelDims d;
  d.tp = 2;
  d.cp = 2;
  check_groups(d);
}

TEST(ProcessGroupsTest, UnknownNameListsTheGroups) {
  const ProcessGroups pg = make_process_groups(communicator(), ParallelDims{});
  const std::string m = error_of([&] { pg.get("dp_cp"); });
  EXPECT_NE(m.find("dp-cp"), std::string::npos) << m;
}

}  // namespace
}  // namespace mg::parallel_state
