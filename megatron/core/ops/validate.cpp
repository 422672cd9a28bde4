// Platform-independent argument validation of the ops (see validate.h). The messages here are the
// ones users and tests see on every platform; change them in one place.
#include "megatron/core/ops/validate.h"

#include <cmath>
#include <string>
#include <utility>

#include "megatron/core/common/error.h"
#include "megatron/core/ops/rope_scaling.h"

namespace mg::ops {

// ---- generic helpers ----------------------------------------------------------------------------

bool is_kernel_float(DType t) {
  return t == DType::f64 || t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

bool is_index(DType t) {
  return t == DType::i32 || t == DType::i64;
}

DType compute_dtype(DType t) {
  return t == DType::f64 ? DType::f64 : DType::f32;
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || !a.shares_storage_with(b)) return false;
  const std::size_t a0 = a.offset_bytes(), a1 = a0 + a.nbytes();
  const std::size_t b0 = b.offset_bytes(), b1 = b0 + b.nbytes();
  return a0 < b1 && b0 < a1 && a.nbytes() > 0 && b.nbytes() > 0;
}

void check_defined(const char* op, const char* name, const Tensor& t) {
  MG_CHECK(t.defined(), op << ": " << name << " is undefined");
}

void check_float_dtype(const char* op, const char* name, const Tensor& t) {
  MG_CHECK(is_kernel_float(t.dtype()), op << ": " << name << " has dtype " << dtype_name(t.dtype())
                                          << ", expected one of f64, f32, bf16, f16");
}

void check_index_dtype(const char* op, const char* name, const Tensor& t) {
  MG_CHECK(is_index(t.dtype()),
           op << ": " << name << " has dtype " << dtype_name(t.dtype()) << ", expected i32 or i64");
}

void check_same_dtype(const char* op, const char* name, const Tensor& t, const char* ref_name,
                      const Tensor& ref) {
  MG_CHECK(t.dtype() == ref.dtype(), op << ": " << name << " has dtype " << dtype_name(t.dtype())
                                        << " but " << ref_name << " has "
                                        << dtype_name(ref.dtype()));
}

void check_same_shape(const char* op, const char* name, const Tensor& t, const char* ref_name,
                      const Tensor& ref) {
  MG_CHECK(t.shape() == ref.shape(), op << ": " << name << " " << shape_str(t.shape())
                                        << " does not match " << ref_name << " "
                                        << shape_str(ref.shape()));
}

void check_same_numel(const char* op, const char* name, const Tensor& t, const char* ref_name,
                      const Tensor& ref) {
  MG_CHECK(t.numel() == ref.numel(), op << ": " << name << " " << shape_str(t.shape()) << " has "
                                        << t.numel() << " elements but " << ref_name << " "
                                        << shape_str(ref.shape()) << " has " << ref.numel());
}

void check_stat_dtype(const char* op, const char* name, const Tensor& t, const char* ref_name,
                      const Tensor& ref) {
  const DType want = compute_dtype(ref.dtype());
  MG_CHECK(t.dtype() == want, op << ": " << name << " has dtype " << dtype_name(t.dtype())
                                 << ", expected " << dtype_name(want) << " for " << ref_name
                                 << " of dtype " << dtype_name(ref.dtype()));
}

void check_float(const Placement& on, const char* op, const char* name, const Tensor& t) {
  on.check(op, name, t);
  check_float_dtype(op, name, t);
}

void check_index(const Placement& on, const char* op, const char* name, const Tensor& t) {
  on.check(op, name, t);
  check_index_dtype(op, name, t);
}

void check_like(const Placement& on, const char* op, const char* name, const Tensor& t,
                const char* ref_name, const Tensor& ref) {
  on.check(op, name, t);
  check_same_dtype(op, name, t, ref_name, ref);
  check_same_shape(op, name, t, ref_name, ref);
}

void check_stat(const Placement& on, const char* op, const char* name, const Tensor& t,
                const char* ref_name, const Tensor& ref) {
  on.check(op, name, t);
  check_stat_dtype(op, name, t, ref_name, ref);
}

// ---- gemm family --------------------------------------------------------------------------------

GemmDims validate_gemm(const Placement& on, const Tensor& c, const Tensor& a, const Tensor& b,
                       const GemmArgs& args) {
  check_float(on, "gemm", "A", a);
  check_float(on, "gemm", "B", b);
  check_float(on, "gemm", "C", c);
  check_same_dtype("gemm", "B", b, "A", a);
  MG_CHECK(c.dtype() == a.dtype() || c.dtype() == DType::f32,
           "gemm: C has dtype " << dtype_name(c.dtype()) << ", expected A's dtype "
                                << dtype_name(a.dtype()) << " or f32");
  MG_CHECK((a.dim() == 2 || a.dim() == 3) && b.dim() == a.dim() && c.dim() == a.dim(),
           "gemm: A " << shape_str(a.shape()) << ", B " << shape_str(b.shape()) << " and C "
                      << shape_str(c.shape())
                      << " must all be rank 2, or all rank 3 with a shared batch dim");
  GemmDims d;
  if (a.dim() == 3) {
    d.batch = a.size(0);
    MG_CHECK(b.size(0) == d.batch && c.size(0) == d.batch,
             "gemm: batch dims differ: A " << shape_str(a.shape()) << ", B " << shape_str(b.shape())
                                           << ", C " << shape_str(c.shape()));
  }
  d.m = args.trans_a ? a.size(-1) : a.size(-2);
  d.k = args.trans_a ? a.size(-2) : a.size(-1);
  const int64_t kb = args.trans_b ? b.size(-1) : b.size(-2);
  d.n = args.trans_b ? b.size(-2) : b.size(-1);
  MG_CHECK(d.k == kb, "gemm: inner dims differ: op(A) is ["
                          << d.m << ", " << d.k << "] (A " << shape_str(a.shape())
                          << (args.trans_a ? ", trans_a" : "") << ") but op(B) is [" << kb << ", "
                          << d.n << "] (B " << shape_str(b.shape())
                          << (args.trans_b ? ", trans_b" : "") << ")");
  MG_CHECK(c.size(-2) == d.m && c.size(-1) == d.n,
           "gemm: C " << shape_str(c.shape()) << " does not match op(A) @ op(B) = [" << d.m << ", "
                      << d.n << "] (A " << shape_str(a.shape()) << ", B " << shape_str(b.shape())
                      << ")");
  return d;
}

std::vector<GemmDims> validate_grouped_gemm(const Placement& on, std::span<Tensor> c,
                                            std::span<const Tensor> a, std::span<const Tensor> b,
                                            const GemmArgs& args) {
  MG_CHECK(c.size() == a.size() && b.size() == a.size(),
           "grouped_gemm: " << c.size() << " C, " << a.size() << " A and " << b.size()
                            << " B tensors; each group needs one of each");
  std::vector<GemmDims> dims;
  dims.reserve(a.size());
  for (std::size_t g = 0; g < a.size(); ++g) {
    MG_CHECK(a[g].dim() == 2,
             "grouped_gemm: group " << g << ": A " << shape_str(a[g].shape()) << " must be rank 2");
    dims.push_back(validate_gemm(on, c[g], a[g], b[g], args));
    MG_CHECK(a[g].dtype() == a[0].dtype() && c[g].dtype() == c[0].dtype(),
             "grouped_gemm: group " << g << " has A " << dtype_name(a[g].dtype()) << ", C "
                                    << dtype_name(c[g].dtype()) << "; group 0 has A "
                                    << dtype_name(a[0].dtype()) << ", C "
                                    << dtype_name(c[0].dtype()) << " (one dtype set for all)");
  }
  return dims;
}

namespace {

bool is_fp8(DType t) {
  return t == DType::fp8_e4m3 || t == DType::fp8_e5m2;
}

void check_scalar_f32(const Placement& on, const char* op, const char* name, const Tensor& t) {
  on.check(op, name, t);
  MG_CHECK(t.dtype() == DType::f32 && t.numel() == 1,
           op << ": " << name << " is " << dtype_name(t.dtype()) << " " << shape_str(t.shape())
              << ", expected f32 with one element");
}

void check_fp8(const Placement& on, const char* op, const char* name, const Tensor& t) {
  on.check(op, name, t);
  MG_CHECK(is_fp8(t.dtype()), op << ": " << name << " has dtype " << dtype_name(t.dtype())
                                 << ", expected fp8_e4m3 or fp8_e5m2");
}

}  // namespace

GemmDims validate_fp8_cast_transpose(const Placement& on, const Tensor& q, const Tensor& qt,
                                     const Tensor& amax, const Tensor& x, const Tensor& scale) {
  const char* op = "fp8_cast_transpose";
  check_float(on, op, "x", x);
  MG_CHECK(x.dtype() != DType::f64, op << ": x is f64, expected f32, bf16 or f16");
  MG_CHECK(x.dim() >= 1, op << ": x is a scalar " << shape_str(x.shape()) << ", expected [.., C]");
  check_scalar_f32(on, op, "amax", amax);
  check_scalar_f32(on, op, "scale", scale);
  GemmDims d;
  d.n = x.size(-1);
  d.m = d.n == 0 ? 0 : x.numel() / d.n;
  if (q.defined()) {
    check_fp8(on, op, "q", q);
    check_same_shape(op, "q", q, "x", x);
  }
  if (qt.defined()) {
    check_fp8(on, op, "qt", qt);
    if (q.defined()) check_same_dtype(op, "qt", qt, "q", q);
    MG_CHECK(qt.dim() == 2 && qt.size(0) == d.n && qt.size(1) == d.m,
             op << ": qt " << shape_str(qt.shape()) << ", expected [" << d.n << ", " << d.m
                << "] (x " << shape_str(x.shape()) << " transposed as [R, C])");
  }
  MG_CHECK(!(q.defined() && overlaps(q, x)) && !(qt.defined() && overlaps(qt, x)),
           op << ": q / qt overlap x");
  return d;
}

GemmDims validate_fp8_swiglu_cast_transpose(const Placement& on, const char* op, const Tensor& q,
                                            const Tensor& qt, const Tensor& amax, const Tensor& dy,
                                            const Tensor& x, const Tensor& scale) {
  check_float(on, op, "x", x);
  MG_CHECK(x.dtype() != DType::f64, op << ": x is f64, expected f32, bf16 or f16");
  MG_CHECK(x.dim() == 2 && x.size(1) % 2 == 0,
           op << ": x " << shape_str(x.shape()) << ", expected [R, 2F] (gate | up)");
  const int64_t rows = x.size(0), f = x.size(1) / 2;
  if (dy.defined()) {
    check_float(on, op, "dy", dy);
    check_same_dtype(op, "dy", dy, "x", x);
    MG_CHECK(dy.dim() == 2 && dy.size(0) == rows && dy.size(1) == f,
             op << ": dy " << shape_str(dy.shape()) << ", expected [" << rows << ", " << f
                << "] (x " << shape_str(x.shape()) << " with its last dim halved)");
  }
  check_scalar_f32(on, op, "amax", amax);
  check_scalar_f32(on, op, "scale", scale);
  GemmDims d;
  d.m = rows;
  d.n = dy.defined() ? 2 * f : f;
  if (q.defined()) {
    check_fp8(on, op, "q", q);
    MG_CHECK(q.dim() == 2 && q.size(0) == d.m && q.size(1) == d.n,
             op << ": q " << shape_str(q.shape()) << ", expected [" << d.m << ", " << d.n << "]");
  }
  if (qt.defined()) {
    check_fp8(on, op, "qt", qt);
    if (q.defined()) check_same_dtype(op, "qt", qt, "q", q);
    MG_CHECK(qt.dim() == 2 && qt.size(0) == d.n && qt.size(1) == d.m,
             op << ": qt " << shape_str(qt.shape()) << ", expected [" << d.n << ", " << d.m << "]");
  }
  for (const Tensor* t : {&q, &qt})
    MG_CHECK(!t->defined() || (!overlaps(*t, x) && !(dy.defined() && overlaps(*t, dy))),
             op << ": q / qt overlap an input");
  return d;
}

GemmDims validate_fp8_gemm(const Placement& on, const Tensor& c, const Tensor& a, const Tensor& b,
                           const Tensor& a_scale_inv, const Tensor& b_scale_inv,
                           const Fp8GemmArgs& args) {
  const char* op = "fp8_gemm";
  check_fp8(on, op, "A", a);
  check_fp8(on, op, "B", b);
  const bool fp8_out = is_fp8(c.dtype());
  if (fp8_out) {  // Fp8GemmArgs' FP8 output: cast at out_scale, its amax
    on.check(op, "C", c);
    MG_CHECK(args.out_scale.defined(),
             op << ": C is " << dtype_name(c.dtype())
                << ": an FP8 output needs Fp8GemmArgs::out_scale (f32 [1], the cast's scale)");
    check_scalar_f32(on, op, "out_scale", args.out_scale);
    if (args.out_amax.defined()) check_scalar_f32(on, op, "out_amax", args.out_amax);
    MG_CHECK(args.beta == 0.0f, op << ": beta " << args.beta << " with an FP8 C ("
                                   << dtype_name(c.dtype())
                                   << "): an FP8 output is written, not accumulated (beta 0)");
  } else {
    check_float(on, op, "C", c);
  }
  check_scalar_f32(on, op, "a_scale_inv", a_scale_inv);
  check_scalar_f32(on, op, "b_scale_inv", b_scale_inv);
  MG_CHECK(!(a.dtype() == DType::fp8_e5m2 && b.dtype() == DType::fp8_e5m2),
           op << ": A and B are both fp8_e5m2 (cuBLASLt has no e5m2 x e5m2 GEMM; one of them must "
                 "be fp8_e4m3)");
  MG_CHECK(c.dtype() != DType::f64,
           op << ": C has dtype f64, expected f32, bf16, f16, fp8_e4m3 or fp8_e5m2 (FP8 GEMMs "
                 "accumulate in f32)");
  MG_CHECK(a.dim() == 2 && b.dim() == 2 && c.dim() == 2,
           op << ": A " << shape_str(a.shape()) << ", B " << shape_str(b.shape()) << " and C "
              << shape_str(c.shape()) << " must be rank 2");
  GemmDims d{.batch = 1, .m = a.size(0), .n = b.size(0), .k = a.size(1)};
  MG_CHECK(b.size(1) == d.k, op << ": inner dims differ: A " << shape_str(a.shape()) << ", B "
                                << shape_str(b.shape()) << " (c = A @ B^T: both [.., K])");
  MG_CHECK(c.size(0) == d.m && c.size(1) == d.n, op << ": C " << shape_str(c.shape())
                                                    << " does not match A @ B^T = [" << d.m << ", "
                                                    << d.n << "]");
  MG_CHECK(args.beta == 0.0f || args.beta == 1.0f,
           op << ": beta " << args.beta << ", expected 0 or 1");
  MG_CHECK(d.m % 16 == 0 && d.n % 16 == 0 && d.k % 16 == 0,
           op << ": dims [M, N, K] = [" << d.m << ", " << d.n << ", " << d.k
              << "] must be multiples of 16 (cuBLASLt's FP8 GEMM; Transformer Engine asserts the "
                 "same): for FP8 training, hidden, FFN and per-rank projection sizes and "
                 "sequence length x micro-batch size must be multiples of 16");
  return d;
}

GemmDims validate_fp8_scale_update(const Placement& on, const Tensor& history, const Tensor& scale,
                                   const Tensor& scale_inv, const Fp8ScaleUpdateArgs& args) {
  const char* op = "fp8_scale_update";
  on.check(op, "history", history);
  on.check(op, "scale", scale);
  on.check(op, "scale_inv", scale_inv);
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"history", &history},
                                {"scale", &scale},
                                {"scale_inv", &scale_inv}})
    MG_CHECK(t->dtype() == DType::f32,
             op << ": " << name << " is " << t->str() << ", expected f32");
  MG_CHECK(history.dim() == 2 && history.size(0) >= 1,
           op << ": history " << shape_str(history.shape()) << ", expected [L >= 1, slots]");
  GemmDims d{.batch = 1, .m = history.size(0), .n = history.size(1), .k = 0};
  MG_CHECK(
      scale.dim() == 1 && scale.size(0) == d.n && scale_inv.dim() == 1 && scale_inv.size(0) == d.n,
      op << ": scale " << shape_str(scale.shape()) << " and scale_inv "
         << shape_str(scale_inv.shape()) << " must be [" << d.n << "] (history "
         << shape_str(history.shape()) << ")");
  MG_CHECK(!args.current || d.m == 1,
           op << ": current scaling takes a [1, slots] amax row, got history "
              << shape_str(history.shape()));
  MG_CHECK(args.margin >= 0 && args.margin < 127,
           op << ": margin " << args.margin << ", expected 0 <= margin < 127");
  MG_CHECK(args.fp8_max > 0.0f, op << ": fp8_max " << args.fp8_max << ", expected > 0");
  MG_CHECK(
      !overlaps(scale, scale_inv) && !overlaps(history, scale) && !overlaps(history, scale_inv),
      op << ": history, scale and scale_inv overlap");
  return d;
}

int64_t validate_fp8_dequantize(const Placement& on, const Tensor& y, const Tensor& q,
                                const Tensor& scale_inv) {
  const char* op = "fp8_dequantize";
  check_fp8(on, op, "q", q);
  check_float(on, op, "y", y);
  MG_CHECK(y.dtype() != DType::f64, op << ": y is f64, expected f32, bf16 or f16");
  check_same_shape(op, "y", y, "q", q);
  check_scalar_f32(on, op, "scale_inv", scale_inv);
  MG_CHECK(!overlaps(y, q), op << ": y overlaps q");
  return q.numel();
}

GemmDims validate_fp8_transpose(const Placement& on, const Tensor& qt, const Tensor& q) {
  const char* op = "fp8_transpose";
  check_fp8(on, op, "q", q);
  check_fp8(on, op, "qt", qt);
  check_same_dtype(op, "qt", qt, "q", q);
  MG_CHECK(q.dim() == 2 && qt.dim() == 2 && qt.size(0) == q.size(1) && qt.size(1) == q.size(0),
           op << ": q " << shape_str(q.shape()) << " and qt " << shape_str(qt.shape())
              << ", expected [R, C] and [C, R]");
  MG_CHECK(!overlaps(qt, q), op << ": qt overlaps q");
  return GemmDims{.batch = 1, .m = q.size(0), .n = q.size(1), .k = 0};
}

GemmDims validate_gemm_epilogue(const Placement& on, const Tensor& c, const Tensor& aux,
                                const Tensor& dbias, const Tensor& a, const Tensor& b,
                                const Tensor& bias, const GemmEpilogueArgs& args) {
  const char* op = "gemm_epilogue";
  const GemmEpilogue e = args.epilogue;
  const char* name = gemm_epilogue_name(e);
  MG_CHECK(e == GemmEpilogue::bias || e == GemmEpilogue::bias_gelu ||
               e == GemmEpilogue::dgelu_bgrad || e == GemmEpilogue::bgrad,
           op << ": unknown epilogue " << static_cast<int>(e)
              << " (valid: bias, bias_gelu, dgelu_bgrad, bgrad)");
  const GemmDims d = validate_gemm(
      on, c, a, b, GemmArgs{.trans_a = args.trans_a, .trans_b = args.trans_b, .beta = args.beta});
  MG_CHECK(a.dim() == 2, op << " (" << name << "): A " << shape_str(a.shape()) << ", B "
                            << shape_str(b.shape()) << " and C " << shape_str(c.shape())
                            << " must be rank 2 (view [S, B, H] as [S*B, H])");
  MG_CHECK(args.beta == 0.0f || (e == GemmEpilogue::bgrad && args.beta == 1.0f),
           op << " (" << name << "): beta " << args.beta
              << " not supported (0, or 0 or 1 with the bgrad epilogue)");
  const bool wants_bias = e == GemmEpilogue::bias || e == GemmEpilogue::bias_gelu;
  const bool wants_aux = e == GemmEpilogue::bias_gelu || e == GemmEpilogue::dgelu_bgrad;
  const bool wants_dbias = e == GemmEpilogue::dgelu_bgrad || e == GemmEpilogue::bgrad;
  if (e == GemmEpilogue::bias)
    MG_CHECK(bias.defined(), op << " (bias): the bias epilogue needs a bias [" << d.n << "]");
  if (e == GemmEpilogue::bgrad)
    MG_CHECK(dbias.defined(), op << " (bgrad): the bgrad epilogue needs a dbias [" << d.m << "]");
  MG_CHECK(wants_bias || !bias.defined(),
           op << " (" << name << "): takes no bias (got " << bias.str() << ")");
  MG_CHECK(wants_aux || !aux.defined(),
           op << " (" << name << "): takes no aux (got " << aux.str() << ")");
  MG_CHECK(wants_dbias || !dbias.defined(),
           op << " (" << name << "): takes no dbias (got " << dbias.str() << ")");
  if (bias.defined()) {
    check_float(on, op, "bias", bias);
    MG_CHECK(bias.dim() == 1 && bias.size(0) == d.n,
             op << " (" << name << "): bias " << shape_str(bias.shape()) << " does not match C "
                << shape_str(c.shape()) << "'s columns (expected [" << d.n << "])");
    MG_CHECK(!overlaps(c, bias), op << ": C overlaps bias");
  }
  if (wants_aux) {
    MG_CHECK(aux.defined(), op << " (" << name << "): needs aux [" << d.m << ", " << d.n
                               << "] (the pre-activation, C's dtype)");
    check_like(on, op, "aux", aux, "C", c);
    MG_CHECK(!overlaps(c, aux), op << " (" << name << "): C overlaps aux");
    if (e == GemmEpilogue::bias_gelu)
      MG_CHECK(!overlaps(aux, a) && !overlaps(aux, b) && !(bias.defined() && overlaps(aux, bias)),
               op << " (bias_gelu): aux overlaps an input");
  }
  if (dbias.defined()) {
    check_float(on, op, "dbias", dbias);
    const int64_t len = e == GemmEpilogue::bgrad ? d.m : d.n;
    MG_CHECK(dbias.dim() == 1 && dbias.size(0) == len,
             op << " (" << name << "): dbias " << shape_str(dbias.shape()) << ", expected [" << len
                << "] (" << (e == GemmEpilogue::bgrad ? "op(A)'s rows M" : "C's columns N") << ")");
    MG_CHECK(!overlaps(dbias, c) && !overlaps(dbias, a) && !overlaps(dbias, b) &&
                 !(aux.defined() && overlaps(dbias, aux)),
             op << " (" << name << "): dbias overlaps another argument");
  }
  return d;
}

int64_t validate_bias_add(const Placement& on, const Tensor& y, const Tensor& bias) {
  check_float(on, "bias_add", "y", y);
  check_float(on, "bias_add", "bias", bias);
  MG_CHECK(bias.dim() == 1 && y.dim() >= 1 && y.size(-1) == bias.numel(),
           "bias_add: bias " << shape_str(bias.shape()) << " does not match y "
                             << shape_str(y.shape()) << "'s last dim (expected bias [F])");
  return bias.numel();
}

int64_t validate_bias_grad(const Placement& on, const Tensor& dbias, const Tensor& dy) {
  check_float(on, "bias_grad", "dbias", dbias);
  check_float(on, "bias_grad", "dy", dy);
  MG_CHECK(dbias.dim() == 1 && dy.dim() >= 1 && dy.size(-1) == dbias.numel(),
           "bias_grad: dbias " << shape_str(dbias.shape()) << " does not match dy "
                               << shape_str(dy.shape()) << "'s last dim (expected dbias [F])");
  return dbias.numel();
}

void validate_axpy(const Placement& on, const Tensor& y, const Tensor& x) {
  check_float(on, "axpy", "y", y);
  check_float(on, "axpy", "x", x);
  check_same_numel("axpy", "x", x, "y", y);
}

// ---- activation ---------------------------------------------------------------------------------

void validate_unary(const Placement& on, const char* op, const char* out_name, const Tensor& out,
                    const char* in_name, const Tensor& in) {
  check_float(on, op, in_name, in);
  check_float(on, op, out_name, out);
  check_same_dtype(op, out_name, out, in_name, in);
  check_same_numel(op, out_name, out, in_name, in);
}

int64_t validate_swiglu(const Placement& on, const char* op, const char* half_name,
                        const Tensor& half, const Tensor& x) {
  check_float(on, op, "x", x);
  check_float(on, op, half_name, half);
  check_same_dtype(op, half_name, half, "x", x);
  MG_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0,
           op << ": x " << shape_str(x.shape()) << " needs an even last dim [.., 2F] (gate | up)");
  const int64_t f = x.size(-1) / 2;
  Shape expect = x.shape();
  expect.back() = f;
  MG_CHECK(half.shape() == expect, op << ": " << half_name << " " << shape_str(half.shape())
                                      << " does not match x " << shape_str(x.shape())
                                      << " with its last dim halved " << shape_str(expect));
  return f;
}

int64_t validate_swiglu_bwd(const Placement& on, const Tensor& dx, const Tensor& dy,
                            const Tensor& x) {
  const char* op = "swiglu_bwd";
  const int64_t f = validate_swiglu(on, op, "dy", dy, x);
  check_float(on, op, "dx", dx);
  check_same_dtype(op, "dx", dx, "x", x);
  MG_CHECK(dx.shape() == x.shape(),
           op << ": dx " << shape_str(dx.shape()) << " does not match x " << shape_str(x.shape()));
  MG_CHECK(!overlaps(dx, dy), op << ": dx must not overlap dy (their layouts differ)");
  return f;
}

// ---- attention ----------------------------------------------------------------------------------

namespace {

// q [Sq, B, NH, HD], k and v [Sk, B, NG, HD]: float, or fp8 (the FP8 attention) when `fp8`.
AttentionDims validate_qkv(const Placement& on, const char* op, const Tensor& q, const Tensor& k,
                           const Tensor& v, bool fp8 = false) {
  if (fp8)
    check_fp8(on, op, "q", q);
  else
    check_float(on, op, "q", q);
  on.check(op, "k", k);
  MG_CHECK(q.dim() == 4, op << ": q must be [S, B, NH, HD], got " << shape_str(q.shape()));
  MG_CHECK(k.dim() == 4, op << ": k must be [Sk, B, NG, HD], got " << shape_str(k.shape()));
  check_like(on, op, "v", v, "k", k);
  check_same_dtype(op, "k", k, "q", q);
  const AttentionDims d{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), k.size(0)};
  MG_CHECK(d.b == k.size(1) && d.hd == k.size(3), op << ": k " << shape_str(k.shape())
                                                     << " does not match q " << shape_str(q.shape())
                                                     << " in B or HD");
  MG_CHECK(d.ng > 0 && d.nh % d.ng == 0,
           op << ": NH = " << d.nh << " heads is not a multiple of NG = " << d.ng << " groups");
  return d;
}

void validate_lse(const Placement& on, const char* op, const Tensor& lse, const Tensor& q,
                  const AttentionDims& d) {
  check_stat(on, op, "lse", lse, "q", q);
  MG_CHECK(lse.shape() == (Shape{d.b, d.nh, d.s}),
           op << ": lse " << shape_str(lse.shape())
              << " is not [B, NH, S] = " << shape_str(Shape{d.b, d.nh, d.s}));
}

void validate_attention_args(const Placement& on, const char* op, const AttentionArgs& a,
                             const AttentionDims& d) {
  MG_CHECK(a.dropout.p >= 0.0f && a.dropout.p < 1.0f,
           op << ": attention dropout p = " << a.dropout.p << " is outside [0, 1)");
  MG_CHECK(std::isfinite(a.softmax_scale),
           op << ": softmax_scale " << a.softmax_scale << " is not finite");
  const bool has_doc = a.doc_ids.defined(), has_cu = a.cu_seqlens.defined();
  const bool has_kv_doc = a.kv_doc_ids.defined();
  MG_CHECK(!(has_doc && has_cu), op << ": give doc_ids or cu_seqlens, not both");
  MG_CHECK(!has_kv_doc || has_doc, op << ": kv_doc_ids needs doc_ids (the queries' documents)");
  auto check_ids = [&](const char* name, const Tensor& t, int64_t len, const char* dims) {
    on.check(op, name, t);
    MG_CHECK(t.dtype() == DType::i32,
             op << ": " << name << " has dtype " << dtype_name(t.dtype()) << ", expected i32");
    MG_CHECK(t.shape() == (Shape{d.b, len}), op << ": " << name << " " << shape_str(t.shape())
                                                << " is not " << dims << " = "
                                                << shape_str(Shape{d.b, len}));
  };
  if (has_doc) {
    check_ids("doc_ids", a.doc_ids, d.s, "[B, Sq]");
    if (has_kv_doc)
      check_ids("kv_doc_ids", a.kv_doc_ids, d.sk, "[B, Sk]");
    else
      MG_CHECK(d.sk == d.s, op << ": Sk = " << d.sk << " differs from Sq = " << d.s
                               << ": doc_ids needs kv_doc_ids [B, Sk] for the keys");
  } else if (has_cu) {
    MG_CHECK(d.sk == d.s, op << ": cu_seqlens needs Sk == Sq, got Sk = " << d.sk << ", Sq = " << d.s
                             << " (give doc_ids and kv_doc_ids)");
    const Tensor& cu = a.cu_seqlens;
    on.check(op, "cu_seqlens", cu);
    MG_CHECK(cu.dtype() == DType::i32,
             op << ": cu_seqlens has dtype " << dtype_name(cu.dtype()) << ", expected i32");
    MG_CHECK(cu.dim() == 1 && cu.numel() >= 2,
             op << ": cu_seqlens must be [D+1] with D >= 1, got " << shape_str(cu.shape()));
  }
}

}  // namespace

AttentionDims validate_attention_fwd(const Placement& on, const Tensor& out, const Tensor& lse,
                                     const Tensor& q, const Tensor& k, const Tensor& v,
                                     const AttentionArgs& args) {
  const char* op = "attention_fwd";
  const AttentionDims d = validate_qkv(on, op, q, k, v);
  check_like(on, op, "out", out, "q", q);
  validate_lse(on, op, lse, q, d);
  validate_attention_args(on, op, args, d);
  return d;
}

AttentionDims validate_attention_bwd(const Placement& on, const Tensor& dq, const Tensor& dk,
                                     const Tensor& dv, const Tensor& dout, const Tensor& q,
                                     const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor& lse, const AttentionArgs& args) {
  const char* op = "attention_bwd";
  const AttentionDims d = validate_qkv(on, op, q, k, v);
  check_like(on, op, "dq", dq, "q", q);
  check_like(on, op, "dout", dout, "q", q);
  check_like(on, op, "out", out, "q", q);
  check_like(on, op, "dk", dk, "k", k);
  check_like(on, op, "dv", dv, "v", v);
  validate_lse(on, op, lse, q, d);
  validate_attention_args(on, op, args, d);
  return d;
}

AttentionDims validate_attention_merge(const Placement& on, const Tensor& out, const Tensor& lse,
                                       const Tensor& block_out, const Tensor& block_lse) {
  const char* op = "attention_merge";
  check_float(on, op, "out", out);
  MG_CHECK(out.dim() == 4, op << ": out must be [S, B, NH, HD], got " << shape_str(out.shape()));
  check_like(on, op, "block_out", block_out, "out", out);
  const AttentionDims d{out.size(0), out.size(1), out.size(2),
                        out.size(2), out.size(3), out.size(0)};
  validate_lse(on, op, lse, out, d);
  validate_lse(on, op, block_lse, out, d);
  MG_CHECK(!overlaps(out, block_out) && !overlaps(lse, block_lse),
           op << ": the block's result overlaps the one it is merged into");
  return d;
}

namespace {

// The FP8 attention's q, k, v (fp8 of one dtype, sbhd, GQA), its scale vectors (f32 [3]) and the
// parts of AttentionArgs it serves.
AttentionDims validate_fp8_qkv(const Placement& on, const char* op, const Tensor& q,
                               const Tensor& k, const Tensor& v, const Tensor& lse,
                               const AttentionArgs& a) {
  const AttentionDims d = validate_qkv(on, op, q, k, v, true);
  MG_CHECK(d.sk == d.s, op << ": k " << shape_str(k.shape()) << " has Sk = " << d.sk
                           << ", q has Sq = " << d.s
                           << " (FP8 attention is self-attention: Sk == Sq)");
  validate_lse(on, op, lse, q, d);
  MG_CHECK(a.dropout.p == 0.0f,
           op << ": attention dropout p = " << a.dropout.p
              << ": FP8 attention runs without dropout (--attention-dropout 0)");
  MG_CHECK(!a.doc_ids.defined() && !a.kv_doc_ids.defined() && !a.cu_seqlens.defined(),
           op << ": document masks (doc_ids, cu_seqlens) are not built for FP8 attention");
  MG_CHECK(std::isfinite(a.softmax_scale),
           op << ": softmax_scale " << a.softmax_scale << " is not finite");
  return d;
}

void check_scale3(const Placement& on, const char* op, const char* name, const Tensor& t) {
  on.check(op, name, t);
  MG_CHECK(t.dtype() == DType::f32 && t.dim() == 1 && t.size(0) == 3,
           op << ": " << name << " is " << t.str() << ", expected f32 [3]");
}

void check_amax_n(const Placement& on, const char* op, const Tensor& t, int64_t n) {
  on.check(op, "amax", t);
  MG_CHECK(t.dtype() == DType::f32 && t.dim() == 1 && t.size(0) == n,
           op << ": amax is " << t.str() << ", expected f32 [" << n << "]");
}

}  // namespace

AttentionDims validate_fp8_attention_fwd(const Placement& on, const Tensor& out, const Tensor& lse,
                                         const Tensor& amax, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& fwd_scale,
                                         const Tensor& fwd_scale_inv, const AttentionArgs& args) {
  const char* op = "fp8_attention_fwd";
  const AttentionDims d = validate_fp8_qkv(on, op, q, k, v, lse, args);
  check_like(on, op, "out", out, "q", q);
  check_amax_n(on, op, amax, 2);
  check_scale3(on, op, "fwd_scale", fwd_scale);
  check_scale3(on, op, "fwd_scale_inv", fwd_scale_inv);
  return d;
}

AttentionDims validate_fp8_attention_bwd(const Placement& on, const Tensor& dq, const Tensor& dk,
                                         const Tensor& dv, const Tensor& amax, const Tensor& dout,
                                         const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& out, const Tensor& lse,
                                         const Tensor& fwd_scale, const Tensor& fwd_scale_inv,
                                         const Tensor& bwd_scale, const Tensor& bwd_scale_inv,
                                         const AttentionArgs& args) {
  const char* op = "fp8_attention_bwd";
  const AttentionDims d = validate_fp8_qkv(on, op, q, k, v, lse, args);
  check_like(on, op, "out", out, "q", q);
  check_fp8(on, op, "dout", dout);
  check_same_shape(op, "dout", dout, "q", q);
  check_like(on, op, "dq", dq, "dout", dout);
  on.check(op, "dk", dk);
  on.check(op, "dv", dv);
  check_same_dtype(op, "dk", dk, "dout", dout);
  check_same_dtype(op, "dv", dv, "dout", dout);
  check_same_shape(op, "dk", dk, "k", k);
  check_same_shape(op, "dv", dv, "v", v);
  check_amax_n(on, op, amax, 4);
  check_scale3(on, op, "fwd_scale", fwd_scale);
  check_scale3(on, op, "fwd_scale_inv", fwd_scale_inv);
  check_scale3(on, op, "bwd_scale", bwd_scale);
  check_scale3(on, op, "bwd_scale_inv", bwd_scale_inv);
  return d;
}

void validate_cu_seqlens(const char* op, std::span<const int32_t> c, int64_t s) {
  const int64_t nd = static_cast<int64_t>(c.size()) - 1;
  MG_CHECK(c[0] == 0, op << ": cu_seqlens must start at 0, starts at " << c[0]);
  MG_CHECK(c[nd] == s, op << ": cu_seqlens must end at S = " << s << ", ends at " << c[nd]);
  for (int64_t i = 0; i < nd; ++i)
    MG_CHECK(c[i] <= c[i + 1], op << ": cu_seqlens is not monotone: cu_seqlens[" << i << "] = "
                                  << c[i] << " > cu_seqlens[" << i + 1 << "] = " << c[i + 1]);
}

// ---- cross entropy ------------------------------------------------------------------------------

namespace {

// logits [N, Vl] (leading dims flattened).
CeRows validate_logits(const Placement& on, const char* op, const Tensor& logits) {
  check_float(on, op, "logits", logits);
  MG_CHECK(logits.dim() >= 1, op << ": logits must be [N, V], got a scalar");
  const int64_t v = logits.size(-1);
  MG_CHECK(v > 0, op << ": logits " << shape_str(logits.shape()) << " has an empty vocab dim");
  return {logits.numel() / v, v};
}

// A per-row statistic [N] of the dtype that goes with the logits.
void validate_ce_stat(const Placement& on, const char* op, const char* name, const Tensor& t,
                      const Tensor& logits, const CeRows& r) {
  check_stat(on, op, name, t, "logits", logits);
  MG_CHECK(t.numel() == r.n, op << ": " << name << " " << shape_str(t.shape()) << " has "
                                << t.numel() << " elements, expected N = " << r.n << " (logits "
                                << shape_str(logits.shape()) << ")");
}

void validate_targets(const Placement& on, const char* op, const Tensor& targets,
                      const Tensor& logits, const CeRows& r) {
  check_index(on, op, "targets", targets);
  MG_CHECK(targets.numel() == r.n, op << ": targets " << shape_str(targets.shape()) << " has "
                                      << targets.numel() << " elements, expected N = " << r.n
                                      << " (logits " << shape_str(logits.shape()) << ")");
}

void validate_vocab_start(const char* op, int64_t vocab_start) {
  MG_CHECK(vocab_start >= 0, op << ": vocab_start " << vocab_start << " is negative");
}

}  // namespace

CeRows validate_cross_entropy_fwd(const Placement& on, const Tensor& loss, const Tensor& max,
                                  const Tensor& sum_exp, const Tensor& logits,
                                  const Tensor& targets) {
  const char* op = "cross_entropy_fwd";
  const CeRows r = validate_logits(on, op, logits);
  validate_targets(on, op, targets, logits, r);
  validate_ce_stat(on, op, "loss", loss, logits, r);
  validate_ce_stat(on, op, "max", max, logits, r);
  validate_ce_stat(on, op, "sum_exp", sum_exp, logits, r);
  return r;
}

CeRows validate_ce_local_max(const Placement& on, const Tensor& max, const Tensor& logits) {
  const char* op = "ce_local_max";
  const CeRows r = validate_logits(on, op, logits);
  validate_ce_stat(on, op, "max", max, logits, r);
  return r;
}

CeRows validate_ce_local_stats(const Placement& on, const Tensor& sum_exp,
                               const Tensor& target_logit, const Tensor& logits, const Tensor& max,
                               const Tensor& targets, int64_t vocab_start) {
  const char* op = "ce_local_stats";
  const CeRows r = validate_logits(on, op, logits);
  validate_targets(on, op, targets, logits, r);
  validate_ce_stat(on, op, "sum_exp", sum_exp, logits, r);
  validate_ce_stat(on, op, "target_logit", target_logit, logits, r);
  validate_ce_stat(on, op, "max", max, logits, r);
  validate_vocab_start(op, vocab_start);
  return r;
}

void validate_ce_combine(const Placement& on, const Tensor& loss, const Tensor& max,
                         const Tensor& sum_exp, const Tensor& target_logit) {
  const char* op = "ce_combine";
  on.check(op, "loss", loss);
  MG_CHECK(loss.dtype() == DType::f32 || loss.dtype() == DType::f64,
           op << ": loss has dtype " << dtype_name(loss.dtype()) << ", expected f32 or f64");
  const std::pair<const char*, const Tensor*> ins[] = {
      {"max", &max}, {"sum_exp", &sum_exp}, {"target_logit", &target_logit}};
  for (const auto& [name, t] : ins) {
    on.check(op, name, *t);
    check_same_dtype(op, name, *t, "loss", loss);
    check_same_numel(op, name, *t, "loss", loss);
  }
}

CeRows validate_cross_entropy_bwd(const Placement& on, const Tensor& dlogits, const Tensor& dloss,
                                  const Tensor& logits, const Tensor& max, const Tensor& sum_exp,
                                  const Tensor& targets, int64_t vocab_start) {
  const char* op = "cross_entropy_bwd";
  const CeRows r = validate_logits(on, op, logits);
  check_like(on, op, "dlogits", dlogits, "logits", logits);
  validate_targets(on, op, targets, logits, r);
  validate_ce_stat(on, op, "dloss", dloss, logits, r);
  validate_ce_stat(on, op, "max", max, logits, r);
  validate_ce_stat(on, op, "sum_exp", sum_exp, logits, r);
  validate_vocab_start(op, vocab_start);
  return r;
}

// ---- dropout ------------------------------------------------------------------------------------

void validate_dropout_p(const char* op, const DropoutArgs& args) {
  MG_CHECK(args.p >= 0.0f && args.p < 1.0f,
           op << ": dropout probability p must be in [0, 1), got " << args.p);
}

void validate_dropout(const Placement& on, const char* op, const Tensor& out, const Tensor& in,
                      const DropoutArgs& args) {
  validate_dropout_p(op, args);
  check_float(on, op, "input", in);
  check_like(on, op, "output", out, "input", in);
}

namespace {
// The optional bias [H] of a bias-dropout-add (alone or fused with a norm): x's float dtype.
void validate_bda_bias(const Placement& on, const char* op, const Tensor& bias, const Tensor& x,
                       int64_t h) {
  if (!bias.defined()) return;
  check_float(on, op, "bias", bias);
  check_same_dtype(op, "bias", bias, "x", x);
  MG_CHECK(bias.dim() == 1 && bias.size(0) == h,
           op << ": bias " << shape_str(bias.shape()) << " does not match x's last dim " << h);
}
}  // namespace

int64_t validate_bias_dropout_add_fwd(const Placement& on, const Tensor& y, const Tensor& x,
                                      const Tensor& bias, const Tensor& residual,
                                      const DropoutArgs& args) {
  const char* op = "bias_dropout_add_fwd";
  validate_dropout_p(op, args);
  check_float(on, op, "x", x);
  check_like(on, op, "y", y, "x", x);
  check_like(on, op, "residual", residual, "x", x);
  MG_CHECK(x.dim() >= 1, op << ": x must have at least one dimension, got " << x.str());
  const int64_t f = x.size(-1);
  validate_bda_bias(on, op, bias, x, f);
  return f;
}

int64_t validate_bias_dropout_add_bwd(const Placement& on, const Tensor& dx, const Tensor& dbias,
                                      const Tensor& dy, const DropoutArgs& args) {
  const char* op = "bias_dropout_add_bwd";
  validate_dropout_p(op, args);
  check_float(on, op, "dy", dy);
  check_like(on, op, "dx", dx, "dy", dy);
  MG_CHECK(dy.dim() >= 1, op << ": dy must have at least one dimension, got " << dy.str());
  const int64_t f = dy.size(-1);
  if (dbias.defined()) {
    check_float(on, op, "dbias", dbias);
    MG_CHECK(dbias.dim() == 1 && dbias.size(0) == f,
             op << ": dbias " << shape_str(dbias.shape()) << " does not match dy's last dim " << f);
  }
  return f;
}

// ---- embedding ----------------------------------------------------------------------------------

namespace {

// weight [Vl, H]; `rows` (out or dout) [N, H] (any leading shape) with N = ids.numel().
EmbeddingDims validate_embedding(const Placement& on, const char* op, const char* rows_name,
                                 const Tensor& rows, const char* weight_name, const Tensor& weight,
                                 const Tensor& ids, int64_t vocab_start) {
  check_float(on, op, weight_name, weight);
  check_float(on, op, rows_name, rows);
  check_index(on, op, "ids", ids);
  MG_CHECK(weight.dim() == 2, op << ": " << weight_name << " " << shape_str(weight.shape())
                                 << " must be rank 2 [Vl, H]");
  const int64_t h = weight.size(1);
  MG_CHECK(rows.dim() >= 1 && rows.size(-1) == h && rows.numel() == ids.numel() * h,
           op << ": " << rows_name << " " << shape_str(rows.shape()) << " does not match ids "
              << shape_str(ids.shape()) << " x H = " << h << " (" << weight_name << " "
              << shape_str(weight.shape()) << ")");
  MG_CHECK(vocab_start >= 0, op << ": vocab_start " << vocab_start << " is negative");
  return {ids.numel(), weight.size(0), h};
}

}  // namespace

EmbeddingDims validate_embedding_fwd(const Placement& on, const Tensor& out, const Tensor& ids,
                                     const Tensor& weight, int64_t vocab_start) {
  const char* op = "embedding_fwd";
  const EmbeddingDims d =
      validate_embedding(on, op, "out", out, "weight", weight, ids, vocab_start);
  check_same_dtype(op, "out", out, "weight", weight);
  return d;
}

EmbeddingDims validate_embedding_bwd(const Placement& on, const Tensor& dweight, const Tensor& dout,
                                     const Tensor& ids, int64_t vocab_start) {
  return validate_embedding(on, "embedding_bwd", "dout", dout, "dweight", dweight, ids,
                            vocab_start);
}

void validate_ids_nonnegative(const char* op, const Tensor& ids, std::span<const int64_t> id) {
  for (std::size_t i = 0; i < id.size(); ++i)
    MG_CHECK(id[i] >= 0, op << ": ids " << shape_str(ids.shape()) << " holds a negative id "
                            << id[i] << " at flat index " << i);
}

// ---- init ---------------------------------------------------------------------------------------

namespace {

void validate_init_x(const Placement& on, const char* op, const Tensor& x) {
  on.check(op, "x", x);
  MG_CHECK(is_floating(x.dtype()),
           op << ": x has dtype " << dtype_name(x.dtype()) << ", expected a float dtype");
}

}  // namespace

void validate_init_normal(const Placement& on, const Tensor& x, const InitArgs& args) {
  const char* op = "init_normal";
  validate_init_x(on, op, x);
  MG_CHECK(
      std::isfinite(args.mean) && std::isfinite(args.std) && args.std >= 0.0,
      op << ": needs a finite mean and std >= 0, got mean " << args.mean << " std " << args.std);
}

void validate_init_uniform(const Placement& on, const Tensor& x, const InitArgs& args) {
  const char* op = "init_uniform";
  validate_init_x(on, op, x);
  const double low = args.mean, high = args.std;
  MG_CHECK(std::isfinite(low) && std::isfinite(high) && low <= high,
           op << ": needs finite bounds with low <= high, got low " << low << " high " << high);
}

// ---- norms --------------------------------------------------------------------------------------

namespace {

// x [N, H] (any leading shape).
NormDims validate_norm_x(const Placement& on, const char* op, const Tensor& x) {
  check_float(on, op, "x", x);
  MG_CHECK(x.dim() >= 1 && x.size(-1) >= 1,
           op << ": x " << shape_str(x.shape()) << " needs a non-empty last dim to normalise");
  return {x.numel() / x.size(-1), x.size(-1)};
}

// An activation-shaped tensor (y, dx, dy): x's dtype and element count, same last dim.
void validate_like_x(const Placement& on, const char* op, const char* name, const Tensor& t,
                     const Tensor& x) {
  check_float(on, op, name, t);
  check_same_dtype(op, name, t, "x", x);
  MG_CHECK(t.numel() == x.numel() && t.dim() >= 1 && t.size(-1) == x.size(-1),
           op << ": " << name << " " << shape_str(t.shape()) << " does not match x "
              << shape_str(x.shape()));
}

// A parameter or its gradient: [H], any float dtype.
void validate_norm_param(const Placement& on, const char* op, const char* name, const Tensor& t,
                         int64_t h) {
  check_float(on, op, name, t);
  MG_CHECK(t.dim() == 1 && t.size(0) == h, op << ": " << name << " " << shape_str(t.shape())
                                              << " does not match x's last dim " << h);
}

// mean / rstd [N] in compute_dtype(x).
void validate_norm_stat(const Placement& on, const char* op, const char* name, const Tensor& t,
                        const Tensor& x, int64_t rows) {
  check_stat(on, op, name, t, "x", x);
  MG_CHECK(t.numel() == rows, op << ": " << name << " " << shape_str(t.shape()) << " has "
                                 << t.numel() << " elements, expected one per row of x "
                                 << shape_str(x.shape()) << " (" << rows << ")");
}

void validate_eps(const char* op, const NormArgs& args) {
  MG_CHECK(args.eps >= 0.0f, op << ": eps " << args.eps << " is negative");
}

}  // namespace

NormDims validate_layernorm_fwd(const Placement& on, const Tensor& y, const Tensor& mean,
                                const Tensor& rstd, const Tensor& x, const Tensor& gamma,
                                const Tensor& beta, const NormArgs& args) {
  const char* op = "layernorm_fwd";
  const NormDims d = validate_norm_x(on, op, x);
  validate_like_x(on, op, "y", y, x);
  validate_norm_param(on, op, "gamma", gamma, d.h);
  if (beta.defined()) validate_norm_param(on, op, "beta", beta, d.h);
  validate_norm_stat(on, op, "mean", mean, x, d.rows);
  validate_norm_stat(on, op, "rstd", rstd, x, d.rows);
  validate_eps(op, args);
  return d;
}

NormDims validate_layernorm_bwd(const Placement& on, const Tensor& dx, const Tensor& dgamma,
                                const Tensor& dbeta, const Tensor& dy, const Tensor& x,
                                const Tensor& mean, const Tensor& rstd, const Tensor& gamma) {
  const char* op = "layernorm_bwd";
  const NormDims d = validate_norm_x(on, op, x);
  validate_like_x(on, op, "dx", dx, x);
  validate_like_x(on, op, "dy", dy, x);
  validate_norm_param(on, op, "gamma", gamma, d.h);
  validate_norm_param(on, op, "dgamma", dgamma, d.h);
  if (dbeta.defined()) validate_norm_param(on, op, "dbeta", dbeta, d.h);
  validate_norm_stat(on, op, "mean", mean, x, d.rows);
  validate_norm_stat(on, op, "rstd", rstd, x, d.rows);
  return d;
}

NormDims validate_rmsnorm_fwd(const Placement& on, const Tensor& y, const Tensor& rstd,
                              const Tensor& x, const Tensor& gamma, const NormArgs& args) {
  const char* op = "rmsnorm_fwd";
  const NormDims d = validate_norm_x(on, op, x);
  validate_like_x(on, op, "y", y, x);
  validate_norm_param(on, op, "gamma", gamma, d.h);
  validate_norm_stat(on, op, "rstd", rstd, x, d.rows);
  validate_eps(op, args);
  return d;
}

NormDims validate_rmsnorm_bwd(const Placement& on, const Tensor& dx, const Tensor& dgamma,
                              const Tensor& dy, const Tensor& x, const Tensor& rstd,
                              const Tensor& gamma) {
  const char* op = "rmsnorm_bwd";
  const NormDims d = validate_norm_x(on, op, x);
  validate_like_x(on, op, "dx", dx, x);
  validate_like_x(on, op, "dy", dy, x);
  validate_norm_param(on, op, "gamma", gamma, d.h);
  validate_norm_param(on, op, "dgamma", dgamma, d.h);
  validate_norm_stat(on, op, "rstd", rstd, x, d.rows);
  return d;
}

namespace {

// The kind-dependent arguments of the fused norm ops: layernorm needs mean and may have beta;
// rmsnorm has neither.
void validate_norm_kind(const Placement& on, const char* op, NormKind kind, const char* mean_name,
                        const Tensor& mean, const char* beta_name, const Tensor& beta,
                        const Tensor& x, const NormDims& d) {
  MG_CHECK(kind == NormKind::layernorm || kind == NormKind::rmsnorm,
           op << ": unknown norm kind " << static_cast<int>(kind) << " (layernorm or rmsnorm)");
  if (kind == NormKind::layernorm) {
    validate_norm_stat(on, op, mean_name, mean, x, d.rows);
    if (beta.defined()) validate_norm_param(on, op, beta_name, beta, d.h);
  } else {
    MG_CHECK(!mean.defined(), op << ": " << mean_name << " " << mean.str()
                                 << " must be undefined for rmsnorm (it has no mean)");
    MG_CHECK(!beta.defined(), op << ": " << beta_name << " " << beta.str()
                                 << " must be undefined for rmsnorm (it has no bias)");
  }
}

}  // namespace

NormDims validate_bias_dropout_add_norm_fwd(const Placement& on, const Tensor& y, const Tensor& sum,
                                            const Tensor& mean, const Tensor& rstd, const Tensor& x,
                                            const Tensor& bias, const Tensor& residual,
                                            const Tensor& gamma, const Tensor& beta,
                                            const DropoutArgs& dropout, const NormArgs& args,
                                            NormKind kind) {
  const char* op = "bias_dropout_add_norm_fwd";
  validate_dropout_p(op, dropout);
  const NormDims d = validate_norm_x(on, op, x);
  check_like(on, op, "residual", residual, "x", x);
  check_like(on, op, "sum", sum, "x", x);
  validate_like_x(on, op, "y", y, x);
  MG_CHECK(!overlaps(y, sum),
           op << ": y " << y.str() << " overlaps sum " << sum.str() << " (both are outputs)");
  validate_bda_bias(on, op, bias, x, d.h);
  validate_norm_param(on, op, "gamma", gamma, d.h);
  validate_norm_kind(on, op, kind, "mean", mean, "beta", beta, x, d);
  validate_norm_stat(on, op, "rstd", rstd, x, d.rows);
  validate_eps(op, args);
  return d;
}

GemmDims validate_fp8_norm_cast_transpose(const Placement& on, const Tensor& q, const Tensor& qt,
                                          const Tensor& amax, const Tensor& sum, const Tensor& mean,
                                          const Tensor& rstd, const Tensor& x, const Tensor& bias,
                                          const Tensor& residual, const Tensor& gamma,
                                          const Tensor& beta, const Tensor& scale,
                                          const DropoutArgs& dropout, const NormArgs& args,
                                          NormKind kind) {
  const char* op = "fp8_norm_cast_transpose";
  const NormDims d = validate_norm_x(on, op, x);
  MG_CHECK(x.dtype() != DType::f64, op << ": x is f64, expected f32, bf16 or f16");
  check_scalar_f32(on, op, "amax", amax);
  check_scalar_f32(on, op, "scale", scale);
  if (q.defined()) {
    check_fp8(on, op, "q", q);
    MG_CHECK(
        q.dim() == 2 && q.size(0) == d.rows && q.size(1) == d.h,
        op << ": q " << shape_str(q.shape()) << ", expected [" << d.rows << ", " << d.h << "]");
  }
  if (qt.defined()) {
    check_fp8(on, op, "qt", qt);
    if (q.defined()) check_same_dtype(op, "qt", qt, "q", q);
    MG_CHECK(
        qt.dim() == 2 && qt.size(0) == d.h && qt.size(1) == d.rows,
        op << ": qt " << shape_str(qt.shape()) << ", expected [" << d.h << ", " << d.rows << "]");
  }
  if (residual.defined()) {
    validate_dropout_p(op, dropout);
    check_like(on, op, "residual", residual, "x", x);
    check_like(on, op, "sum", sum, "x", x);
    MG_CHECK(!overlaps(sum, x) && !overlaps(sum, residual),
             op << ": sum " << sum.str() << " overlaps x or residual (the function may run twice)");
    validate_bda_bias(on, op, bias, x, d.h);
  } else {
    MG_CHECK(!bias.defined() && !sum.defined(),
             op << ": bias / sum without a residual (the bias-dropout-add needs all three)");
  }
  validate_norm_param(on, op, "gamma", gamma, d.h);
  validate_norm_kind(on, op, kind, "mean", mean, "beta", beta, x, d);
  validate_norm_stat(on, op, "rstd", rstd, x, d.rows);
  validate_eps(op, args);
  for (const Tensor* t : {&q, &qt})
    MG_CHECK(!t->defined() || (!overlaps(*t, x) && !(residual.defined() && overlaps(*t, sum))),
             op << ": q / qt overlap an input");
  return GemmDims{.batch = 1, .m = d.rows, .n = d.h, .k = 0};
}

NormDims validate_norm_bwd_add(const Placement& on, const Tensor& dx, const Tensor& dgamma,
                               const Tensor& dbeta, const Tensor& dy, const Tensor& dresidual,
                               const Tensor& x, const Tensor& mean, const Tensor& rstd,
                               const Tensor& gamma, NormKind kind) {
  const char* op = "norm_bwd_add";
  const NormDims d = validate_norm_x(on, op, x);
  validate_like_x(on, op, "dx", dx, x);
  validate_like_x(on, op, "dy", dy, x);
  if (dresidual.defined()) {
    validate_like_x(on, op, "dresidual", dresidual, x);
    MG_CHECK(!overlaps(dx, dresidual), op << ": dx " << dx.str() << " overlaps dresidual "
                                          << dresidual.str() << " (dresidual is read after dx "
                                          << "is written; pass a separate dx)");
  }
  validate_norm_param(on, op, "gamma", gamma, d.h);
  validate_norm_param(on, op, "dgamma", dgamma, d.h);
  validate_norm_kind(on, op, kind, "mean", mean, "dbeta", dbeta, x, d);
  validate_norm_stat(on, op, "rstd", rstd, x, d.rows);
  return d;
}

// ---- optimizer ----------------------------------------------------------------------------------

namespace {

void validate_adam_param(const Placement& on, const AdamParam& a, std::size_t i) {
  constexpr const char* op = "adamw_step";
  const std::string at = "params[" + std::to_string(i) + "]";
  auto check = [&](const Tensor& t, const char* name) {
    const std::string full = at + "." + name;
    on.check(op, full.c_str(), t);
    check_float_dtype(op, full.c_str(), t);
    MG_CHECK(t.shape() == a.param.shape(), op << ": " << full << " " << shape_str(t.shape())
                                              << " does not match param "
                                              << shape_str(a.param.shape()));
  };
  check(a.param, "param");
  MG_CHECK(a.param.dtype() == DType::f32 || a.param.dtype() == DType::f64,
           op << ": " << at << ".param has dtype " << dtype_name(a.param.dtype())
              << "; master params must be f32 or f64");
  check(a.grad, "grad");
  check(a.exp_avg, "exp_avg");
  check(a.exp_avg_sq, "exp_avg_sq");
  for (const auto* s : {&a.exp_avg, &a.exp_avg_sq})
    MG_CHECK(s->dtype() == a.param.dtype(),
             op << ": " << at << (s == &a.exp_avg ? ".exp_avg" : ".exp_avg_sq") << " has dtype "
                << dtype_name(s->dtype()) << " but param has " << dtype_name(a.param.dtype()));
  if (a.model_param.defined()) check(a.model_param, "model_param");
}

}  // namespace

void validate_adamw(const Placement& on, std::span<const AdamParam> params, const AdamArgs& args) {
  constexpr const char* op = "adamw_step";
  MG_CHECK(args.step >= 1, op << ": step counts from 1, got " << args.step);
  MG_CHECK(args.lr >= 0.0f, op << ": lr must be >= 0, got " << args.lr);
  MG_CHECK(args.beta1 >= 0.0f && args.beta1 < 1.0f,
           op << ": beta1 must be in [0, 1), got " << args.beta1);
  MG_CHECK(args.beta2 >= 0.0f && args.beta2 < 1.0f,
           op << ": beta2 must be in [0, 1), got " << args.beta2);
  MG_CHECK(args.eps >= 0.0f, op << ": eps must be >= 0, got " << args.eps);
  MG_CHECK(args.weight_decay >= 0.0f,
           op << ": weight_decay must be >= 0, got " << args.weight_decay);
  MG_CHECK(std::isfinite(args.grad_scale),
           op << ": grad_scale must be finite, got " << args.grad_scale);
  for (std::size_t i = 0; i < params.size(); ++i) validate_adam_param(on, params[i], i);
}

void validate_l2_norm_sq(const Placement& on, const Tensor& out, std::span<const Tensor> xs) {
  constexpr const char* op = "l2_norm_sq";
  on.check(op, "out", out);
  MG_CHECK(out.numel() == 1 && (out.dtype() == DType::f32 || out.dtype() == DType::f64),
           op << ": out must be a single f32 or f64 element, got " << out.str());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::string name = "xs[" + std::to_string(i) + "]";
    check_float(on, op, name.c_str(), xs[i]);
  }
}

void validate_multi_tensor_scale(const Placement& on, std::span<const Tensor> xs,
                                 const Tensor& found_nonfinite) {
  constexpr const char* op = "multi_tensor_scale";
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::string name = "xs[" + std::to_string(i) + "]";
    check_float(on, op, name.c_str(), xs[i]);
  }
  if (found_nonfinite.defined()) {
    on.check(op, "found_nonfinite", found_nonfinite);
    MG_CHECK(found_nonfinite.numel() == 1 && found_nonfinite.dtype() == DType::f32,
             op << ": found_nonfinite must be a single f32 element, got " << found_nonfinite.str());
  }
}

// ---- rope ---------------------------------------------------------------------------------------

RopeDims validate_rope(const Placement& on, const char* op, const char* out_name, const Tensor& out,
                       const char* in_name, const Tensor& in, const RopeArgs& a) {
  check_float(on, op, in_name, in);
  MG_CHECK(in.dim() == 4,
           op << ": " << in_name << " must be [S, B, NH, HD], got " << shape_str(in.shape()));
  check_like(on, op, out_name, out, in_name, in);
  RopeDims p{in.size(0), in.size(1), in.size(2), in.size(3), 0, false};
  MG_CHECK(a.rotary_percent > 0.0f && a.rotary_percent <= 1.0f,
           op << ": rotary_percent " << a.rotary_percent << " is outside (0, 1]");
  MG_CHECK(a.base > 0.0f && std::isfinite(a.base), op << ": base " << a.base << " must be > 0");
  validate_rope_scaling(a.scaling, op);
  // Megatron: int(kv_channels * rotary_percent).
  p.rot = static_cast<int64_t>(static_cast<double>(p.hd) * static_cast<double>(a.rotary_percent));
  MG_CHECK(p.rot > 0 && p.rot % 2 == 0, op << ": rotary dim HD * rotary_percent = " << p.hd << " * "
                                           << a.rotary_percent << " = " << p.rot
                                           << " must be even and > 0");
  if (a.position_ids.defined()) {
    const Tensor& ids = a.position_ids;
    check_index(on, op, "position_ids", ids);
    const bool flat = ids.shape() == Shape{p.s};
    p.per_batch_positions = ids.shape() == (Shape{p.b, p.s});
    MG_CHECK(flat || p.per_batch_positions, op << ": position_ids " << shape_str(ids.shape())
                                               << " is neither [S] = " << shape_str(Shape{p.s})
                                               << " nor [B, S] = " << shape_str(Shape{p.b, p.s}));
  }
  return p;
}

// ---- softmax ------------------------------------------------------------------------------------

namespace {

void validate_rows(const Placement& on, const char* op, const char* name, const Tensor& t) {
  check_float(on, op, name, t);
  MG_CHECK(t.dim() >= 1, op << ": " << name << " must have rank >= 1, got a scalar");
}

void validate_scale(const char* op, float scale) {
  MG_CHECK(std::isfinite(scale), op << ": scale " << scale << " is not finite");
}

}  // namespace

void validate_softmax_fwd(const Placement& on, const char* op, const Tensor& y, const Tensor& x,
                          float scale) {
  validate_rows(on, op, "x", x);
  check_like(on, op, "y", y, "x", x);
  validate_scale(op, scale);
}

void validate_softmax_bwd(const Placement& on, const char* op, const Tensor& dx, const Tensor& dy,
                          const Tensor& y, float scale) {
  validate_rows(on, op, "y", y);
  check_like(on, op, "dy", dy, "y", y);
  check_like(on, op, "dx", dx, "y", y);
  validate_scale(op, scale);
}

// ---- MoE token permutation ---------------------------------------------------------------------

namespace {

void check_i64_vector(const Placement& on, const char* op, const char* name, const Tensor& t,
                      int64_t n) {
  on.check(op, name, t);
  MG_CHECK(t.dtype() == DType::i64 && t.dim() == 1 && t.size(0) == n,
           op << ": " << name << " is " << t.str() << ", expected [" << n << "] i64");
}

void check_matrix(const Placement& on, const char* op, const char* name, const Tensor& t) {
  on.check(op, name, t);
  check_float_dtype(op, name, t);
  MG_CHECK(t.dim() == 2, op << ": " << name << " is " << t.str() << ", expected [rows, hidden]");
}

void check_prob(const Placement& on, const char* op, const Tensor& prob, int64_t r) {
  if (!prob.defined()) return;
  on.check(op, "prob", prob);
  MG_CHECK(prob.dtype() == DType::f64 && prob.dim() == 1 && prob.size(0) == r,
           op << ": prob is " << prob.str() << ", expected [" << r << "] f64");
}

}  // namespace

MoePermuteDims validate_moe_permute(const Placement& on, const Tensor& rows, const Tensor& x,
                                    const Tensor& index) {
  const char* op = "moe_permute";
  // A row gather is a byte copy: any dtype (FP8 weight bytes too), as long as both match.
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"x", &x}, {"rows", &rows}}) {
    on.check(op, name, *t);
    MG_CHECK(t->dim() == 2,
             op << ": " << name << " is " << t->str() << ", expected [rows, hidden]");
  }
  check_same_dtype(op, "rows", rows, "x", x);
  MG_CHECK(rows.size(1) == x.size(1),
           op << ": rows " << rows.str() << " and x " << x.str() << " differ in hidden size");
  check_i64_vector(on, op, "index", index, rows.size(0));
  MG_CHECK(!overlaps(rows, x), op << ": rows must not alias x");
  return {x.size(0), rows.size(0), x.size(1)};
}

MoePermuteDims validate_moe_unpermute(const Placement& on, const Tensor& out, const Tensor& rows,
                                      const Tensor& prob, const Tensor& offsets,
                                      const Tensor& token_rows) {
  const char* op = "moe_unpermute";
  check_matrix(on, op, "rows", rows);
  check_matrix(on, op, "out", out);
  MG_CHECK(rows.size(1) == out.size(1),
           op << ": rows " << rows.str() << " and out " << out.str() << " differ in hidden size");
  check_prob(on, op, prob, rows.size(0));
  check_i64_vector(on, op, "offsets", offsets, out.size(0) + 1);
  check_i64_vector(on, op, "token_rows", token_rows, rows.size(0));
  MG_CHECK(!overlaps(out, rows), op << ": out must not alias rows");
  return {out.size(0), rows.size(0), out.size(1)};
}

MoeDispatchDims validate_moe_dispatch_index(const Placement& on, const Tensor& counts,
                                            const Tensor& choice_counts, const Tensor& row_choice,
                                            const Tensor& row_token, const Tensor& choice_offsets,
                                            const Tensor& choice_rows, const Tensor& token_offsets,
                                            const Tensor& token_rows, const Tensor& expert,
                                            const Tensor& kept, const MoeDispatchArgs& args) {
  const char* op = "moe_dispatch_index";
  on.check(op, "expert", expert);
  MG_CHECK(expert.dtype() == DType::i64 && expert.dim() == 1,
           op << ": expert is " << expert.str() << ", expected [choices] i64");
  MoeDispatchDims d;
  d.n = expert.size(0);
  d.k = args.topk;
  MG_CHECK(d.k >= 1 && d.n % d.k == 0,
           op << ": topk " << d.k << " must be >= 1 and divide the " << d.n << " choices");
  d.tokens = d.n / d.k;
  MG_CHECK(args.first_expert >= 0, op << ": first_expert " << args.first_expert << " is negative");
  MG_CHECK(args.count_first >= 0 && args.count_num >= 0 && args.count_first % d.k == 0 &&
               args.count_num % d.k == 0 && args.count_first + args.count_num <= d.n,
           op << ": the counted choices [" << args.count_first << ", "
              << args.count_first + args.count_num << ") must be whole tokens (multiples of topk "
              << d.k << ") within the " << d.n << " choices");
  if (kept.defined()) {
    on.check(op, "kept", kept);
    MG_CHECK(kept.dtype() == DType::u8 && kept.dim() == 1 && kept.size(0) == d.n,
             op << ": kept is " << kept.str() << ", expected [" << d.n << "] u8");
  }
  on.check(op, "counts", counts);
  MG_CHECK(counts.dtype() == DType::i64 && counts.dim() == 1 && counts.size(0) >= 1,
           op << ": counts is " << counts.str() << ", expected [experts >= 1] i64");
  d.l = counts.size(0);
  if (choice_counts.defined()) {
    on.check(op, "choice_counts", choice_counts);
    MG_CHECK(
        choice_counts.dtype() == DType::i64 && choice_counts.dim() == 2 &&
            choice_counts.size(0) >= 1 && choice_counts.size(1) >= 1,
        op << ": choice_counts is " << choice_counts.str() << ", expected [G >= 1, E >= 1] i64");
    d.g = choice_counts.size(0);
    d.e = choice_counts.size(1);
  }
  check_i64_vector(on, op, "row_choice", row_choice, d.n);
  check_i64_vector(on, op, "row_token", row_token, d.n);
  check_i64_vector(on, op, "choice_offsets", choice_offsets, d.n + 1);
  check_i64_vector(on, op, "choice_rows", choice_rows, d.n);
  check_i64_vector(on, op, "token_offsets", token_offsets, d.tokens + 1);
  check_i64_vector(on, op, "token_rows", token_rows, d.n);
  const std::pair<const char*, const Tensor*> outs[] = {{"counts", &counts},
                                                        {"choice_counts", &choice_counts},
                                                        {"row_choice", &row_choice},
                                                        {"row_token", &row_token},
                                                        {"choice_offsets", &choice_offsets},
                                                        {"choice_rows", &choice_rows},
                                                        {"token_offsets", &token_offsets},
                                                        {"token_rows", &token_rows}};
  for (std::size_t i = 0; i < std::size(outs); ++i) {
    if (!outs[i].second->defined()) continue;
    for (const Tensor* in : {&expert, &kept})
      MG_CHECK(!in->defined() || !overlaps(*outs[i].second, *in),
               op << ": " << outs[i].first << " must not alias an input");
    for (std::size_t j = i + 1; j < std::size(outs); ++j)
      MG_CHECK(!outs[j].second->defined() || !overlaps(*outs[i].second, *outs[j].second),
               op << ": " << outs[i].first << " and " << outs[j].first << " overlap");
  }
  return d;
}

void validate_moe_chunk_order(const Placement& on, const Tensor& order, const Tensor& inverse,
                              const Tensor& counts) {
  const char* op = "moe_chunk_order";
  on.check(op, "counts", counts);
  MG_CHECK(counts.dtype() == DType::i64 && counts.dim() == 2 && counts.size(0) >= 1 &&
               counts.size(1) >= 1,
           op << ": counts is " << counts.str() << ", expected [EP >= 1, L >= 1] i64");
  check_i64_vector(on, op, "order", order, order.defined() ? order.size(0) : 0);
  check_i64_vector(on, op, "inverse", inverse, order.size(0));
  MG_CHECK(!overlaps(order, inverse) && !overlaps(order, counts) && !overlaps(inverse, counts),
           op << ": order, inverse and counts must not overlap");
}

MoePermuteDims validate_moe_unpermute_bwd(const Placement& on, const Tensor& drows,
                                          const Tensor& dprob, const Tensor& dout,
                                          const Tensor& rows, const Tensor& prob,
                                          const Tensor& index) {
  const char* op = "moe_unpermute_bwd";
  check_matrix(on, op, "dout", dout);
  MG_CHECK(drows.defined() || dprob.defined(), op << ": needs drows, dprob or both");
  int64_t r = 0;
  if (drows.defined()) {
    check_matrix(on, op, "drows", drows);
    MG_CHECK(drows.size(1) == dout.size(1), op << ": drows " << drows.str() << " and dout "
                                               << dout.str() << " differ in hidden size");
    r = drows.size(0);
  }
  if (dprob.defined()) {
    MG_CHECK(rows.defined(), op << ": dprob needs the forward's rows");
    check_matrix(on, op, "rows", rows);
    MG_CHECK(rows.size(1) == dout.size(1), op << ": rows " << rows.str() << " and dout "
                                              << dout.str() << " differ in hidden size");
    MG_CHECK(!drows.defined() || rows.size(0) == r,
             op << ": rows " << rows.str() << " and drows " << drows.str() << " differ in rows");
    r = rows.size(0);
    on.check(op, "dprob", dprob);
    MG_CHECK(dprob.dtype() == DType::f64 && dprob.dim() == 1 && dprob.size(0) == r,
             op << ": dprob is " << dprob.str() << ", expected [" << r << "] f64");
  }
  check_prob(on, op, prob, r);
  check_i64_vector(on, op, "index", index, r);
  MG_CHECK(!drows.defined() || !overlaps(drows, dout), op << ": drows must not alias dout");
  return {dout.size(0), r, dout.size(1)};
}

// ---- MoE shared-expert gate --------------------------------------------------------------------

namespace {

// A [T, H] kernel-float matrix named `name` (dtype f64 when f64_only).
void check_th(const Placement& on, const char* op, const char* name, const Tensor& t, int64_t rows,
              int64_t h, bool f64_only = false) {
  check_matrix(on, op, name, t);
  MG_CHECK(t.size(0) == rows && t.size(1) == h,
           op << ": " << name << " is " << t.str() << ", expected [" << rows << ", " << h << "]");
  MG_CHECK(!f64_only || t.dtype() == DType::f64,
           op << ": " << name << " is " << t.str() << ", expected f64");
}

// w [H] or [1, H], a kernel float.
void check_gate_weight(const Placement& on, const char* op, const Tensor& w, int64_t h) {
  on.check(op, "w", w);
  check_float_dtype(op, "w", w);
  MG_CHECK(w.numel() == h && (w.dim() == 1 || (w.dim() == 2 && w.size(0) == 1)),
           op << ": w is " << w.str() << ", expected [" << h << "] or [1, " << h << "]");
}

void check_gate(const Placement& on, const char* op, const Tensor& gate, int64_t t) {
  on.check(op, "gate", gate);
  MG_CHECK(gate.dtype() == DType::f64 && gate.dim() == 1 && gate.size(0) == t,
           op << ": gate is " << gate.str() << ", expected [" << t << "] f64");
}

}  // namespace

MoeSharedGateDims validate_moe_shared_gate_fwd(const Placement& on, const Tensor& out,
                                               const Tensor& gate, const Tensor& y, const Tensor& z,
                                               const Tensor& x, const Tensor& w) {
  const char* op = "moe_shared_gate_fwd";
  check_matrix(on, op, "x", x);
  const int64_t t = x.size(0), h = x.size(1);
  check_th(on, op, "out", out, t, h);
  check_th(on, op, "y", y, t, h, /*f64_only=*/true);
  check_th(on, op, "z", z, t, h);
  check_gate_weight(on, op, w, h);
  check_gate(on, op, gate, t);
  for (const Tensor* in : {&y, &z, &x, &w})
    MG_CHECK(!overlaps(out, *in) && !overlaps(gate, *in),
             op << ": out and gate must not overlap the inputs");
  return {t, h};
}

MoeSharedGateDims validate_moe_shared_gate_bwd(const Placement& on, const Tensor& dz,
                                               const Tensor& dx, const Tensor& dw, const Tensor& dy,
                                               const Tensor& z, const Tensor& x, const Tensor& w,
                                               const Tensor& gate) {
  const char* op = "moe_shared_gate_bwd";
  check_matrix(on, op, "dy", dy);
  const int64_t t = dy.size(0), h = dy.size(1);
  check_th(on, op, "dz", dz, t, h);
  check_th(on, op, "dx", dx, t, h);
  check_th(on, op, "z", z, t, h);
  check_th(on, op, "x", x, t, h);
  check_gate_weight(on, op, w, h);
  check_gate(on, op, gate, t);
  on.check(op, "dw", dw);
  MG_CHECK(dw.dtype() == DType::f64 && dw.numel() == h,
           op << ": dw is " << dw.str() << ", expected [" << h << "] f64");
  for (const Tensor* o : {&dz, &dx, &dw})
    for (const Tensor* in : {&dy, &z, &x, &w, &gate})
      MG_CHECK(!overlaps(*o, *in), op << ": dz, dx and dw must not overlap the inputs");
  return {t, h};
}

namespace {

void check_router_tensor(const Placement& on, const char* op, const char* name, const Tensor& t,
                         DType dtype, int64_t rows, int64_t cols) {
  on.check(op, name, t);
  const bool vec = cols < 0;
  MG_CHECK(t.dtype() == dtype && t.dim() == (vec ? 1 : 2) && t.size(0) == rows &&
               (vec || t.size(1) == cols),
           op << ": " << name << " is " << t.str() << ", expected [" << rows
              << (vec ? std::string() : ", " + std::to_string(cols)) << "] " << dtype_name(dtype));
}

MoeRouterDims check_router_common(const Placement& on, const char* op, const Tensor& logits,
                                  const Tensor& expert, const Tensor& prob, const Tensor& kept,
                                  const Tensor& scores, const MoeRouterArgs& a) {
  on.check(op, "logits", logits);
  MG_CHECK((logits.dtype() == DType::f32 || logits.dtype() == DType::f64) && logits.dim() == 2,
           op << ": logits is " << logits.str() << ", expected [tokens, experts] f32 or f64");
  const int64_t t = logits.size(0), e = logits.size(1), k = a.topk;
  MG_CHECK(e >= 1 && k >= 1 && k <= e, op << ": topk " << k << " of " << e << " experts");
  if (a.group_topk > 0)
    MG_CHECK(a.num_groups >= 1 && e % a.num_groups == 0 && a.group_topk <= a.num_groups &&
                 k % a.group_topk == 0 && k / a.group_topk <= e / a.num_groups,
             op << ": group-limited routing of topk " << k << " over " << a.num_groups
                << " groups (" << a.group_topk << " chosen) of " << e << " experts");
  MG_CHECK(!a.capacity_factor || (std::isfinite(*a.capacity_factor) && *a.capacity_factor > 0.0),
           op << ": capacity_factor " << *a.capacity_factor << " must be positive");
  MG_CHECK(!a.scaling_factor || std::isfinite(*a.scaling_factor),
           op << ": scaling_factor " << *a.scaling_factor << " must be finite");
  MG_CHECK(std::isfinite(a.z_loss_coeff) && a.z_loss_coeff >= 0.0 && std::isfinite(a.z_loss_scale),
           op << ": z_loss_coeff " << a.z_loss_coeff << " must be >= 0 and z_loss_scale "
              << a.z_loss_scale << " finite");
  check_router_tensor(on, op, "expert", expert, DType::i64, t, k);
  check_router_tensor(on, op, "prob", prob, DType::f64, t, k);
  check_router_tensor(on, op, "kept", kept, DType::u8, t, k);
  check_router_tensor(on, op, "scores", scores, DType::f64, t, e);
  return {t, e, k};
}

void check_router_rows(const Placement& on, const char* op, const char* name, const Tensor& t,
                       int64_t e) {
  on.check(op, name, t);
  MG_CHECK(t.dtype() == DType::f64 && t.dim() == 2 && t.size(0) >= 1 && t.size(1) == e,
           op << ": " << name << " is " << t.str() << ", expected [rows >= 1, " << e << "] f64");
}

}  // namespace

MoeRouterDims validate_moe_router_topk(const Placement& on, const Tensor& expert,
                                       const Tensor& prob, const Tensor& kept, const Tensor& scores,
                                       const Tensor& tokens_per_expert, const Tensor& expert_counts,
                                       const Tensor& aux_sums, const Tensor& z_sum,
                                       const Tensor& logits, const Tensor& expert_bias,
                                       const MoeRouterArgs& args) {
  const char* op = "moe_router_topk";
  const MoeRouterDims d = check_router_common(on, op, logits, expert, prob, kept, scores, args);
  if (tokens_per_expert.defined())
    check_router_tensor(on, op, "tokens_per_expert", tokens_per_expert, DType::f64, d.e, -1);
  if (expert_counts.defined())
    check_router_tensor(on, op, "expert_counts", expert_counts, DType::i64, d.e, -1);
  if (aux_sums.defined()) check_router_rows(on, op, "aux_sums", aux_sums, d.e);
  if (z_sum.defined()) check_router_tensor(on, op, "z_sum", z_sum, DType::f64, 1, -1);
  if (expert_bias.defined()) {
    check_router_tensor(on, op, "expert_bias", expert_bias, DType::f32, d.e, -1);
    MG_CHECK(args.score == MoeRouterScore::sigmoid, op << ": an expert bias needs sigmoid scores");
  }
  const Tensor* outs[] = {&expert,        &prob,     &kept, &scores, &tokens_per_expert,
                          &expert_counts, &aux_sums, &z_sum};
  for (const Tensor* o : outs) {
    MG_CHECK(!overlaps(*o, logits) && !overlaps(*o, expert_bias),
             op << ": the outputs must not alias logits or expert_bias");
    for (const Tensor* q : outs)
      MG_CHECK(o == q || !overlaps(*o, *q), op << ": the outputs must not alias each other");
  }
  return d;
}

MoeRouterDims validate_moe_router_topk_bwd(const Placement& on, const Tensor& dlogits,
                                           const Tensor& dprob, const Tensor& aux_dscores,
                                           const Tensor& logits, const Tensor& expert,
                                           const Tensor& prob, const Tensor& kept,
                                           const Tensor& scores, const MoeRouterArgs& args) {
  const char* op = "moe_router_topk_bwd";
  const MoeRouterDims d = check_router_common(on, op, logits, expert, prob, kept, scores, args);
  check_router_tensor(on, op, "dlogits", dlogits, DType::f64, d.t, d.e);
  check_router_tensor(on, op, "dprob", dprob, DType::f64, d.t, d.k);
  if (aux_dscores.defined()) check_router_rows(on, op, "aux_dscores", aux_dscores, d.e);
  const Tensor* ins[] = {&dprob, &aux_dscores, &logits, &expert, &prob, &kept, &scores};
  for (const Tensor* i : ins)
    MG_CHECK(!overlaps(dlogits, *i), op << ": dlogits must not alias its inputs");
  return d;
}

void validate_moe_indices(const char* op, const char* name, std::span<const int64_t> v, int64_t n) {
  for (std::size_t i = 0; i < v.size(); ++i)
    MG_CHECK(v[i] >= 0 && v[i] < n,
             op << ": " << name << "[" << i << "] = " << v[i] << " is outside [0, " << n << ")");
}

}  // namespace mg::ops
