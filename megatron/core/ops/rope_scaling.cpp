// RoPE frequency scaling: see rope_scaling.h.
#include "megatron/core/ops/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "megatron/core/common/error.h"

namespace mg::ops {

namespace {

// YaRN: the (fractional) dimension whose wavelength turns `rotations` times over the original
// context.
double yarn_correction_dim(double rotations, int64_t dim, double base, double max_pos) {
  return static_cast<double>(dim) * std::log(max_pos / (rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(base));
}

double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

std::string to_string(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::none:
      return "none";
    case RopeScalingType::linear:
      return "linear";
    case RopeScalingType::llama3:
      return "llama3";
    case RopeScalingType::yarn:
      return "yarn";
  }
  return "?";
}

void validate_rope_scaling(const RopeScaling& s, const std::string& where) {
  if (s.type == RopeScalingType::none) return;
  MG_CHECK(std::isfinite(s.factor) && s.factor > 0.0, where << ": " << to_string(s.type)
                                                            << " RoPE scaling factor " << s.factor
                                                            << " must be > 0");
  if (s.type == RopeScalingType::llama3) {
    MG_CHECK(s.low_freq_factor > 0.0 && s.high_freq_factor > s.low_freq_factor,
             where << ": llama3 RoPE scaling needs 0 < low_freq_factor (" << s.low_freq_factor
                   << ") < high_freq_factor (" << s.high_freq_factor << ")");
    MG_CHECK(s.original_max_position_embeddings > 0,
             where << ": llama3 RoPE scaling original_max_position_embeddings "
                   << s.original_max_position_embeddings << " must be > 0");
  }
  if (s.type == RopeScalingType::yarn) {
    MG_CHECK(s.original_max_position_embeddings > 0,
             where << ": YaRN original_max_position_embeddings "
                   << s.original_max_position_embeddings << " must be > 0");
    MG_CHECK(s.beta_fast > 0.0 && s.beta_slow > 0.0, where << ": YaRN beta_fast " << s.beta_fast
                                                           << " and beta_slow " << s.beta_slow
                                                           << " must be > 0");
  }
}

std::vector<double> rope_inv_freq(double base, int64_t rot, const RopeScaling& s) {
  const int64_t half = rot / 2;
  std::vector<double> inv(static_cast<std::size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv[i] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rot));
  switch (s.type) {
    case RopeScalingType::none:
      break;
    case RopeScalingType::linear:
      for (double& f : inv) f /= s.factor;
      break;
    case RopeScalingType::llama3: {
      const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
      const double low_wavelen = old_ctx / s.low_freq_factor;
      const double high_wavelen = old_ctx / s.high_freq_factor;
      for (double& f : inv) {
        const double wavelen = 2.0 * std::numbers::pi / f;
        // Low frequencies interpolated, high ones kept, the band between blended.
        if (wavelen > low_wavelen) {
          f /= s.factor;
        } else if (!(wavelen < high_wavelen)) {
          const double smooth =
              (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
          f = (1.0 - smooth) * f / s.factor + smooth * f;
        }
      }
      break;
    }
    case RopeScalingType::yarn: {
      const double max_pos = static_cast<double>(s.original_max_position_embeddings);
      double low = yarn_correction_dim(s.beta_fast, rot, base, max_pos);
      double high = yarn_correction_dim(s.beta_slow, rot, base, max_pos);
      if (s.correction_range_round_to_int) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(rot - 1));
      if (low == high) high += 0.001;  // no division by zero
      for (int64_t i = 0; i < half; ++i) {
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation = 1.0 - ramp;  // share of the unscaled frequency
        inv[i] = inv[i] / s.factor * (1.0 - extrapolation) + inv[i] * extrapolation;
      }
      break;
    }
  }
  return inv;
}

RopeScaling rope_scaling_from_hf(const nlohmann::json& rope, int64_t max_position_embeddings,
                                 const std::string& where) {
  auto number = [&rope](const char* key, double dflt) {
    return rope.contains(key) && !rope[key].is_null() ? rope[key].get<double>() : dflt;
  };
  auto need = [&rope, &where](const char* key, const std::string& type) {
    MG_CHECK(rope.contains(key) && rope[key].is_number(),
             where << ": rope_type '" << type << "' has no \"" << key << "\"");
    return rope[key].get<double>();
  };
  RopeScaling s;
  const std::string type = rope.value("rope_type", rope.value("type", std::string("default")));
  if (type == "default") return s;
  // yarn without a factor: max positions / the original context (transformers' rule).
  if (type == "yarn" && !(rope.contains("factor") && rope["factor"].is_number()))
    s.factor =
        static_cast<double>(max_position_embeddings) /
        number("original_max_position_embeddings", static_cast<double>(max_position_embeddings));
  else
    s.factor = need("factor", type);
  if (type == "linear") {
    s.type = RopeScalingType::linear;
  } else if (type == "llama3") {
    s.type = RopeScalingType::llama3;
    s.low_freq_factor = need("low_freq_factor", type);
    s.high_freq_factor = need("high_freq_factor", type);
    s.original_max_position_embeddings =
        static_cast<int64_t>(need("original_max_position_embeddings", type));
  } else if (type == "yarn") {
    s.type = RopeScalingType::yarn;
    s.original_max_position_embeddings =
        rope.contains("original_max_position_embeddings") &&
                !rope["original_max_position_embeddings"].is_null()
            ? rope["original_max_position_embeddings"].get<int64_t>()
            : max_position_embeddings;
    s.beta_fast = number("beta_fast", 0.0) != 0.0 ? number("beta_fast", 0.0) : 32.0;
    s.beta_slow = number("beta_slow", 0.0) != 0.0 ? number("beta_slow", 0.0) : 1.0;
    s.correction_range_round_to_int = rope.value("truncate", true);
    const double ms = number("mscale", 0.0), msa = number("mscale_all_dim", 0.0);
    if (ms != 0.0 && msa != 0.0) {
      s.mscale = ms;
      s.mscale_all_dim = msa;
    }
    if (rope.contains("attention_factor") && !rope["attention_factor"].is_null()) {
      const double af = rope["attention_factor"].get<double>();
      MG_CHECK(std::abs(af - rope_attention_scaling(s)) < 1e-12,
               where << ": yarn attention_factor " << af << " differs from YaRN's mscale rule ("
                     << rope_attention_scaling(s) << "); not supported");
    }
  } else {
    MG_THROW(where << ": rope_type '" << type
                   << "' (RoPE scaling) is not supported (default, linear, llama3, yarn)");
  }
  validate_rope_scaling(s, where);
  return s;
}

double rope_attention_scaling(const RopeScaling& s) {
  if (s.type != RopeScalingType::yarn) return 1.0;
  return yarn_get_mscale(s.factor, s.mscale) / yarn_get_mscale(s.factor, s.mscale_all_dim);
}

}  // namespace mg::ops
