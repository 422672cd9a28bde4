// Checkpoint storage (PyTorch DCP's StorageWriter/StorageReader idea): every byte a checkpoint
// format reads or writes goes through a Storage, so a new backend (object storage, Megatron's MSC
// `msc://profile/path`) is a new implementation of this interface and never touches format code.
//
// Names are paths or URLs: a Storage takes the full name of each object ("<root>/iter_0000100/
// rank_00000.safetensors"); join_path() builds them. A "directory" is a prefix of names.
// What a Storage guarantees:
//   - write_object / ObjectWriter::commit: the object appears under its name complete and durable
//     (fsync), or not at all; a writer destroyed without commit() leaves nothing under the name.
//   - begin_staging / commit_staging: the objects written under a staged directory become visible
//     under the final directory all at once (a rename on a filesystem, a manifest on object
//     storage); a staged directory never committed is never seen under the final name. Committing
//     over an existing final directory replaces it.
//   - replace: a small object (the tracker file) is replaced atomically and durably.
//   - reads: a missing object, or a range past its end, is an error naming the object and sizes.
// Local filesystem: local_storage.cpp (the only file with POSIX/std::filesystem calls for
// checkpoints). Object storage: not built yet (storage_for("msc://...") says so).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace mg::dist_checkpointing {

// An object's bytes mapped for reading (mmap locally); valid while this lives.
class MappedObject {
 public:
  virtual ~MappedObject() = default;
  virtual const std::string& name() const = 0;
  virtual std::span<const std::byte> bytes() const = 0;
  // Asks for bytes [offset, offset + size) to be read ahead (a hint; errors ignored).
  virtual void prefetch(std::size_t offset, std::size_t size) const = 0;
};

// A streamed write of one object: write() the bytes in order, then commit().
class ObjectWriter {
 public:
  virtual ~ObjectWriter() = default;  // without commit(): the partial object is discarded
  virtual void write(const void* data, std::size_t size) = 0;
  // Makes the object durable (fsync) and visible under its name, atomically.
  virtual void commit() = 0;
};

class Storage {
 public:
  virtual ~Storage() = default;

  // ---- reading
  // Whether an object or a directory (a non-empty prefix) exists under `name`.
  virtual bool exists(const std::string& name) const = 0;
  virtual bool is_directory(const std::string& name) const = 0;
  // The entries directly under directory `dir` (names relative to it, sorted); empty when absent.
  virtual std::vector<std::string> list(const std::string& dir) const = 0;
  virtual std::size_t size(const std::string& name) const = 0;
  // Copies bytes [offset, offset + size) of the object into `dst`; a short read is an error.
  virtual void read_range(const std::string& name, std::size_t offset, std::size_t size,
                          void* dst) const = 0;
  // The whole object (small objects: metadata.json, the tracker).
  std::string read_object(const std::string& name) const;
  virtual std::unique_ptr<MappedObject> map(const std::string& name) const = 0;

  // ---- writing (directories need not exist: a write creates the parents of its name)
  virtual std::unique_ptr<ObjectWriter> open_writer(const std::string& name) = 0;
  // Writes the concatenation of `buffers` as one object (durable, atomic; see the file comment).
  void write_object(const std::string& name,
                    const std::vector<std::span<const std::byte>>& buffers);
  void write_object(const std::string& name, const std::string& text);
  // Replaces a small object atomically and durably (the tracker file).
  virtual void replace(const std::string& name, const std::string& text) = 0;
  // Removes an object or a whole directory; absent is not an error.
  virtual void remove(const std::string& name) = 0;

  // ---- staged (atomically committed) directories
  // A tag telling this process's staged directories from other processes' (locally: the pid).
  virtual std::string process_tag() const = 0;
  // The name of the staged directory of `final_dir` for `tag` (every rank computes it).
  virtual std::string staged_name(const std::string& final_dir, const std::string& tag) const = 0;
  // Prepares an empty staged directory for `final_dir` (its parent created, a stale staged
  // directory of the same tag removed) and returns its name; `tag` tells concurrent savers apart.
  virtual std::string begin_staging(const std::string& final_dir, const std::string& tag) = 0;
  // Makes everything written under `staged` visible as `final_dir` at once, replacing an existing
  // `final_dir`; durable when it returns.
  virtual void commit_staging(const std::string& staged, const std::string& final_dir) = 0;
};

// "a" + "/" + "b" (no doubled separator; `b` relative).
std::string join_path(const std::string& dir, const std::string& name);

// The storage holding `path_or_url`: the local filesystem for a path; `msc://...` is an error
// (object storage is not built yet).
std::shared_ptr<Storage> storage_for(const std::string& path_or_url);

// The local-filesystem storage (local_storage.cpp).
std::shared_ptr<Storage> local_storage();

}  // namespace mg::dist_checkpointing
