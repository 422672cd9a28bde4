// The backend-independent part of the checkpoint storage interface (storage.h): whole-object
// helpers written over the primitives, path joining and the factory from a path or URL.
#include "megatron/core/dist_checkpointing/storage.h"

#include "megatron/core/common/error.h"

namespace mg::dist_checkpointing {

std::string Storage::read_object(const std::string& name) const {
  const std::size_t n = size(name);
  std::string out(n, '\0');
  if (n > 0) read_range(name, 0, n, out.data());
  return out;
}

void Storage::write_object(const std::string& name,
                           const std::vector<std::span<const std::byte>>& buffers) {
  auto w = open_writer(name);
  for (const auto& b : buffers)
    if (!b.empty()) w->write(b.data(), b.size());
  w->commit();
}

void Storage::write_object(const std::string& name, const std::string& text) {
  write_object(name, {std::as_bytes(std::span<const char>(text.data(), text.size()))});
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::shared_ptr<Storage> storage_for(const std::string& path_or_url) {
  const auto scheme = path_or_url.find("://");
  if (scheme != std::string::npos) {
    const std::string s = path_or_url.substr(0, scheme);
    MG_CHECK(s != "msc", "checkpoint location '"
                             << path_or_url
                             << "': object storage (Megatron's MSC, msc://profile/path) is not "
                                "built yet; only local filesystem paths are supported");
    MG_THROW("checkpoint location '" << path_or_url << "': unknown storage scheme '" << s
                                     << "://' (only local filesystem paths are supported)");
  }
  return local_storage();
}

}  // namespace mg::dist_checkpointing
