// gg_gather_map: the on-device augmentation's geometric step (gluon_gpu/data/augment.py)
// as one MXNet CPU operator, built into the same library as gg_conv_relu_pool.
//
// Why: as a graph of MXNet operators (index planes, a float take, an outside mask, the
// cast of the stored uint8 images) it cost 1.3 ms of a 6.8 ms LeNet step on one context
// (256 images): five passes over the batch. Here it is one.
//
// inputs: data (N,C,H,W) uint8 or float32 (images as stored); map (N,6) float32: output
// pixel (row i, column j) reads source column a j + b i + c and row d j + e i + f (rounded
// to the nearest pixel, halves away from zero, with attribute rounded=1: a rotation).
// output: (N,C,H,W) float32; a source outside the image reads 0. Its gradients are zero
// (its inputs are the image batch and per-sample draws; MXNet's graphs ask for one).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>
#include "mxnet/lib_api.h"

using namespace mxnet::ext;

namespace {

template <typename T>
void gather(const T* __restrict x, const float* __restrict map, float* __restrict y, int64_t n, int64_t c,
            int64_t h, int64_t w, bool rounded) {
  for (int64_t s = 0; s < n; ++s) {
    const float* m = map + s * 6;
    const float a = m[0], b = m[1], cc = m[2], d = m[3], e = m[4], f = m[5];
    for (int64_t i = 0; i < h; ++i)
      for (int64_t j = 0; j < w; ++j) {
        // as the graph computes them: (j a + c) + i b, (i e + f) + j d, in float32
        float col = static_cast<float>(j) * a + cc;
        float row = static_cast<float>(i) * e + f;
        if (rounded) {
          col = std::round(col + static_cast<float>(i) * b);
          row = std::round(row + static_cast<float>(j) * d);
        }
        const bool inside = col >= 0.f && col <= static_cast<float>(w - 1) && row >= 0.f &&
                            row <= static_cast<float>(h - 1);
        const int64_t at = inside ? static_cast<int64_t>(row) * w + static_cast<int64_t>(col) : 0;
        for (int64_t k = 0; k < c; ++k) {
          const int64_t plane = (s * c + k) * h * w;
          y[plane + i * w + j] = inside ? static_cast<float>(x[plane + at]) : 0.f;
        }
      }
  }
}

bool rounded_of(const std::unordered_map<std::string, std::string>& attrs) {
  auto it = attrs.find("rounded");
  return it != attrs.end() && it->second != "0" && it->second != "False" && it->second != "false";
}

MXReturnValue forward(const std::unordered_map<std::string, std::string>& attrs,
                      std::vector<MXTensor>* in, std::vector<MXTensor>* out, const OpResource&) {
  const auto& s = (*in)[0].shape;
  const bool rounded = rounded_of(attrs);
  const float* map = (*in)[1].data<float>();
  float* y = (*out)[0].data<float>();
  if ((*in)[0].dtype == kUint8)
    gather((*in)[0].data<uint8_t>(), map, y, s[0], s[1], s[2], s[3], rounded);
  else
    gather((*in)[0].data<float>(), map, y, s[0], s[1], s[2], s[3], rounded);
  return MX_SUCCESS;
}

// inputs: dY, X, map; outputs: dX, dMap
MXReturnValue backward(const std::unordered_map<std::string, std::string>&,
                       std::vector<MXTensor>* in, std::vector<MXTensor>* out, const OpResource&) {
  for (auto& grad : *out) {
    int64_t elements = 1;
    for (int64_t d : grad.shape) elements *= d;
    std::memset(grad.data_ptr, 0, elements * (grad.dtype == kUint8 ? 1 : 4));
  }
  return MX_SUCCESS;
}

MXReturnValue parse_attrs(const std::unordered_map<std::string, std::string>&, int* num_in, int* num_out) {
  *num_in = 2;
  *num_out = 1;
  return MX_SUCCESS;
}

MXReturnValue infer_type(const std::unordered_map<std::string, std::string>&,
                         std::vector<int>* in_types, std::vector<int>* out_types) {
  if (((*in_types)[0] != kUint8 && (*in_types)[0] != kFloat32) || (*in_types)[1] != kFloat32) {
    MX_ERROR_MSG << "gg_gather_map: data uint8 or float32, map float32";
    return MX_FAIL;
  }
  (*out_types)[0] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue infer_shape(const std::unordered_map<std::string, std::string>&,
                          std::vector<std::vector<unsigned int>>* in_shapes,
                          std::vector<std::vector<unsigned int>>* out_shapes) {
  const auto& x = (*in_shapes)[0];
  const auto& m = (*in_shapes)[1];
  if (x.size() != 4 || m.size() != 2 || m[0] != x[0] || m[1] != 6) {
    MX_ERROR_MSG << "gg_gather_map: expected data (N,C,H,W) and map (N,6)";
    return MX_FAIL;
  }
  (*out_shapes)[0] = x;
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(gg_gather_map)
.setParseAttrs(parse_attrs)
.setInferType(infer_type)
.setInferShape(infer_shape)
.setForward(forward, "cpu")
.setBackward(backward, "cpu");
