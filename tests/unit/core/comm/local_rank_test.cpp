// The node-local rank from the launchers' variables (precedence, validation) and the device it
// selects (comm/local_rank.h); mg::init's device on the CPU platform.
#include "megatron/core/comm/local_rank.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "tests/unit/test_util.h"

namespace mg::comm {
namespace {

GetEnv env(std::map<std::string, std::string> vars) {
  auto holder = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [holder](const char* name) -> const char* {
    auto it = holder->find(name);
    return it == holder->end() ? nullptr : it->second.c_str();
  };
}

TEST(LocalRank, DefaultsToZeroWithoutALauncher) {
  const LocalRank r = local_rank_from(env({}));
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.source, "default");
}

TEST(LocalRank, EachLauncherVariableIsRead) {
  int value = 3;
  for (const char* var : kLocalRankVars) {
    const LocalRank r = local_rank_from(env({{var, std::to_string(value)}}));
    EXPECT_EQ(r.rank, value) << var;
    EXPECT_EQ(r.source, var);
    ++value;
  }
}

TEST(LocalRank, PrecedenceTorchrunThenOpenMpiThenSlurmThenMpich) {
  std::map<std::string, std::string> all = {{"LOCAL_RANK", "1"},
                                            {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                            {"SLURM_LOCALID", "3"},
                                            {"MPI_LOCALRANKID", "4"}};
  EXPECT_EQ(local_rank_from(env(all)).source, "LOCAL_RANK");
  all.erase("LOCAL_RANK");
  // mpirun inside a SLURM allocation: every rank inherits SLURM_LOCALID=0; OpenMPI's wins.
  all["SLURM_LOCALID"] = std::string("0");  // not = "0": a bogus -Wrestrict in GCC 12 at -O3
  EXPECT_EQ(local_rank_from(env(all)).rank, 2);
  all.erase("OMPI_COMM_WORLD_LOCAL_RANK");
  EXPECT_EQ(local_rank_from(env(all)).source, "SLURM_LOCALID");
  all.erase("SLURM_LOCALID");
  EXPECT_EQ(local_rank_from(env(all)).rank, 4);
}

TEST(LocalRank, BlanksAroundTheNumberAreAccepted) {
  EXPECT_EQ(local_rank_from(env({{"LOCAL_RANK", " 7\n"}})).rank, 7);
}

TEST(LocalRank, GarbageIsAnErrorNamingTheVariableAndValue) {
  for (const char* bad : {"", "abc", "-1", "1.5", "2x", "0x3", " ", "99999999999"}) {
    const std::string msg = test::error_message([&] {
      local_rank_from(env({{"OMPI_COMM_WORLD_LOCAL_RANK", bad}}));
    });
    EXPECT_NE(msg.find("OMPI_COMM_WORLD_LOCAL_RANK='" + std::string(bad) + "'"), std::string::npos)
        << msg;
  }
  // A bad higher-precedence value is not skipped in favour of a good lower one.
  EXPECT_NE(test::error_message([&] {
              local_rank_from(env({{"LOCAL_RANK", "one"}, {"SLURM_LOCALID", "1"}}));
            }).find("LOCAL_RANK='one'"),
            std::string::npos);
}

TEST(SelectDevice, LocalRankModuloDeviceCount) {
  // Computed independently: the rank's position in a round-robin over the devices.
  for (int count = 1; count <= 8; ++count) {
    int expect = 0;
    for (int rank = 0; rank < 20; ++rank) {
      EXPECT_EQ(select_device(rank, count), expect) << rank << " of " << count;
      expect = expect + 1 == count ? 0 : expect + 1;
    }
  }
}

TEST(SelectDevice, NoDeviceOrNegativeRankIsAnError) {
  EXPECT_NE(test::error_message([] { select_device(0, 0); }).find("no device"), std::string::npos);
  EXPECT_NE(test::error_message([] { select_device(-1, 2); }).find("negative local rank -1"),
            std::string::npos);
}

TEST(Runtime, RecordsTheLocalRankAndItsDevice) {
  test::ensure_runtime();
  Runtime& rt = mg::init();
  EXPECT_EQ(rt.local_rank.rank, local_rank().rank);
  if (rt.platform->device_type() == DeviceType::cpu)
    EXPECT_EQ(rt.device, Device::cpu());
  else
    EXPECT_EQ(rt.device.index, select_device(rt.local_rank.rank, rt.platform->device_count()));
  EXPECT_NE(device_summary(rt).find("local rank"), std::string::npos);
}

}  // namespace
}  // namespace mg::comm
