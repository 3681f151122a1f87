// fp16 and bf16 storage: conversions to and from fp32, round to nearest
// even (as PyTorch's c10::Half and c10::BFloat16), NaN stays NaN (quiet),
// infinities and subnormals exact where representable. The one copy every
// CPU kernel, the executor, the ONNX importer (fp16 and bf16 constants)
// and the tests use.
#ifndef PEBBLE_GRAPH_HALF_H_
#define PEBBLE_GRAPH_HALF_H_

#include <bit>
#include <cmath>
#include <cstdint>

namespace pebble {

// IEEE binary16 <-> binary32 without F16C, by bit manipulation (the method
// of the FP16 library, github.com/Maratyszcza/FP16:
// fp16_ieee_to_fp32_value / fp16_ieee_from_fp32_value).
inline float HalfToFloat(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const uint32_t exp_offset = 0xE0u << 23;
  const float exp_scale = std::bit_cast<float>(0x7800000u);
  const float normalized = std::bit_cast<float>((two_w >> 4) + exp_offset) * exp_scale;
  const uint32_t magic_mask = 126u << 23;
  const float magic_bias = 0.5f;
  const float denormalized = std::bit_cast<float>((two_w >> 17) | magic_mask) - magic_bias;
  const uint32_t denormalized_cutoff = 1u << 27;
  const uint32_t result =
      sign | (two_w < denormalized_cutoff ? std::bit_cast<uint32_t>(denormalized)
                                          : std::bit_cast<uint32_t>(normalized));
  return std::bit_cast<float>(result);
}

inline uint16_t FloatToHalf(float f) {
  const float scale_to_inf = std::bit_cast<float>(0x77800000u);   // 2^112
  const float scale_to_zero = std::bit_cast<float>(0x08800000u);  // 2^-110
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = std::bit_cast<uint32_t>(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = std::bit_cast<float>((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = std::bit_cast<uint32_t>(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

inline float BFloat16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t FloatToBFloat16(float f) {
  const uint32_t w = std::bit_cast<uint32_t>(f);
  if ((w & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: keep sign and payload, quiet
    return static_cast<uint16_t>((w >> 16) | 0x0040u);
  }
  const uint32_t rounding = 0x7FFFu + ((w >> 16) & 1u);  // to nearest even
  return static_cast<uint16_t>((w + rounding) >> 16);
}

}  // namespace pebble

#endif  // PEBBLE_GRAPH_HALF_H_
