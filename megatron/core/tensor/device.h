// Where a tensor lives: a device type (one per platform family) and an index on that platform.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace mg {

// One value per platform name that Megatron-CPP knows. MUSA and TXDA exist so that a plugin can
// provide them; no build here does.
enum class DeviceType : uint8_t { cpu, cuda, musa, txda };

std::string_view device_type_name(DeviceType t);  // "cpu", "cuda", "musa", "txda"

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static constexpr Device cpu() { return {DeviceType::cpu, 0}; }
  static constexpr Device cuda(int i = 0) { return {DeviceType::cuda, i}; }
  bool is_host() const { return type == DeviceType::cpu; }
  friend bool operator==(const Device&, const Device&) = default;
  std::string str() const;  // "cpu", "cuda:0"
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) {
  return os << d.str();
}

}  // namespace mg
