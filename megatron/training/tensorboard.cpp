// TensorBoard event files: TFRecord framing, CRC32C, Event/Summary protobufs, the writer thread
// (tensorboard.h).
#include "megatron/training/tensorboard.h"

#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "megatron/core/common/error.h"

namespace mg::training::tensorboard {
namespace {

// The protobuf module (tensorboard_pb.cpp): libmg_tensorboard_pb.so beside this library, loaded on
// first use with RTLD_LOCAL | RTLD_DEEPBIND so that its libprotobuf-lite stays out of the global
// symbol scope, where libsentencepiece's private protobuf 3.14 symbols live.
using ValueFn = void (*)(void*, const char*, int, float, const char*, const char*, std::size_t,
                         int);
struct PbModule {
  int (*serialize)(double, int64_t, int, const char*, double, const char*, std::size_t, char**,
                   std::size_t*) = nullptr;
  void (*free_buffer)(char*) = nullptr;
  int (*parse)(const char*, std::size_t, double*, int64_t*, char**, std::size_t*, ValueFn,
               void*) = nullptr;
};

const PbModule& pb() {
  static const PbModule m = [] {
    Dl_info info{};
    MG_CHECK(dladdr(reinterpret_cast<void*>(&frame_record), &info) != 0 && info.dli_fname,
             "tensorboard: cannot locate libmegatron_training");
    const std::string path =
        (std::filesystem::path(info.dli_fname).parent_path() / "libmg_tensorboard_pb.so").string();
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    MG_CHECK(h != nullptr, "tensorboard: cannot load " << path << ": " << dlerror());
    PbModule r;
    r.serialize = reinterpret_cast<decltype(r.serialize)>(dlsym(h, "mg_tb_serialize_event"));
    r.free_buffer = reinterpret_cast<decltype(r.free_buffer)>(dlsym(h, "mg_tb_free"));
    r.parse = reinterpret_cast<decltype(r.parse)>(dlsym(h, "mg_tb_parse_event"));
    MG_CHECK(r.serialize && r.free_buffer && r.parse,
             "tensorboard: " << path << " lacks the mg_tb_* functions");
    return r;
  }();
  return m;
}

// kind 0: file_version; 1: scalar; 2: text.
std::string serialize(double wall_time, int64_t step, int kind, const std::string& tag,
                      double value, const std::string& text) {
  char* buf = nullptr;
  std::size_t n = 0;
  MG_CHECK(pb().serialize(wall_time, step, kind, tag.c_str(), value, text.data(), text.size(), &buf,
                          &n) == 0,
           "tensorboard: could not serialize an Event");
  std::string s(buf, n);
  pb().free_buffer(buf);
  return s;
}

constexpr uint32_t kCastagnoliReflected = 0x82F63B78u;
constexpr uint32_t kMaskDelta = 0xa282ead8u;

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kCastagnoliReflected : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
}
uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::atomic<int> g_file_uid{0};

}  // namespace

uint32_t crc32c(std::string_view data, uint32_t crc) {
  crc = ~crc;
  for (const char ch : data)
    crc = kTable[(crc ^ static_cast<unsigned char>(ch)) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + kMaskDelta;
}

std::string frame_record(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 16);
  put_le(out, payload.size(), 8);
  const uint32_t len_crc = masked_crc32c(out);
  put_le(out, len_crc, 4);
  out.append(payload);
  put_le(out, masked_crc32c(payload), 4);
  return out;
}

std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MG_CHECK(in, "tensorboard: cannot open " << path);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < data.size()) {
    MG_CHECK(data.size() - pos >= 12, path << ": truncated record header at byte " << pos);
    const std::string_view len_bytes(data.data() + pos, 8);
    const uint64_t len = get_le(data.data() + pos, 8);
    const uint32_t len_crc = static_cast<uint32_t>(get_le(data.data() + pos + 8, 4));
    MG_CHECK(len_crc == masked_crc32c(len_bytes), path << ": length CRC mismatch at byte " << pos
                                                       << " (stored " << len_crc << ", computed "
                                                       << masked_crc32c(len_bytes) << ")");
    MG_CHECK(data.size() - pos - 12 >= len + 4, path << ": record at byte " << pos << " of " << len
                                                     << " bytes runs past the end (" << data.size()
                                                     << " bytes)");
    const std::string_view payload(data.data() + pos + 12, len);
    const uint32_t crc = static_cast<uint32_t>(get_le(data.data() + pos + 12 + len, 4));
    MG_CHECK(crc == masked_crc32c(payload),
             path << ": data CRC mismatch in the record at byte " << pos);
    out.emplace_back(payload);
    pos += 12 + len + 4;
  }
  return out;
}

std::vector<EventRecord> read_event_file(const std::string& path) {
  std::vector<EventRecord> out;
  for (const std::string& rec : read_records(path)) {
    EventRecord r;
    char* fv = nullptr;
    std::size_t fv_len = 0;
    const ValueFn on_value = [](void* ctx, const char* tag, int is_scalar, float scalar,
                                const char* plugin, const char* str, std::size_t str_len,
                                int n_strings) {
      EventRecord::Value x;
      x.tag = tag;
      x.is_scalar = is_scalar != 0;
      x.scalar = scalar;
      x.plugin_name = plugin;
      if (n_strings > 0) x.strings.emplace_back(str, str_len);
      static_cast<EventRecord*>(ctx)->values.push_back(std::move(x));
    };
    MG_CHECK(
        pb().parse(rec.data(), rec.size(), &r.wall_time, &r.step, &fv, &fv_len, on_value, &r) == 0,
        path << ": a record is not an Event protobuf");
    if (fv) {
      r.file_version.assign(fv, fv_len);
      pb().free_buffer(fv);
    }
    out.push_back(std::move(r));
  }
  return out;
}

SummaryWriter::SummaryWriter(const std::string& log_dir, int64_t queue_size, double flush_secs)
    : queue_size_(static_cast<std::size_t>(std::max<int64_t>(1, queue_size))),
      flush_secs_(flush_secs) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  MG_CHECK(!ec, "--tensorboard-dir " << log_dir << ": cannot create it: " << ec.message());
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  std::ostringstream name;
  name << "events.out.tfevents." << static_cast<int64_t>(now_seconds()) << "." << host << "."
       << getpid() << "." << g_file_uid++;
  path_ = (std::filesystem::path(log_dir) / name.str()).string();
  file_.open(path_, std::ios::binary | std::ios::trunc);
  MG_CHECK(file_, "--tensorboard-dir: cannot create the event file " << path_);
  const std::string rec = frame_record(serialize(now_seconds(), 0, 0, "", 0.0, "brain.Event:2"));
  file_.write(rec.data(), static_cast<std::streamsize>(rec.size()));
  file_.flush();
  MG_CHECK(file_, "--tensorboard-dir: cannot write " << path_);
  thread_ = std::thread([this] { run(); });
}

SummaryWriter::~SummaryWriter() {
  try {
    close();
  } catch (...) {
    // A destructor must not throw; close() already reported nothing more useful than the error.
  }
}

void SummaryWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  enqueue(serialize(now_seconds(), step, 1, tag, value, ""));
}

void SummaryWriter::add_text(const std::string& tag, const std::string& text, int64_t step) {
  enqueue(serialize(now_seconds(), step, 2, tag, 0.0, text));
}

void SummaryWriter::enqueue(std::string serialized_event) {
  std::unique_lock<std::mutex> lk(mu_);
  MG_CHECK(!closing_, "tensorboard: " << path_ << " is closed");
  cv_room_.wait(lk, [&] { return queue_.size() < queue_size_ || !error_.empty(); });
  MG_CHECK(error_.empty(), error_);
  queue_.push_back(std::move(serialized_event));
  cv_.notify_one();
}

void SummaryWriter::flush() {
  std::unique_lock<std::mutex> lk(mu_);
  if (closed_) return;
  flush_requested_ = true;
  cv_.notify_one();
  cv_room_.wait(lk, [&] {
    return (!flush_requested_ && queue_.empty() && in_progress_ == 0) || !error_.empty();
  });
  MG_CHECK(error_.empty(), error_);
}

void SummaryWriter::close() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return;
    closing_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
  closed_ = true;
  file_.close();
  MG_CHECK(error_.empty(), error_);
}

void SummaryWriter::run() {
  auto last_flush = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    const auto deadline = last_flush + std::chrono::duration<double>(flush_secs_);
    cv_.wait_until(lk, std::chrono::time_point_cast<std::chrono::steady_clock::duration>(deadline),
                   [&] { return !queue_.empty() || closing_ || flush_requested_; });
    std::deque<std::string> batch;
    batch.swap(queue_);
    in_progress_ = static_cast<int64_t>(batch.size());
    const bool flush_now =
        flush_requested_ || closing_ || std::chrono::steady_clock::now() >= deadline;
    const bool stop = closing_;
    cv_room_.notify_all();  // room in the queue
    lk.unlock();
    std::string err;
    for (const std::string& e : batch) {
      const std::string rec = frame_record(e);
      file_.write(rec.data(), static_cast<std::streamsize>(rec.size()));
    }
    if (flush_now) {
      file_.flush();
      last_flush = std::chrono::steady_clock::now();
    }
    if (!file_) err = "tensorboard: writing " + path_ + " failed (disk full or removed?)";
    lk.lock();
    in_progress_ = 0;
    if (!err.empty()) error_ = err;
    if (flush_now && queue_.empty()) flush_requested_ = false;
    cv_room_.notify_all();
    if ((stop && queue_.empty()) || !error_.empty()) return;
  }
}

}  // namespace mg::training::tensorboard
