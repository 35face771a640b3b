// Loading of bitsandbytes-prequantized weights as transformers' save_pretrained writes them.
// NF4: `<p>.weight` packed codes (uint8, or another quant_storage dtype holding the same bytes),
// `<p>.weight.absmax`, `.weight.quant_map`, (double quant) `.weight.nested_absmax`,
// `.weight.nested_quant_map`, and `.weight.quant_state.bitsandbytes__nf4`: uint8 bytes of a JSON
// object {quant_type, blocksize, dtype, shape, nested_blocksize, nested_offset, ...}.
// INT8: `<p>.weight` int8 [out, in] + `<p>.SCB` per-row absmax.
#include "formats/safetensors_bnb.h"

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "quant/nf4.h"
#include "quant/nf4_math.h"

namespace qlft {

namespace {

std::string shape_str(const SafeTensorInfo& t) {
  std::string s = "[";
  for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

const SafeTensorInfo& need(const SafetensorsSet& st, const std::string& name,
                           const std::string& why) {
  const SafeTensorInfo* t = st.find(name);
  QLFT_CHECK_FORMAT(t, "bitsandbytes weight: tensor '%s' is missing (%s)", name.c_str(),
                    why.c_str());
  return *t;
}

// A float vector of exactly n elements (F32, or F16/BF16 widened exactly).
void read_floats(const SafeTensorInfo& t, int64_t n, float* dst) {
  QLFT_CHECK_FORMAT(t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16,
                    "bitsandbytes weight: tensor '%s' has dtype %s, expected a float type",
                    t.name.c_str(), dtype_name(t.dtype));
  QLFT_CHECK_FORMAT(t.numel() == n && t.nbytes == static_cast<uint64_t>(n) * dtype_size(t.dtype),
                    "bitsandbytes weight: tensor '%s' has shape %s, expected %lld elements",
                    t.name.c_str(), shape_str(t).c_str(), static_cast<long long>(n));
  to_f32_n(t.dtype, t.data, dst, static_cast<size_t>(n));
}

Buffer float_buffer(MemoryTracker* tracker, const SafeTensorInfo& t, int64_t n, const char* what) {
  Buffer b(tracker, MemCategory::Weights, static_cast<size_t>(n) * 4, what);
  read_floats(t, n, b.as<float>());
  return b;
}

void load_nf4(MemoryTracker* tracker, const SafetensorsSet& st, const std::string& prefix,
              const SafeTensorInfo& weight, const SafeTensorInfo& state, int64_t rows, int64_t cols,
              QWeight* out) {
  const std::string& sname = state.name;
  QLFT_CHECK_FORMAT(state.dtype == DType::U8,
                    "bitsandbytes weight: '%s' must be uint8 JSON bytes, got %s", sname.c_str(),
                    dtype_name(state.dtype));
  nlohmann::json js;
  try {
    js = nlohmann::json::parse(reinterpret_cast<const char*>(state.data),
                               reinterpret_cast<const char*>(state.data) + state.nbytes);
  } catch (const std::exception& e) {
    throw_error(QLFT_ERR_FORMAT, "bitsandbytes weight: '%s' is not valid JSON: %s", sname.c_str(),
                e.what());
  }
  QLFT_CHECK_FORMAT(js.is_object(), "bitsandbytes weight: '%s' is not a JSON object",
                    sname.c_str());
  auto field = [&](const char* key) -> const nlohmann::json& {
    auto it = js.find(key);
    QLFT_CHECK_FORMAT(it != js.end(), "bitsandbytes weight: '%s' has no \"%s\"", sname.c_str(),
                      key);
    return *it;
  };
  const nlohmann::json& qt = field("quant_type");
  QLFT_CHECK_FORMAT(qt.is_string(), "bitsandbytes weight: '%s': quant_type is not a string",
                    sname.c_str());
  if (qt.get<std::string>() != "nf4")
    throw_error(QLFT_ERR_UNSUPPORTED,
                "bitsandbytes weight: '%s': quant_type '%s' is not supported (only nf4)",
                sname.c_str(), qt.get<std::string>().c_str());
  const nlohmann::json& jbs = field("blocksize");
  QLFT_CHECK_FORMAT(jbs.is_number_integer(),
                    "bitsandbytes weight: '%s': blocksize is not an integer", sname.c_str());
  const int64_t bs = jbs.get<int64_t>();
  QLFT_CHECK_FORMAT(bs >= 2 && bs <= 65536 && (bs & (bs - 1)) == 0,
                    "bitsandbytes weight: '%s': blocksize %lld is not a power of two in [2, 65536]",
                    sname.c_str(), static_cast<long long>(bs));
  const nlohmann::json& jshape = field("shape");
  QLFT_CHECK_FORMAT(jshape.is_array() && jshape.size() == 2 && jshape[0].is_number_integer() &&
                        jshape[1].is_number_integer(),
                    "bitsandbytes weight: '%s': shape must be [out, in]", sname.c_str());
  const int64_t r = jshape[0].get<int64_t>(), c = jshape[1].get<int64_t>();
  QLFT_CHECK_FORMAT(r == rows && c == cols,
                    "bitsandbytes weight: '%s': shape [%lld, %lld], expected [%lld, %lld]",
                    sname.c_str(), static_cast<long long>(r), static_cast<long long>(c),
                    static_cast<long long>(rows), static_cast<long long>(cols));
  QLFT_CHECK_FORMAT(rows > 0 && cols > 0 && rows <= (int64_t(1) << 40) / cols,
                    "bitsandbytes weight: '%s': bad shape", sname.c_str());
  const int64_t n = rows * cols;
  const int64_t nb = nf4_num_blocks(n, bs);

  // packed codes: any storage dtype, exactly ceil(n / 2) bytes
  QLFT_CHECK_FORMAT(
      weight.nbytes == static_cast<uint64_t>(nf4_packed_bytes(n)),
      "bitsandbytes weight: '%s' (%s %s) holds %llu bytes, NF4 [%lld, %lld] needs %lld",
      weight.name.c_str(), dtype_name(weight.dtype), shape_str(weight).c_str(),
      static_cast<unsigned long long>(weight.nbytes), static_cast<long long>(rows),
      static_cast<long long>(cols), static_cast<long long>(nf4_packed_bytes(n)));

  // the code book must be NF4's
  const std::string wp = prefix + ".weight";
  const SafeTensorInfo& qmap = need(st, wp + ".quant_map", "the NF4 code book");
  float code[16];
  read_floats(qmap, 16, code);
  for (uint32_t k = 0; k < 16; ++k)
    QLFT_CHECK_FORMAT(code[k] == nf4_value(k),
                      "bitsandbytes weight: '%s'[%u] = %g is not the NF4 code book",
                      qmap.name.c_str(), k, static_cast<double>(code[k]));

  QWeight w;
  w.kind = QuantKind::NF4;
  w.rows = rows;
  w.cols = cols;
  w.blocksize = static_cast<int32_t>(bs);
  w.data = Buffer(tracker, MemCategory::Weights, weight.nbytes, "nf4 codes");
  std::memcpy(w.data.data(), weight.data, weight.nbytes);
  w.code = Buffer(tracker, MemCategory::Weights, 16 * 4, "nf4 code book");
  std::memcpy(w.code.data(), code, sizeof code);

  const SafeTensorInfo& absmax = need(st, wp + ".absmax", "per-block absmax");
  const SafeTensorInfo* nested = st.find(wp + ".nested_absmax");
  const bool dq = js.contains("nested_blocksize") || nested;
  if (!dq) {
    w.absmax = float_buffer(tracker, absmax, nb, "nf4 absmax");
  } else {
    w.double_quant = true;
    const nlohmann::json& jnbs = field("nested_blocksize");
    QLFT_CHECK_FORMAT(
        jnbs.is_number_integer() && jnbs.get<int64_t>() > 0 && jnbs.get<int64_t>() <= 65536,
        "bitsandbytes weight: '%s': nested_blocksize must be a positive integer", sname.c_str());
    const nlohmann::json& joff = field("nested_offset");
    QLFT_CHECK_FORMAT(joff.is_number() && std::isfinite(joff.get<double>()),
                      "bitsandbytes weight: '%s': nested_offset must be a finite number",
                      sname.c_str());
    w.nested_blocksize = static_cast<int32_t>(jnbs.get<int64_t>());
    // bitsandbytes writes the float32 offset through Python's float: the double is exact.
    w.nested_offset = static_cast<float>(joff.get<double>());
    QLFT_CHECK_FORMAT(
        absmax.dtype == DType::U8 && absmax.numel() == nb &&
            absmax.nbytes == static_cast<uint64_t>(nb),
        "bitsandbytes weight: '%s' (%s %s) must be %lld uint8 codes (double quantization)",
        absmax.name.c_str(), dtype_name(absmax.dtype), shape_str(absmax).c_str(),
        static_cast<long long>(nb));
    w.absmax = Buffer(tracker, MemCategory::Weights, nb, "nf4 absmax codes");
    std::memcpy(w.absmax.data(), absmax.data, nb);
    const SafeTensorInfo& na = need(st, wp + ".nested_absmax", "double quantization");
    w.nested_absmax =
        float_buffer(tracker, na, nf4_num_blocks(nb, w.nested_blocksize), "nf4 nested absmax");
    const SafeTensorInfo& nq = need(st, wp + ".nested_quant_map", "double quantization");
    w.nested_code = float_buffer(tracker, nq, 256, "nf4 nested code");
  }
  *out = std::move(w);
}

void load_int8(MemoryTracker* tracker, const SafeTensorInfo& weight, const SafeTensorInfo& scb,
               int64_t rows, int64_t cols, QWeight* out) {
  QLFT_CHECK_FORMAT(weight.dtype == DType::I8,
                    "bitsandbytes weight: '%s' has dtype %s, LLM.int8 weights are int8",
                    weight.name.c_str(), dtype_name(weight.dtype));
  QLFT_CHECK_FORMAT(
      weight.shape.size() == 2 && weight.shape[0] == rows && weight.shape[1] == cols &&
          weight.nbytes == static_cast<uint64_t>(rows * cols),
      "bitsandbytes weight: '%s' has shape %s, expected [%lld, %lld]", weight.name.c_str(),
      shape_str(weight).c_str(), static_cast<long long>(rows), static_cast<long long>(cols));
  QWeight w;
  w.kind = QuantKind::INT8;
  w.rows = rows;
  w.cols = cols;
  w.scb = float_buffer(tracker, scb, rows, "int8 SCB");
  const float* s = w.scb.as<float>();
  for (int64_t r = 0; r < rows; ++r)
    QLFT_CHECK_FORMAT(std::isfinite(s[r]) && s[r] >= 0,
                      "bitsandbytes weight: '%s'[%lld] = %g is not a valid row absmax",
                      scb.name.c_str(), static_cast<long long>(r), static_cast<double>(s[r]));
  w.data = Buffer(tracker, MemCategory::Weights, weight.nbytes, "int8 codes");
  std::memcpy(w.data.data(), weight.data, weight.nbytes);
  *out = std::move(w);
}

}  // namespace

bool load_bnb_weight(MemoryTracker* tracker, const SafetensorsSet& st, const std::string& prefix,
                     int64_t rows, int64_t cols, QWeight* out) {
  const std::string wname = prefix + ".weight";
  const SafeTensorInfo* weight = st.find(wname);
  if (!weight) return false;  // the caller reports the missing weight
  if (const SafeTensorInfo* fp4 = st.find(wname + ".quant_state.bitsandbytes__fp4"))
    throw_error(QLFT_ERR_UNSUPPORTED,
                "bitsandbytes weight: '%s': FP4 quantization is not supported (only NF4)",
                fp4->name.c_str());
  if (const SafeTensorInfo* state = st.find(wname + ".quant_state.bitsandbytes__nf4")) {
    load_nf4(tracker, st, prefix, *weight, *state, rows, cols, out);
    return true;
  }
  if (const SafeTensorInfo* scb = st.find(prefix + ".SCB")) {
    load_int8(tracker, *weight, *scb, rows, cols, out);
    return true;
  }
  // Quantization side tensors without their state, or integer codes without scales, cannot be
  // read as a plain weight.
  QLFT_CHECK_FORMAT(
      !st.find(wname + ".absmax"),
      "bitsandbytes weight: '%s.absmax' exists but '%s.quant_state.bitsandbytes__nf4' is missing",
      wname.c_str(), wname.c_str());
  QLFT_CHECK_FORMAT(weight->dtype != DType::I8 && weight->dtype != DType::U8,
                    "bitsandbytes weight: '%s' is %s but has no quantization state ('%s.SCB' or "
                    "'%s.quant_state.bitsandbytes__nf4')",
                    wname.c_str(), dtype_name(weight->dtype), prefix.c_str(), wname.c_str());
  return false;
}

}  // namespace qlft
