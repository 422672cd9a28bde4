#include "megatron/core/tensor/device.h"

namespace mg {

std::string_view device_type_name(DeviceType t) {
  switch (t) {
    case DeviceType::cpu:
      return "cpu";
    case DeviceType::cuda:
      return "cuda";
    case DeviceType::musa:
      return "musa";
    case DeviceType::txda:
      return "txda";
  }
  return "invalid";
}

std::string Device::str() const {
  if (type == DeviceType::cpu) return "cpu";
  return std::string(device_type_name(type)) + ":" + std::to_string(index);
}

}  // namespace mg
