// gg_conv_relu_pool: Conv2D (square kernel, stride 1, no padding) + ReLU + 2x2 max-pool
// (stride 2, floor) as one MXNet CPU operator, forward and backward. Built and loaded by
// gluon_gpu/fused_conv.py through MXNet's extension API (mx.library.load, lib_api.h).
//
// Why: oneDNN runs LeNet's small layers far below the machine's speed (its conv1 on one
// input channel and its training-mode max-pool, which writes a workspace, took 10.6 ms
// per 256 images of a 20 ms step). Here the pool window's four conv outputs are computed
// together, vectorized over output channels, and only their maximum leaves the operator,
// with its position (uint8, second output) for the backward pass.
//
// inputs: data (N,C,H,W), weight (F,C,K,K), bias (F); float32.
// outputs: pooled (N,F,PH,PW) float32, argmax (N,F,PH,PW) uint8 in 0..3.
// attribute data_grad (default 1): 0 skips the data gradient (written as zeros): for a
// network's first layer, whose input is the image batch. Attribute groups (default 1):
// G independent convolutions, as Conv2D(groups=G): data (N,G*C,H,W), weight (G*F,C,K,K).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>
#include "mxnet/lib_api.h"

using namespace mxnet::ext;

namespace {

// One group's sizes (c input and f output channels), and the strides of a whole image
// (xs input, ys output values: all groups' channels).
struct Dims {
  int64_t n, c, h, w, f, k, ph, pw, xs, ys;
};

Dims dims_of(const std::vector<int64_t>& x, const std::vector<int64_t>& w, int64_t groups) {
  Dims d;
  d.n = x[0]; d.c = w[1]; d.h = x[2]; d.w = x[3];
  d.f = w[0] / groups; d.k = w[2];
  d.ph = (d.h - d.k + 1) / 2; d.pw = (d.w - d.k + 1) / 2;
  d.xs = x[1] * d.h * d.w; d.ys = w[0] * d.ph * d.pw;
  return d;
}

// Vectors of output channels: a LeNet layer has 6 (conv1: 8 lanes) or 16 (conv2: 16 lanes).
typedef float v8 __attribute__((vector_size(32)));
typedef float v16 __attribute__((vector_size(64)));
template <int L> struct Vec;
template <> struct Vec<8> { typedef v8 type; };
template <> struct Vec<16> { typedef v16 type; };
template <int L> using vec = typename Vec<L>::type;
constexpr int CB = 8;   // input channels per vector for the data gradient
using vc = v8;

// weights (F, C, K, K) -> [F/FB][C*K*K][FB], zero-padded
template <int FB>
std::vector<vec<FB>> pack_weights(const Dims& d, const float* w) {
  const int64_t fbs = (d.f + FB - 1) / FB, taps = d.c * d.k * d.k;
  std::vector<vec<FB>> out(fbs * taps, vec<FB>{});
  for (int64_t f = 0; f < d.f; ++f)
    for (int64_t t = 0; t < taps; ++t) out[(f / FB) * taps + t][f % FB] = w[f * taps + t];
  return out;
}

template <int FB, int KC>
void forward_impl(const Dims& d, const float* __restrict x, const float* __restrict w,
                  const float* __restrict b, float* __restrict y, uint8_t* __restrict m) {
  using v = vec<FB>;
  const int K = KC ? KC : d.k;
  const int64_t taps = d.c * K * K, fbs = (d.f + FB - 1) / FB, plane = d.ph * d.pw;
  const std::vector<v> packed = pack_weights<FB>(d, w);
  std::vector<v> bias(fbs, v{});
  for (int64_t f = 0; f < d.f; ++f) bias[f / FB][f % FB] = b[f];
  for (int64_t n = 0; n < d.n; ++n) {
    const float* xn = x + n * d.xs;
    for (int64_t fb = 0; fb < fbs; ++fb) {
      const v* wb = packed.data() + fb * taps;
      const int64_t nf = std::min<int64_t>(FB, d.f - fb * FB);
      for (int64_t py = 0; py < d.ph; ++py)
        for (int64_t px = 0; px < d.pw; ++px) {
          v acc0{}, acc1{}, acc2{}, acc3{};   // the pool window's 4 conv outputs
          const float* x00 = xn + (2 * py) * d.w + 2 * px;
          for (int64_t c = 0; c < d.c; ++c)
            for (int kh = 0; kh < K; ++kh)
              for (int kw = 0; kw < K; ++kw) {
                const v wt = wb[(c * K + kh) * K + kw];
                const float* xp = x00 + (c * d.h + kh) * d.w + kw;
                acc0 += xp[0] * wt;
                acc1 += xp[1] * wt;
                acc2 += xp[d.w] * wt;
                acc3 += xp[d.w + 1] * wt;
              }
          // The pool's maximum and its position, branch-free (a data-dependent branch per
          // lane mispredicted half the time and cost more than the convolution). The first
          // maximum wins, in the order (0,0) (0,1) (1,0) (1,1), as in MXNet's pooling.
          const v zero{}, one = zero + 1.f, two = zero + 2.f, three = zero + 3.f;
          v best = acc0, at = zero;
          const auto gt1 = acc1 > best; best = gt1 ? acc1 : best; at = gt1 ? one : at;
          const auto gt2 = acc2 > best; best = gt2 ? acc2 : best; at = gt2 ? two : at;
          const auto gt3 = acc3 > best; best = gt3 ? acc3 : best; at = gt3 ? three : at;
          const v sum = acc0 + acc1 + acc2 + acc3;
          best = sum != sum ? sum : best + bias[fb];          // a NaN stays a NaN
          best = best > 0.f || best != best ? best : zero;    // relu(max) == max(relu)
          for (int64_t l = 0; l < nf; ++l) {
            const int64_t i = n * d.ys + (fb * FB + l) * plane + py * d.pw + px;
            y[i] = best[l];
            m[i] = static_cast<uint8_t>(at[l]);
          }
        }
    }
  }
}

// One kernel row's weight gradient (input channel row ``xr``: the image's row kh of channel
// c) over one image's pool windows, from their routed gradients ``gw`` ([window][position]):
// K accumulators in registers across the windows (KC: K known when compiled), added to dw.
template <int FB, int KC>
inline void weight_row(const Dims& d, int K, const float* __restrict xr, const vec<FB>* __restrict gw,
                       vec<FB>* __restrict dw) {
  using v = vec<FB>;
  constexpr int KA = KC ? KC : 1;
  v acc[KA] = {};
  for (int64_t py = 0; py < d.ph; ++py)
    for (int64_t px = 0; px < d.pw; ++px) {
      const v* g = gw + (py * d.pw + px) * 4;
      const float* xp = xr + 2 * py * d.w + 2 * px;
      const float* xq = xp + d.w;
      if (KC) {
        for (int kw = 0; kw < KA; ++kw)
          acc[kw] += xp[kw] * g[0] + xp[kw + 1] * g[1] + xq[kw] * g[2] + xq[kw + 1] * g[3];
      } else {
        for (int kw = 0; kw < K; ++kw)
          dw[kw] += xp[kw] * g[0] + xp[kw + 1] * g[1] + xq[kw] * g[2] + xq[kw + 1] * g[3];
      }
    }
  if (KC)
    for (int kw = 0; kw < KA; ++kw) dw[kw] += acc[kw];
}

template <int FB, int KC>
void backward_impl(const Dims& d, bool data_grad, const float* __restrict dy,
                   const float* __restrict x, const float* __restrict w,
                   const float* __restrict y, const uint8_t* __restrict m,
                   float* __restrict dx, float* __restrict dw, float* __restrict db) {
  using v = vec<FB>;
  const int K = KC ? KC : d.k;
  const int64_t taps = d.c * K * K, fbs = (d.f + FB - 1) / FB, plane = d.ph * d.pw;
  const int64_t cbs = (d.c + CB - 1) / CB, kk = K * K, hw = d.h * d.w;
  std::vector<v> dwp(fbs * taps, v{});
  // one image's pool gradients routed to their window positions: [window][position 0..3],
  // a vector of the block's output channels; written lane by lane in a pass of their own,
  // so the passes that read them whole never wait on a store
  std::vector<v> gw(plane * 4);
  // for the data gradient: weights as [C/CB][F][K*K][CB], one image's gradient as [C/CB][H*W][CB]
  std::vector<vc> wc, dxt;
  if (data_grad) {
    wc.assign(cbs * d.f * kk, vc{});
    for (int64_t f = 0; f < d.f; ++f)
      for (int64_t c = 0; c < d.c; ++c)
        for (int64_t t = 0; t < kk; ++t) wc[((c / CB) * d.f + f) * kk + t][c % CB] = w[(f * d.c + c) * kk + t];
    dxt.resize(cbs * hw);
  }
  std::vector<v> dbp(fbs, v{});
  for (int64_t n = 0; n < d.n; ++n) {
    const float* xn = x + n * d.xs;
    if (data_grad) std::fill(dxt.begin(), dxt.end(), vc{});
    for (int64_t fb = 0; fb < fbs; ++fb) {
      const int64_t nf = std::min<int64_t>(FB, d.f - fb * FB);
      // the pool's gradient, routed to its maximum where the relu passed it (branch-free:
      // the relu passes half the time)
      std::fill(gw.begin(), gw.end(), v{});
      for (int64_t l = 0; l < nf; ++l) {
        const int64_t first = n * d.ys + (fb * FB + l) * plane;
        float bias = 0.f;
        for (int64_t j = 0; j < plane; ++j) {
          const float gv = y[first + j] > 0.f ? dy[first + j] : 0.f;
          gw[j * 4 + m[first + j]][l] = gv;
          bias += gv;
        }
        dbp[fb][l] += bias;
      }
      v* dwb = dwp.data() + fb * taps;
      for (int64_t c = 0; c < d.c; ++c)
        for (int kh = 0; kh < K; ++kh)
          weight_row<FB, KC>(d, K, xn + (c * d.h + kh) * d.w, gw.data(), dwb + (c * K + kh) * K);
      if (!data_grad) continue;
      const int64_t offs[4] = {0, 1, d.w, d.w + 1};
      for (int64_t py = 0; py < d.ph; ++py)
        for (int64_t px = 0; px < d.pw; ++px) {
          const int64_t x00 = (2 * py) * d.w + 2 * px, j = py * d.pw + px;
          for (int64_t l = 0; l < nf; ++l) {  // each channel's one window position; no branch
            const int64_t i = n * d.ys + (fb * FB + l) * plane + j;
            const float gv = gw[j * 4 + m[i]][l];
            const int64_t f = fb * FB + l, at = x00 + offs[m[i]];
            for (int64_t cb = 0; cb < cbs; ++cb) {
              const vc* wt = wc.data() + (cb * d.f + f) * kk;
              vc* dxp = dxt.data() + cb * hw + at;
              for (int kh = 0; kh < K; ++kh)
                for (int kw = 0; kw < K; ++kw) dxp[kh * d.w + kw] += gv * wt[kh * K + kw];
            }
          }
        }
    }
    if (data_grad) {
      float* dxn = dx + n * d.xs;
      for (int64_t c = 0; c < d.c; ++c)
        for (int64_t p = 0; p < hw; ++p) dxn[c * hw + p] = dxt[(c / CB) * hw + p][c % CB];
    }
  }
  for (int64_t f = 0; f < d.f; ++f)
    for (int64_t t = 0; t < taps; ++t) dw[f * taps + t] = dwp[(f / FB) * taps + t][f % FB];
  for (int64_t f = 0; f < d.f; ++f) db[f] = dbp[f / FB][f % FB];
}

bool flag(const std::unordered_map<std::string, std::string>& attrs, const char* name) {
  auto it = attrs.find(name);
  return it == attrs.end() || (it->second != "0" && it->second != "False" && it->second != "false");
}

int64_t groups_of(const std::unordered_map<std::string, std::string>& attrs) {
  auto it = attrs.find("groups");
  return it == attrs.end() ? 1 : std::stoll(it->second);
}

// Each group is an independent conv+relu+pool (an ensemble's members): run one by one.
MXReturnValue forward(const std::unordered_map<std::string, std::string>& attrs,
                      std::vector<MXTensor>* in, std::vector<MXTensor>* out,
                      const OpResource&) {
  const int64_t groups = groups_of(attrs);
  const Dims d = dims_of((*in)[0].shape, (*in)[1].shape, groups);
  const int64_t taps = d.c * d.k * d.k, plane = d.ph * d.pw, hw = d.h * d.w;
  for (int64_t g = 0; g < groups; ++g) {
    auto args = std::make_tuple(d, (*in)[0].data<float>() + g * d.c * hw,
                                (*in)[1].data<float>() + g * d.f * taps, (*in)[2].data<float>() + g * d.f,
                                (*out)[0].data<float>() + g * d.f * plane,
                                (*out)[1].data<uint8_t>() + g * d.f * plane);
    if (d.k == 5 && d.f <= 8) std::apply(forward_impl<8, 5>, args);        // LeNet conv1
    else if (d.k == 3 && d.f == 16) std::apply(forward_impl<16, 3>, args); // LeNet conv2
    else std::apply(forward_impl<16, 0>, args);
  }
  return MX_SUCCESS;
}

// inputs: dY, dM (unused), X, W, B, Y, M; outputs: dX, dW, dB
MXReturnValue backward(const std::unordered_map<std::string, std::string>& attrs,
                       std::vector<MXTensor>* in, std::vector<MXTensor>* out,
                       const OpResource&) {
  const int64_t groups = groups_of(attrs);
  const bool data_grad = flag(attrs, "data_grad");
  const Dims d = dims_of((*in)[2].shape, (*in)[3].shape, groups);
  const int64_t taps = d.c * d.k * d.k, plane = d.ph * d.pw, hw = d.h * d.w;
  if (!data_grad) std::memset((*out)[0].data<float>(), 0, sizeof(float) * d.n * d.xs);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t ys = g * d.f * plane;
    auto args = std::make_tuple(d, data_grad, (*in)[0].data<float>() + ys,
                                (*in)[2].data<float>() + g * d.c * hw, (*in)[3].data<float>() + g * d.f * taps,
                                (*in)[5].data<float>() + ys, (*in)[6].data<uint8_t>() + ys,
                                (*out)[0].data<float>() + g * d.c * hw, (*out)[1].data<float>() + g * d.f * taps,
                                (*out)[2].data<float>() + g * d.f);
    if (d.k == 5 && d.f <= 8) std::apply(backward_impl<8, 5>, args);
    else if (d.k == 3 && d.f == 16) std::apply(backward_impl<16, 3>, args);
    else std::apply(backward_impl<16, 0>, args);
  }
  return MX_SUCCESS;
}

MXReturnValue parse_attrs(const std::unordered_map<std::string, std::string>&,
                          int* num_in, int* num_out) {
  *num_in = 3;
  *num_out = 2;
  return MX_SUCCESS;
}

MXReturnValue infer_type(const std::unordered_map<std::string, std::string>&,
                         std::vector<int>* in_types, std::vector<int>* out_types) {
  for (int t : *in_types)
    if (t != kFloat32) {
      MX_ERROR_MSG << "gg_conv_relu_pool supports float32 only";
      return MX_FAIL;
    }
  (*out_types)[0] = kFloat32;
  (*out_types)[1] = kUint8;
  return MX_SUCCESS;
}

MXReturnValue infer_shape(const std::unordered_map<std::string, std::string>& attrs,
                          std::vector<std::vector<unsigned int>>* in_shapes,
                          std::vector<std::vector<unsigned int>>* out_shapes) {
  const auto& x = (*in_shapes)[0];
  const auto& w = (*in_shapes)[1];
  const auto& b = (*in_shapes)[2];
  const int64_t groups = groups_of(attrs);
  if (x.size() != 4 || w.size() != 4 || b.size() != 1 || groups < 1 || w[1] * groups != x[1] ||
      w[0] % groups != 0 || w[2] != w[3] || b[0] != w[0] || x[2] < w[2] + 1 || x[3] < w[3] + 1) {
    MX_ERROR_MSG << "gg_conv_relu_pool: expected data (N,G*C,H,W), weight (G*F,C,K,K), bias (G*F) "
                 << "for groups=G, H and W > K";
    return MX_FAIL;
  }
  const unsigned ph = (x[2] - w[2] + 1) / 2, pw = (x[3] - w[3] + 1) / 2;
  (*out_shapes)[0] = {x[0], w[0], ph, pw};
  (*out_shapes)[1] = {x[0], w[0], ph, pw};
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(gg_conv_relu_pool)
.setParseAttrs(parse_attrs)
.setInferType(infer_type)
.setInferShape(infer_shape)
.setForward(forward, "cpu")
.setBackward(backward, "cpu");

MXReturnValue initialize(int version) {
  return version >= 10900 ? MX_SUCCESS : MX_FAIL;
}
