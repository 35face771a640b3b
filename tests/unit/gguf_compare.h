// Shared by the GGUF export suites: a GGUF qlft wrote against a reference GGUF written by
// gguf-py with llama.cpp's names (tests/reference).
#pragma once

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "quant/ggml_types.h"

namespace model_test {

// Every tensor of ref is in ours with ref's type and shape (values: both F32 with the same
// floats); returns the names ours holds beyond ref's.
inline std::set<std::string> expect_tensors_like(const qlft::GgufFile& ours,
                                                 const qlft::GgufFile& ref, bool values) {
  std::set<std::string> extra;
  for (const qlft::GgufTensorInfo& t : ours.tensors()) extra.insert(t.name);
  for (const qlft::GgufTensorInfo& t : ref.tensors()) {
    const qlft::GgufTensorInfo* o = ours.find_tensor(t.name);
    if (!o) {
      ADD_FAILURE() << "tensor " << t.name << " not written";
      continue;
    }
    extra.erase(t.name);
    EXPECT_EQ(o->type, t.type) << t.name;
    const std::vector<int64_t> shape(t.ne, t.ne + 4);
    EXPECT_EQ(std::vector<int64_t>(o->ne, o->ne + 4), shape) << t.name;
    if (!values || o->type != t.type || std::vector<int64_t>(o->ne, o->ne + 4) != shape) continue;
    if (t.type != static_cast<uint32_t>(qlft::GgmlType::F32)) {
      ADD_FAILURE() << t.name << ": values compared for F32 tensors only";
      continue;
    }
    const float* a = reinterpret_cast<const float*>(o->data);
    const float* b = reinterpret_cast<const float*>(t.data);
    EXPECT_EQ(std::vector<float>(a, a + o->numel()), std::vector<float>(b, b + t.numel()))
        << t.name;
  }
  return extra;
}

}  // namespace model_test
