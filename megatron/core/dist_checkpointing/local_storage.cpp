// The local-filesystem Storage (storage.h): the only file with POSIX / std::filesystem calls for
// checkpoints. Objects are files; a write goes to "<name>.tmp", is fsynced and renamed over the
// name; a staged directory is committed by rename (an existing final directory is first moved
// aside to "<final>.old.<pid>" and removed after), with the directory and its parent fsynced so
// the renames survive a crash. Reads map the file (mmap) or pread a range.
// Not done: Windows; network filesystems without atomic rename.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "megatron/core/common/error.h"
#include "megatron/core/dist_checkpointing/storage.h"

namespace mg::dist_checkpointing {
namespace {

namespace fs = std::filesystem;

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// fsync a file or directory by path (directories make renames durable).
void fsync_path(const fs::path& p) {
  Fd f(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  MG_CHECK(f.fd >= 0, "cannot open '" << p.string() << "' to sync: " << std::strerror(errno));
  MG_CHECK(::fsync(f.fd) == 0, "fsync of '" << p.string() << "' failed: " << std::strerror(errno));
}

fs::path parent_of(const fs::path& p) {
  const fs::path parent = p.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

class LocalMapped final : public MappedObject {
 public:
  explicit LocalMapped(const std::string& name) : name_(name) {
    Fd f(::open(name.c_str(), O_RDONLY | O_CLOEXEC));
    MG_CHECK(f.fd >= 0, "cannot open '" << name << "': " << std::strerror(errno));
    struct stat st {};
    MG_CHECK(::fstat(f.fd, &st) == 0, "cannot stat '" << name << "': " << std::strerror(errno));
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ == 0) return;  // mmap of 0 bytes fails; an empty span is the object
    map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, f.fd, 0);
    MG_CHECK(map_ != MAP_FAILED, "cannot mmap '" << name << "': " << std::strerror(errno));
  }
  ~LocalMapped() override {
    if (map_ && map_ != MAP_FAILED) ::munmap(map_, size_);
  }
  LocalMapped(const LocalMapped&) = delete;
  LocalMapped& operator=(const LocalMapped&) = delete;
  const std::string& name() const override { return name_; }
  std::span<const std::byte> bytes() const override {
    return {static_cast<const std::byte*>(map_), size_};
  }
  void prefetch(std::size_t offset, std::size_t size) const override {
    if (size == 0 || !map_ || offset >= size_) return;
    size = std::min(size, size_ - offset);
    const long page = ::sysconf(_SC_PAGESIZE);
    const auto start = reinterpret_cast<std::uintptr_t>(map_) + offset;
    const std::uintptr_t aligned = start - start % static_cast<std::uintptr_t>(page);
    ::madvise(reinterpret_cast<void*>(aligned), size + (start - aligned), MADV_WILLNEED);
  }

 private:
  std::string name_;
  void* map_ = nullptr;
  std::size_t size_ = 0;
};

class LocalWriter final : public ObjectWriter {
 public:
  explicit LocalWriter(std::string name) : name_(std::move(name)), tmp_(name_ + ".tmp") {
    std::error_code ec;  // objects need no directories: create the parents
    fs::create_directories(parent_of(name_), ec);
    MG_CHECK(!ec, "cannot create the directory of '" << name_ << "': " << ec.message());
    f_.fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    MG_CHECK(f_.fd >= 0, "cannot create '" << tmp_ << "': " << std::strerror(errno));
  }
  ~LocalWriter() override {
    if (committed_) return;
    ::close(f_.fd);
    f_.fd = -1;
    ::unlink(tmp_.c_str());  // an abandoned write leaves nothing behind
  }
  LocalWriter(const LocalWriter&) = delete;
  LocalWriter& operator=(const LocalWriter&) = delete;
  void write(const void* data, std::size_t n) override {
    MG_CHECK(!committed_, "write to '" << name_ << "' after commit");
    const char* c = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(f_.fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      MG_CHECK(w > 0, "write to '" << tmp_ << "' failed: " << std::strerror(errno));
      c += w;
      n -= static_cast<std::size_t>(w);
    }
  }
  void commit() override {
    MG_CHECK(!committed_, "'" << name_ << "' committed twice");
    MG_CHECK(::fsync(f_.fd) == 0, "fsync of '" << tmp_ << "' failed: " << std::strerror(errno));
    ::close(f_.fd);
    f_.fd = -1;
    std::error_code ec;
    fs::rename(tmp_, name_, ec);
    MG_CHECK(!ec, "cannot rename '" << tmp_ << "' to '" << name_ << "': " << ec.message());
    committed_ = true;
  }

 private:
  std::string name_, tmp_;
  Fd f_;
  bool committed_ = false;
};

class LocalStorage final : public Storage {
 public:
  bool exists(const std::string& name) const override {
    std::error_code ec;
    return fs::exists(name, ec);
  }
  bool is_directory(const std::string& name) const override {
    std::error_code ec;
    return fs::is_directory(name, ec);
  }
  std::vector<std::string> list(const std::string& dir) const override {
    std::vector<std::string> out;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return out;
    for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().filename());
    MG_CHECK(!ec, "cannot list '" << dir << "': " << ec.message());
    std::sort(out.begin(), out.end());
    return out;
  }
  std::size_t size(const std::string& name) const override {
    struct stat st {};
    MG_CHECK(::stat(name.c_str(), &st) == 0,
             "cannot read '" << name << "': " << std::strerror(errno));
    MG_CHECK(S_ISREG(st.st_mode), "cannot read '" << name << "': not a file");
    return static_cast<std::size_t>(st.st_size);
  }
  void read_range(const std::string& name, std::size_t offset, std::size_t n,
                  void* dst) const override {
    Fd f(::open(name.c_str(), O_RDONLY | O_CLOEXEC));
    MG_CHECK(f.fd >= 0, "cannot read '" << name << "': " << std::strerror(errno));
    char* c = static_cast<char*>(dst);
    std::size_t done = 0;
    while (done < n) {
      const ssize_t r = ::pread(f.fd, c + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      MG_CHECK(r >= 0, "read of '" << name << "' failed: " << std::strerror(errno));
      MG_CHECK(r > 0, "short read of '" << name << "': bytes [" << offset << ", " << offset + n
                                        << ") requested, the object ends at byte "
                                        << offset + done);
      done += static_cast<std::size_t>(r);
    }
  }
  std::unique_ptr<MappedObject> map(const std::string& name) const override {
    return std::make_unique<LocalMapped>(name);
  }
  std::unique_ptr<ObjectWriter> open_writer(const std::string& name) override {
    return std::make_unique<LocalWriter>(name);
  }
  void replace(const std::string& name, const std::string& text) override {
    write_object(name, text);
    fsync_path(parent_of(name));
  }
  void remove(const std::string& name) override {
    std::error_code ec;
    fs::remove_all(name, ec);
    MG_CHECK(!ec, "cannot remove '" << name << "': " << ec.message());
  }
  std::string process_tag() const override { return std::to_string(::getpid()); }
  // Staged (<dir>.tmp.<pid>) and moved-aside (<dir>.old.<pid>) directories of saves whose process
  // is gone (killed mid-save) are removed; those of live processes are left alone.
  static void remove_stale_staging(const fs::path& root) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root, ec)) {
      const std::string name = e.path().filename().string();
      std::size_t at = name.rfind(".tmp.");
      if (at == std::string::npos) at = name.rfind(".old.");
      if (at == std::string::npos || at + 5 >= name.size()) continue;
      const std::string pid_text = name.substr(at + 5);
      if (pid_text.find_first_not_of("0123456789") != std::string::npos || pid_text.size() > 9)
        continue;
      const auto pid = static_cast<pid_t>(std::stol(pid_text));
      if (pid <= 0 || pid == ::getpid()) continue;
      if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
      std::error_code ignored;
      fs::remove_all(e.path(), ignored);
    }
  }
  std::string staged_name(const std::string& final_dir, const std::string& tag) const override {
    return final_dir + ".tmp." + tag;
  }
  std::string begin_staging(const std::string& final_dir, const std::string& tag) override {
    const fs::path root = parent_of(final_dir);
    std::error_code ec;
    fs::create_directories(root, ec);
    MG_CHECK(!ec, "cannot create checkpoint directory '" << root.string() << "': " << ec.message());
    remove_stale_staging(root);
    const std::string staged = staged_name(final_dir, tag);
    fs::remove_all(staged, ec);
    fs::create_directories(staged, ec);
    MG_CHECK(!ec, "cannot create '" << staged << "': " << ec.message());
    return staged;
  }
  void commit_staging(const std::string& staged, const std::string& final_dir) override {
    fsync_path(staged);
    std::error_code ec;
    const std::string old_dir = final_dir + ".old." + std::to_string(::getpid());
    const bool had_old = fs::exists(final_dir);
    if (had_old) {
      fs::rename(final_dir, old_dir, ec);
      MG_CHECK(!ec, "cannot move aside '" << final_dir << "': " << ec.message());
    }
    fs::rename(staged, final_dir, ec);
    MG_CHECK(!ec, "cannot rename '" << staged << "' to '" << final_dir << "': " << ec.message());
    fsync_path(parent_of(final_dir));
    if (had_old) fs::remove_all(old_dir, ec);
  }
};

}  // namespace

std::shared_ptr<Storage> local_storage() {
  return std::make_shared<LocalStorage>();
}

}  // namespace mg::dist_checkpointing
