// TensorBoard event files, as Megatron's torch.utils.tensorboard.SummaryWriter writes them.
//
// File: <dir>/events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n> (TensorFlow's name). Each
// record is TFRecord framing: uint64 length (little endian), uint32 masked CRC32C of those 8 bytes,
// the bytes of one serialized `Event`, uint32 masked CRC32C of the bytes. The masked CRC is
// ((crc >> 15) | (crc << 17)) + 0xa282ead8 over CRC32C (Castagnoli, reflected polynomial
// 0x82F63B78). Debian 12 packages no C/C++ CRC32C library (libabsl 20220623 has none), so it is an
// 256-entry table implementation of that polynomial here (crc32c()).
// The first record is an Event with file_version "brain.Event:2"; every other one carries a
// Summary: a scalar is Summary.Value{tag, simple_value}, text is Summary.Value{tag, metadata
// {plugin "text"}, tensor {DT_STRING, shape [1], string_val}} (torch's add_text). The messages are
// compiled by protoc from proto/tensorboard_event.proto (TensorFlow's field numbers) against
// Debian's libprotobuf-lite into libmg_tensorboard_pb.so (proto/tensorboard_pb.cpp), which is
// dlopened on first use with RTLD_LOCAL | RTLD_DEEPBIND, beside libmegatron_training: Debian's
// libsentencepiece exports a private protobuf 3.14, and both versions in one symbol scope abort.
//
// SummaryWriter queues events for a background thread (at most `queue_size` in flight: add_*
// waits when the queue is full, as torch's EventFileWriter does), which writes them and flushes
// the file every `flush_secs` seconds, on flush() and on close / destruction.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <fstream>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace mg::training::tensorboard {

// CRC32C (Castagnoli) of `data`, continuing from `crc` (0 to start).
uint32_t crc32c(std::string_view data, uint32_t crc = 0);
// TFRecord's masked CRC32C.
uint32_t masked_crc32c(std::string_view data);
// One TFRecord: length, masked CRC of the length, the payload, masked CRC of the payload.
std::string frame_record(std::string_view payload);
// The payloads of a file of TFRecords; throws naming the file and byte offset when a length or CRC
// does not match or the file ends inside a record.
std::vector<std::string> read_records(const std::string& path);

// One decoded event of a file (reader side, for tests and tools).
struct EventRecord {
  double wall_time = 0.0;
  int64_t step = 0;
  std::string file_version;  // the first event only
  struct Value {
    std::string tag;
    bool is_scalar = false;
    float scalar = 0.0f;
    std::string plugin_name;  // "text" for add_text
    std::vector<std::string> strings;
  };
  std::vector<Value> values;
};
std::vector<EventRecord> read_event_file(const std::string& path);

class SummaryWriter {
 public:
  // Creates `log_dir` (and parents) and the event file; throws naming the path when it cannot.
  SummaryWriter(const std::string& log_dir, int64_t queue_size = 1000, double flush_secs = 120.0);
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  void add_text(const std::string& tag, const std::string& text, int64_t step);
  // Waits until every queued event is written and flushed to the file.
  void flush();
  // flush(), then stops the writer thread and closes the file; later add_* throw.
  void close();
  const std::string& path() const { return path_; }

 private:
  void enqueue(std::string serialized_event);
  void run();
  std::string path_;
  std::ofstream file_;
  std::size_t queue_size_;
  double flush_secs_;
  std::mutex mu_;
  std::condition_variable cv_;       // the writer waits for events
  std::condition_variable cv_room_;  // producers wait for room / for a flush to complete
  std::deque<std::string> queue_;
  bool closing_ = false, closed_ = false, flush_requested_ = false;
  int64_t in_progress_ = 0;  // events taken by the writer thread, not yet written
  std::string error_;        // the writer thread's I/O error, rethrown to the producer
  std::thread thread_;
};

}  // namespace mg::training::tensorboard
