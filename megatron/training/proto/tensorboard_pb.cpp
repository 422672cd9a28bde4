// The protobuf half of tensorboard.cpp, built as its own module (libmg_tensorboard_pb.so) and
// loaded with dlopen(RTLD_LOCAL | RTLD_DEEPBIND) only when TensorBoard is used: Debian's
// libsentencepiece exports a private copy of protobuf 3.14's symbols, which would clash with
// libprotobuf-lite 3.21 in one symbol scope (the runtime aborts on the version check). A plain C
// interface, so that no C++ type crosses the boundary.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tensorboard_event.pb.h"

namespace {

using mg::tensorboard_pb::Event;

int to_buffer(const Event& e, char** out, std::size_t* out_len) {
  std::string s;
  if (!e.SerializeToString(&s)) return 1;
  *out = static_cast<char*>(std::malloc(s.size() + 1));
  if (!*out) return 1;
  std::memcpy(*out, s.data(), s.size());
  *out_len = s.size();
  return 0;
}

}  // namespace

extern "C" {

// kind 0: file_version = text; 1: scalar (tag, value); 2: text (tag, text). The buffer is
// malloc'd (free with mg_tb_free). Returns 0 on success.
__attribute__((visibility("default"))) int mg_tb_serialize_event(double wall_time, int64_t step,
                                                                 int kind, const char* tag,
                                                                 double value, const char* text,
                                                                 std::size_t text_len, char** out,
                                                                 std::size_t* out_len) {
  Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  if (kind == 0) {
    e.set_file_version(std::string(text, text_len));
  } else {
    auto* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    if (kind == 1) {
      v->set_simple_value(static_cast<float>(value));
    } else {
      v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
      auto* t = v->mutable_tensor();
      t->set_dtype(mg::tensorboard_pb::DT_STRING);
      t->mutable_tensor_shape()->add_dim()->set_size(1);
      t->add_string_val(std::string(text, text_len));
    }
  }
  return to_buffer(e, out, out_len);
}

__attribute__((visibility("default"))) void mg_tb_free(char* p) {
  std::free(p);
}

// Parses one Event; calls on_value for every Summary value (string: the first string_val of a
// tensor, else empty). Returns 0 on success, 1 when the bytes are not an Event.
typedef void (*mg_tb_value_fn)(void* ctx, const char* tag, int is_scalar, float scalar,
                               const char* plugin, const char* str, std::size_t str_len,
                               int n_strings);
__attribute__((visibility("default"))) int mg_tb_parse_event(const char* data, std::size_t len,
                                                             double* wall_time, int64_t* step,
                                                             char** file_version,
                                                             std::size_t* file_version_len,
                                                             mg_tb_value_fn on_value, void* ctx) {
  Event e;
  if (!e.ParseFromArray(data, static_cast<int>(len))) return 1;
  *wall_time = e.wall_time();
  *step = e.step();
  *file_version = nullptr;
  *file_version_len = 0;
  if (e.has_file_version()) {
    const std::string& f = e.file_version();
    *file_version = static_cast<char*>(std::malloc(f.size() + 1));
    if (!*file_version) return 1;
    std::memcpy(*file_version, f.data(), f.size());
    *file_version_len = f.size();
  }
  if (e.has_summary())
    for (const auto& v : e.summary().value()) {
      const bool has_str = v.has_tensor() && v.tensor().string_val_size() > 0;
      const std::string empty;
      const std::string& s = has_str ? v.tensor().string_val(0) : empty;
      on_value(ctx, v.tag().c_str(), v.has_simple_value() ? 1 : 0, v.simple_value(),
               v.metadata().plugin_data().plugin_name().c_str(), s.data(), s.size(),
               v.has_tensor() ? v.tensor().string_val_size() : 0);
    }
  return 0;
}

}  // extern "C"
