// A chain of convolutions, BatchNorms and residual adds (a CIFAR ResNet v1's features),
// forward and backward, on oneDNN 3 (AMX kernels where the CPU has them) in bfloat16.
// The activations stay in the layouts oneDNN picks from the first layer to the last:
// MXNet's float32 NCHW arrays are read and written at the two ends only, the float32
// weights are the master copy (cast at each use) and their gradients are float32.
// Why a chain and not one operator per layer: converting between MXNet's float32 NCHW
// and oneDNN's bfloat16 blocked layouts around every convolution took 59% of the time
// and left 1.4x of AMX's 3.4x (docs/maintainers/measurements.md).
//
// The program (ints): CONV in out weight oc kernel stride pad | BN in out gamma beta
// aux relu (aux: running mean at aux, variance at aux + 1) | ADD_RELU a out b.
// Slot 0 is the input. act: bfloat16, or float32 to compare with MXNet exactly.
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <string>
#include <vector>

using namespace dnnl;
using dt = memory::data_type;
using tag = memory::format_tag;

#define EXPORT __attribute__((visibility("default")))

namespace {
engine &cpu() { static engine e(engine::kind::cpu, 0); return e; }
const float kEps = 1e-5f, kMomentum = 0.9f;
dt act = dt::bf16;  // set by gg_amx_net_create
enum Kind { CONV = 1, BN = 2, ADD_RELU = 3 };

struct Op {
  int kind, in, in2, out, param, param2, aux, relu;
  int oc, k, stride, pad;
  // convolution
  convolution_forward::primitive_desc fwd_pd;
  convolution_backward_data::primitive_desc bwd_d_pd;
  convolution_backward_weights::primitive_desc bwd_w_pd;
  memory::desc wei_user;
  memory src_used;  // what the forward read (a reorder of the slot, if its layout differs)
  // batch norm
  batch_normalization_forward::primitive_desc bn_pd;
  batch_normalization_backward::primitive_desc bn_bwd_pd;
  memory mean, var, workspace;
  // add + relu
  binary::primitive_desc add_pd;
  eltwise_backward::primitive_desc relu_bwd_pd;
};

struct Net {
  bool training;
  std::vector<Op> ops;
  std::vector<memory::desc> desc;  // each slot's layout
  std::vector<memory> value, grad;
  std::vector<bool> has_grad;
  memory::desc in_user, out_user;
  stream st{cpu()};
};

memory::dims dims_of(const memory::desc &d) { return d.get_dims(); }

void build(Net &net, const std::vector<int> &prog, const int *in_dims) {
  memory::dims x{in_dims[0], in_dims[1], in_dims[2], in_dims[3]};
  net.in_user = memory::desc(x, dt::f32, tag::nchw);
  net.desc.assign(1, memory::desc(x, act, tag::any));
  auto slot = [&](int i) -> memory::desc & {
    if ((int)net.desc.size() <= i) net.desc.resize(i + 1);
    return net.desc[i];
  };
  prop_kind pk = net.training ? prop_kind::forward_training : prop_kind::forward_inference;
  for (size_t p = 0; p < prog.size();) {
    Op op{};
    op.kind = prog[p];
    if (op.kind == CONV) {
      op.in = prog[p + 1]; op.out = prog[p + 2]; op.param = prog[p + 3]; op.oc = prog[p + 4];
      op.k = prog[p + 5]; op.stride = prog[p + 6]; op.pad = prog[p + 7];
      p += 8;
      memory::dims src = dims_of(slot(op.in));
      int oh = (src[2] + 2 * op.pad - op.k) / op.stride + 1, ow = (src[3] + 2 * op.pad - op.k) / op.stride + 1;
      memory::dims wd{op.oc, src[1], op.k, op.k}, dd{src[0], op.oc, oh, ow};
      memory::dims s{op.stride, op.stride}, pad{op.pad, op.pad}, dil{0, 0};
      auto any_src = memory::desc(src, act, tag::any), any_dst = memory::desc(dd, act, tag::any);
      auto any_w = memory::desc(wd, act, tag::any);
      op.wei_user = memory::desc(wd, dt::f32, tag::oihw);
      op.fwd_pd = convolution_forward::primitive_desc(cpu(), pk, algorithm::convolution_direct, any_src, any_w,
                                                      any_dst, s, dil, pad, pad);
      if (net.training) {
        op.bwd_d_pd = convolution_backward_data::primitive_desc(cpu(), algorithm::convolution_direct, any_src, any_w,
                                                                op.fwd_pd.dst_desc(), s, dil, pad, pad, op.fwd_pd);
        op.bwd_w_pd = convolution_backward_weights::primitive_desc(
            cpu(), algorithm::convolution_direct, op.fwd_pd.src_desc(), memory::desc(wd, dt::f32, tag::any),
            op.fwd_pd.dst_desc(), s, dil, pad, pad, op.fwd_pd);
      }
      if (op.in == 0 && net.desc[0].get_format_kind() == memory::format_kind::any) net.desc[0] = op.fwd_pd.src_desc();
      slot(op.out) = op.fwd_pd.dst_desc();
    } else if (op.kind == BN) {
      op.in = prog[p + 1]; op.out = prog[p + 2]; op.param = prog[p + 3]; op.param2 = prog[p + 4];
      op.aux = prog[p + 5]; op.relu = prog[p + 6];
      p += 7;
      memory::desc d = slot(op.in);
      auto flags = normalization_flags::use_scale | normalization_flags::use_shift;
      if (!net.training) flags |= normalization_flags::use_global_stats;
      if (op.relu) flags |= normalization_flags::fuse_norm_relu;
      op.bn_pd = batch_normalization_forward::primitive_desc(cpu(), pk, d, d, kEps, flags);
      if (net.training) {
        op.bn_bwd_pd = batch_normalization_backward::primitive_desc(cpu(), prop_kind::backward, d, d, d, kEps, flags,
                                                                    op.bn_pd);
        op.mean = memory(op.bn_pd.mean_desc(), cpu());
        op.var = memory(op.bn_pd.variance_desc(), cpu());
        if (op.relu) op.workspace = memory(op.bn_pd.workspace_desc(), cpu());
      }
      slot(op.out) = d;
    } else if (op.kind == ADD_RELU) {
      op.in = prog[p + 1]; op.out = prog[p + 2]; op.in2 = prog[p + 3];
      p += 4;
      memory::desc d = slot(op.in);
      post_ops po;
      po.append_eltwise(algorithm::eltwise_relu, 0.f, 0.f);
      primitive_attr attr;
      attr.set_post_ops(po);
      op.add_pd = binary::primitive_desc(cpu(), algorithm::binary_add, d, d, d, attr);  // in2 reordered to d if need be
      if (net.training) {
        auto hint = eltwise_forward::primitive_desc(cpu(), prop_kind::forward_training,
                                                    algorithm::eltwise_relu_use_dst_for_bwd, d, d, 0.f, 0.f);
        op.relu_bwd_pd = eltwise_backward::primitive_desc(cpu(), algorithm::eltwise_relu_use_dst_for_bwd, d, d, d,
                                                          0.f, 0.f, hint);
      }
      slot(op.out) = d;
    } else {
      throw std::runtime_error("unknown operation " + std::to_string(op.kind));
    }
    net.ops.push_back(op);
  }
  memory::dims od = dims_of(net.desc[net.ops.back().out]);
  net.out_user = memory::desc(od, dt::f32, tag::nchw);
  net.value.resize(net.desc.size());
  net.grad.resize(net.desc.size());
  net.has_grad.assign(net.desc.size(), false);
  for (size_t i = 0; i < net.desc.size(); ++i) {
    net.value[i] = memory(net.desc[i], cpu());
    if (net.training) net.grad[i] = memory(net.desc[i], cpu());
  }
}

memory reordered(stream &st, const memory &from, const memory::desc &want) {
  if (from.get_desc() == want) return from;
  memory to(want, cpu());
  reorder(from, to).execute(st, const_cast<memory &>(from), to);
  return to;
}

void forward(Net &net, void **params, void **aux, void *x, void *y) {
  stream &st = net.st;
  memory xin(net.in_user, cpu(), x);
  reorder(xin, net.value[0]).execute(st, xin, net.value[0]);
  for (Op &op : net.ops) {
    if (op.kind == CONV) {
      op.src_used = reordered(st, net.value[op.in], op.fwd_pd.src_desc());
      memory w = reordered(st, memory(op.wei_user, cpu(), params[op.param]), op.fwd_pd.weights_desc());
      convolution_forward(op.fwd_pd).execute(st, {{DNNL_ARG_SRC, op.src_used}, {DNNL_ARG_WEIGHTS, w},
                                                  {DNNL_ARG_DST, net.value[op.out]}});
    } else if (op.kind == BN) {
      memory::desc c = op.bn_pd.weights_desc();  // per channel, f32 (scale or shift)
      memory scale(c, cpu(), params[op.param]), shift(c, cpu(), params[op.param2]);
      memory mmean(c, cpu(), aux[op.aux]), mvar(c, cpu(), aux[op.aux + 1]);
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, net.value[op.in]}, {DNNL_ARG_DST, net.value[op.out]},
                                           {DNNL_ARG_SCALE, scale}, {DNNL_ARG_SHIFT, shift}};
      if (net.training) {
        args[DNNL_ARG_MEAN] = op.mean;
        args[DNNL_ARG_VARIANCE] = op.var;
        if (op.relu) args[DNNL_ARG_WORKSPACE] = op.workspace;
      } else {
        args[DNNL_ARG_MEAN] = mmean;
        args[DNNL_ARG_VARIANCE] = mvar;
      }
      batch_normalization_forward(op.bn_pd).execute(st, args);
      if (net.training) {  // the running statistics, as MXNet's BatchNorm keeps them
        st.wait();
        auto n = c.get_dims()[0];
        float *m = static_cast<float *>(aux[op.aux]), *v = static_cast<float *>(aux[op.aux + 1]);
        const float *bm = static_cast<float *>(op.mean.get_data_handle());
        const float *bv = static_cast<float *>(op.var.get_data_handle());
        for (memory::dim i = 0; i < n; ++i) {
          m[i] = m[i] * kMomentum + bm[i] * (1 - kMomentum);
          v[i] = v[i] * kMomentum + bv[i] * (1 - kMomentum);
        }
      }
    } else {
      memory other = reordered(st, net.value[op.in2], net.desc[op.in]);
      binary(op.add_pd).execute(st, {{DNNL_ARG_SRC_0, net.value[op.in]}, {DNNL_ARG_SRC_1, other},
                                     {DNNL_ARG_DST, net.value[op.out]}});
    }
  }
  memory yout(net.out_user, cpu(), y);
  memory &last = net.value[net.ops.back().out];
  reorder(last, yout).execute(st, last, yout);
  st.wait();
}

// Adds ``g`` into slot ``i``'s gradient (the first one is copied).
void accumulate(Net &net, int i, const memory &g) {
  stream &st = net.st;
  if (!net.has_grad[i]) {
    if (g.get_data_handle() != net.grad[i].get_data_handle()) reorder(g, net.grad[i]).execute(st, const_cast<memory &>(g), net.grad[i]);
    net.has_grad[i] = true;
    return;
  }
  memory same = reordered(st, g, net.desc[i]);  // one layout: a binary of two runs on oneDNN's reference code
  auto pd = binary::primitive_desc(cpu(), algorithm::binary_add, net.desc[i], net.desc[i], net.desc[i]);
  binary(pd).execute(st, {{DNNL_ARG_SRC_0, net.grad[i]}, {DNNL_ARG_SRC_1, same}, {DNNL_ARG_DST, net.grad[i]}});
}

void backward(Net &net, void *dy, void **params, void **grads) {
  stream &st = net.st;
  std::fill(net.has_grad.begin(), net.has_grad.end(), false);
  int last = net.ops.back().out;
  memory dyin(net.out_user, cpu(), dy);
  reorder(dyin, net.grad[last]).execute(st, dyin, net.grad[last]);
  net.has_grad[last] = true;
  for (auto it = net.ops.rbegin(); it != net.ops.rend(); ++it) {
    Op &op = *it;
    memory &d_out = net.grad[op.out];
    if (op.kind == CONV) {
      memory dd = reordered(st, d_out, op.bwd_w_pd.diff_dst_desc());
      memory dw(op.bwd_w_pd.diff_weights_desc(), cpu());
      convolution_backward_weights(op.bwd_w_pd).execute(st, {{DNNL_ARG_SRC, op.src_used}, {DNNL_ARG_DIFF_DST, dd},
                                                              {DNNL_ARG_DIFF_WEIGHTS, dw}});
      if (grads[op.param]) {
        memory user(op.wei_user, cpu(), grads[op.param]);
        reorder(dw, user).execute(st, dw, user);
      }
      if (op.in != 0) {
        memory w = reordered(st, memory(op.wei_user, cpu(), params[op.param]), op.bwd_d_pd.weights_desc());
        memory ddd = reordered(st, d_out, op.bwd_d_pd.diff_dst_desc());
        memory ds(op.bwd_d_pd.diff_src_desc(), cpu());
        convolution_backward_data(op.bwd_d_pd).execute(st, {{DNNL_ARG_DIFF_DST, ddd}, {DNNL_ARG_WEIGHTS, w},
                                                            {DNNL_ARG_DIFF_SRC, ds}});
        accumulate(net, op.in, ds);
      }
    } else if (op.kind == BN) {
      memory::desc c = op.bn_pd.weights_desc();
      memory scale(c, cpu(), params[op.param]);
      memory dscale(c, cpu()), dshift(c, cpu());
      memory ds(net.desc[op.in], cpu());
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, net.value[op.in]}, {DNNL_ARG_MEAN, op.mean},
                                           {DNNL_ARG_VARIANCE, op.var}, {DNNL_ARG_DIFF_DST, d_out},
                                           {DNNL_ARG_SCALE, scale}, {DNNL_ARG_DIFF_SRC, ds},
                                           {DNNL_ARG_DIFF_SCALE, dscale}, {DNNL_ARG_DIFF_SHIFT, dshift}};
      if (op.relu) args[DNNL_ARG_WORKSPACE] = op.workspace;
      batch_normalization_backward(op.bn_bwd_pd).execute(st, args);
      st.wait();
      auto n = c.get_dims()[0];
      if (grads[op.param]) std::copy_n(static_cast<float *>(dscale.get_data_handle()), n, static_cast<float *>(grads[op.param]));
      if (grads[op.param2]) std::copy_n(static_cast<float *>(dshift.get_data_handle()), n, static_cast<float *>(grads[op.param2]));
      accumulate(net, op.in, ds);
    } else {
      memory dsum(net.desc[op.out], cpu());
      eltwise_backward(op.relu_bwd_pd).execute(st, {{DNNL_ARG_DST, net.value[op.out]}, {DNNL_ARG_DIFF_DST, d_out},
                                                    {DNNL_ARG_DIFF_SRC, dsum}});
      accumulate(net, op.in, dsum);
      accumulate(net, op.in2, dsum);
    }
  }
  st.wait();
}

thread_local std::string last_error;

template <class F> int guarded(int threads, F f) {
  try {
    omp_set_num_threads(threads);
    f();
    return 0;
  } catch (const std::exception &e) {
    last_error = e.what();
    return 1;
  }
}
}  // namespace

extern "C" {
EXPORT const char *gg_amx_last_error() { return last_error.c_str(); }

EXPORT void *gg_amx_net_create(const int *program, int length, const int *in_dims, int training, int threads,
                                 int bfloat16) {
  try {
    omp_set_num_threads(threads);  // oneDNN sizes a primitive's thread team when it makes it
    act = bfloat16 ? dt::bf16 : dt::f32;
    auto net = std::make_unique<Net>();
    net->training = training != 0;
    build(*net, std::vector<int>(program, program + length), in_dims);
    return net.release();
  } catch (const std::exception &e) {
    last_error = e.what();
    return nullptr;
  }
}

EXPORT void gg_amx_net_destroy(void *net) { delete static_cast<Net *>(net); }

EXPORT int gg_amx_net_forward(void *handle, void *x, void **params, void **aux, void *y, int threads) {
  Net *net = static_cast<Net *>(handle);
  return guarded(threads, [&] { forward(*net, params, aux, x, y); });
}

EXPORT int gg_amx_net_backward(void *handle, void *dy, void **params, void **grads, int threads) {
  Net *net = static_cast<Net *>(handle);
  return guarded(threads, [&] { backward(*net, dy, params, grads); });
}

EXPORT const char *gg_amx_net_kernels(void *handle) {  // the implementations oneDNN chose, one per line
  static thread_local std::string names;
  names.clear();
  for (Op &op : static_cast<Net *>(handle)->ops) {
    if (op.kind == CONV) names += std::string(op.fwd_pd.impl_info_str()) + "\n";
    if (op.kind == BN) names += std::string(op.bn_pd.impl_info_str()) + "\n";
    if (op.kind == ADD_RELU) names += std::string(op.add_pd.impl_info_str()) + "\n";
  }
  return names.c_str();
}
}
