// The checkpoint Storage interface on the local filesystem (storage.h, local_storage.cpp): byte
// ranges, mapping, streamed and buffered writes, list, exists, remove, the atomic replace of a
// small object, staged directories that are invisible until committed (and replace an existing
// final directory when they are), and the errors for a missing object, a short read and an
// unsupported URL.
#include "megatron/core/dist_checkpointing/storage.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/unit/test_util.h"

namespace mg::dist_checkpointing {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test.
std::string temp_dir(const std::string& name) {
  const auto dir =
      fs::temp_directory_path() / ("mg_storage_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::span<const std::byte> as_span(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

TEST(Storage, JoinPath) {
  EXPECT_EQ(join_path("a", "b"), "a/b");
  EXPECT_EQ(join_path("a/", "b"), "a/b");
  EXPECT_EQ(join_path("", "b"), "b");
  EXPECT_EQ(join_path("/x/y", "iter_0000001"), "/x/y/iter_0000001");
}

TEST(Storage, FactoryRefusesObjectStorageClearly) {
  EXPECT_NE(storage_for("/tmp/some/dir"), nullptr);
  EXPECT_NE(storage_for("relative/dir"), nullptr);
  const auto e = test::error_message([] { storage_for("msc://profile/ckpt"); });
  EXPECT_NE(e.find("'msc://profile/ckpt'"), std::string::npos) << e;
  EXPECT_NE(e.find("object storage"), std::string::npos) << e;
  EXPECT_NE(e.find("not built yet"), std::string::npos) << e;
  const auto e2 = test::error_message([] { storage_for("s3://bucket/ckpt"); });
  EXPECT_NE(e2.find("unknown storage scheme 's3://'"), std::string::npos) << e2;
}

TEST(Storage, WritesAndReadsRangesAndMaps) {
  const auto dir = temp_dir("rw");
  auto s = storage_for(dir);
  const std::string a = "0123456789", b = "abcdef";
  const std::string name = join_path(dir, "obj.bin");
  s->write_object(name, {as_span(a), as_span(std::string()), as_span(b)});
  EXPECT_TRUE(s->exists(name));
  EXPECT_FALSE(s->is_directory(name));
  EXPECT_EQ(s->size(name), a.size() + b.size());
  EXPECT_EQ(s->read_object(name), a + b);
  char buf[5] = {};
  s->read_range(name, 8, 5, buf);
  EXPECT_EQ(std::string(buf, 5), "89abc");
  s->read_range(name, 16, 0, buf);  // an empty range at the end is fine
  const auto m = s->map(name);
  EXPECT_EQ(m->name(), name);
  ASSERT_EQ(m->bytes().size(), 16u);
  EXPECT_EQ(std::memcmp(m->bytes().data(), (a + b).data(), 16), 0);
  m->prefetch(3, 100);  // a hint; past the end is clipped
  m->prefetch(100, 1);

  // Streamed writes; an empty object maps to an empty span.
  const std::string streamed = join_path(dir, "streamed.bin");
  {
    auto w = s->open_writer(streamed);
    w->write("hello ", 6);
    w->write("world", 5);
    EXPECT_FALSE(s->exists(streamed));  // not visible before commit
    w->commit();
  }
  EXPECT_EQ(s->read_object(streamed), "hello world");
  const std::string empty = join_path(dir, "empty.bin");
  s->write_object(empty, std::string());
  EXPECT_EQ(s->size(empty), 0u);
  EXPECT_TRUE(s->map(empty)->bytes().empty());
  // Overwriting an object replaces it whole.
  s->write_object(name, std::string("xy"));
  EXPECT_EQ(s->read_object(name), "xy");
  EXPECT_EQ(s->list(dir), (std::vector<std::string>{"empty.bin", "obj.bin", "streamed.bin"}));
}

TEST(Storage, MissingObjectsAndShortReadsAreClearErrors) {
  const auto dir = temp_dir("errors");
  auto s = storage_for(dir);
  const std::string missing = join_path(dir, "missing.bin");
  EXPECT_FALSE(s->exists(missing));
  auto e = test::error_message([&] { s->read_object(missing); });
  EXPECT_NE(e.find("cannot read '" + missing + "'"), std::string::npos) << e;
  e = test::error_message([&] { s->map(missing); });
  EXPECT_NE(e.find("cannot open '" + missing + "'"), std::string::npos) << e;
  char buf[8];
  e = test::error_message([&] { s->read_range(missing, 0, 1, buf); });
  EXPECT_NE(e.find("cannot read '" + missing + "'"), std::string::npos) << e;

  const std::string name = join_path(dir, "short.bin");
  s->write_object(name, std::string("12345"));
  e = test::error_message([&] { s->read_range(name, 2, 6, buf); });
  EXPECT_NE(e.find("short read of '" + name + "'"), std::string::npos) << e;
  EXPECT_NE(e.find("bytes [2, 8) requested, the object ends at byte 5"), std::string::npos) << e;
  e = test::error_message([&] { s->read_object(dir); });
  EXPECT_NE(e.find("not a file"), std::string::npos) << e;
}

TEST(Storage, AnAbandonedWriteLeavesNothing) {
  const auto dir = temp_dir("abandon");
  auto s = storage_for(dir);
  const std::string name = join_path(dir, "obj.bin");
  s->write_object(name, std::string("old"));
  {
    auto w = s->open_writer(name);
    w->write("new but partial", 15);
  }  // destroyed without commit (a writer that threw)
  EXPECT_EQ(s->read_object(name), "old");
  EXPECT_EQ(s->list(dir), std::vector<std::string>{"obj.bin"});  // no .tmp left
}

TEST(Storage, ListRemoveAndReplace) {
  const auto dir = temp_dir("list");
  auto s = storage_for(dir);
  EXPECT_TRUE(s->list(join_path(dir, "absent")).empty());
  s->write_object(join_path(dir, "b"), std::string("1"));
  fs::create_directories(join_path(dir, "sub/deeper"));
  s->write_object(join_path(dir, "sub/deeper/x"), std::string("2"));
  s->write_object(join_path(dir, "a"), std::string("3"));
  EXPECT_EQ(s->list(dir), (std::vector<std::string>{"a", "b", "sub"}));
  EXPECT_TRUE(s->is_directory(join_path(dir, "sub")));
  s->remove(join_path(dir, "sub"));  // recursive
  s->remove(join_path(dir, "a"));
  s->remove(join_path(dir, "never-there"));  // absent: not an error
  EXPECT_EQ(s->list(dir), std::vector<std::string>{"b"});

  const std::string tracker = join_path(dir, "latest_checkpointed_iteration.txt");
  s->replace(tracker, "100");
  EXPECT_EQ(s->read_object(tracker), "100");
  s->replace(tracker, "200");
  EXPECT_EQ(s->read_object(tracker), "200");
  EXPECT_EQ(s->list(dir), (std::vector<std::string>{"b", "latest_checkpointed_iteration.txt"}));
}

TEST(Storage, StagedDirectoriesAreInvisibleUntilCommitted) {
  const auto root = join_path(temp_dir("staging"), "ckpts");  // created by begin_staging
  auto s = storage_for(root);
  const std::string final_dir = join_path(root, "iter_0000001");
  const std::string tag = s->process_tag();
  EXPECT_FALSE(tag.empty());
  const std::string staged = s->begin_staging(final_dir, tag);
  EXPECT_EQ(staged, s->staged_name(final_dir, tag));
  EXPECT_NE(staged, final_dir);
  EXPECT_TRUE(s->is_directory(staged));
  s->write_object(join_path(staged, "rank_00000.safetensors"), std::string("payload"));
  s->write_object(join_path(staged, "metadata.json"), std::string("{}"));
  // Written but not committed: nothing under the final name.
  EXPECT_FALSE(s->exists(final_dir));
  EXPECT_FALSE(s->exists(join_path(final_dir, "metadata.json")));
  s->commit_staging(staged, final_dir);
  EXPECT_FALSE(s->exists(staged));
  EXPECT_EQ(s->list(final_dir),
            (std::vector<std::string>{"metadata.json", "rank_00000.safetensors"}));
  EXPECT_EQ(s->read_object(join_path(final_dir, "rank_00000.safetensors")), "payload");

  // A second commit of the same directory replaces it whole (no file of the old one survives,
  // nothing moved aside is left behind).
  const std::string staged2 = s->begin_staging(final_dir, tag);
  s->write_object(join_path(staged2, "metadata.json"), std::string("{\"v\": 2}"));
  EXPECT_EQ(s->read_object(join_path(final_dir, "metadata.json")), "{}");  // still the old one
  s->commit_staging(staged2, final_dir);
  EXPECT_EQ(s->list(final_dir), std::vector<std::string>{"metadata.json"});
  EXPECT_EQ(s->read_object(join_path(final_dir, "metadata.json")), "{\"v\": 2}");
  EXPECT_EQ(s->list(root), std::vector<std::string>{"iter_0000001"});

  // begin_staging clears a stale staged directory of the same tag (a crashed earlier save).
  const std::string stale = s->begin_staging(join_path(root, "iter_0000002"), tag);
  s->write_object(join_path(stale, "leftover"), std::string("x"));
  const std::string fresh = s->begin_staging(join_path(root, "iter_0000002"), tag);
  EXPECT_EQ(fresh, stale);
  EXPECT_TRUE(s->list(fresh).empty());
  EXPECT_FALSE(s->exists(join_path(root, "iter_0000002")));
}

}  // namespace
}  // namespace mg::dist_checkpointing
