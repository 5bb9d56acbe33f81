// musacoder's lightest build tier for a load_inline `.cu` (docs/verifier.md, "Cold builds"): found first on the
// `.cu`'s include path (-I), in place of torch/types.h, whose <ATen/ATen.h> declares every operator (half the
// `.cu`'s parse). Used only for sources that name nothing beyond what is declared here (backends/cuda.py
// `_LIGHTEST`): Tensor and its methods, the factories below, dtypes, TORCH_CHECK, the AT_DISPATCH macros. A build
// that does not compile with it is discarded and the candidate's own sources are built.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace torch {
using namespace at;  // as torch/types.h: torch::Tensor, torch::empty_like, ... are ATen's
using std::nullopt;
using std::optional;
using Dtype = at::ScalarType;
constexpr auto kUInt8 = at::kByte;
constexpr auto kInt8 = at::kChar;
constexpr auto kInt16 = at::kShort;
constexpr auto kInt32 = at::kInt;
constexpr auto kInt64 = at::kLong;
constexpr auto kFloat16 = at::kHalf;
constexpr auto kFloat32 = at::kFloat;
constexpr auto kFloat64 = at::kDouble;
}  // namespace torch
