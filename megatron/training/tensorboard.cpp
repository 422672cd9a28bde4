// TensorBoard event files: TFRecord framing, CRC32C, Event/Summary protobufs, the writer thread
// (tensorboard.h).
#include "megatron/training/tensorboard.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "megatron/core/common/error.h"
#include "tensorboard_event.pb.h"

namespace mg::training::tensorboard {
namespace {

using tensorboard_pb::DT_STRING;
using tensorboard_pb::Event;

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

std::string serialize(const Event& e) {
  std::string s;
  MG_CHECK(e.SerializeToString(&s), "tensorboard: could not serialize an Event");
  return s;
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
    Event e;
    MG_CHECK(e.ParseFromString(rec), path << ": a record is not an Event protobuf");
    EventRecord r;
    r.wall_time = e.wall_time();
    r.step = e.step();
    if (e.has_file_version()) r.file_version = e.file_version();
    if (e.has_summary())
      for (const auto& v : e.summary().value()) {
        EventRecord::Value x;
        x.tag = v.tag();
        x.is_scalar = v.has_simple_value();
        x.scalar = v.simple_value();
        x.plugin_name = v.metadata().plugin_data().plugin_name();
        if (v.has_tensor())
          for (const auto& s : v.tensor().string_val()) x.strings.push_back(s);
        r.values.push_back(std::move(x));
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
  Event first;
  first.set_wall_time(now_seconds());
  first.set_file_version("brain.Event:2");
  const std::string rec = frame_record(serialize(first));
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
  Event e;
  e.set_wall_time(now_seconds());
  e.set_step(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  enqueue(serialize(e));
}

void SummaryWriter::add_text(const std::string& tag, const std::string& text, int64_t step) {
  Event e;
  e.set_wall_time(now_seconds());
  e.set_step(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  auto* t = v->mutable_tensor();
  t->set_dtype(DT_STRING);
  t->mutable_tensor_shape()->add_dim()->set_size(1);
  t->add_string_val(text);
  enqueue(serialize(e));
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
