#include "formats/tensor_bytes.h"

#include "core/error.h"

namespace qlft {

HeldBytes HeldBytes::given(const char* writer, const std::string& name, const void* data,
                           uint64_t nbytes, bool copy) {
  QLFT_CHECK_ARG(data || nbytes == 0, "%s: tensor '%s' data is NULL", writer, name.c_str());
  HeldBytes b{static_cast<const uint8_t*>(data), nbytes, nullptr, false};
  if (copy) {
    b.owned = std::make_shared<std::vector<uint8_t>>(b.data, b.data + nbytes);
    b.data = b.owned->data();
  }
  return b;
}

void HeldBytes::check_writable(const char* writer, const std::string& name,
                               const TensorFetch& fetch) const {
  QLFT_CHECK_ARG(!deferred || fetch, "%s: tensor '%s' has no bytes to write", writer, name.c_str());
}

uint64_t checked_elements(const char* writer, const std::string& name,
                          const std::vector<int64_t>& shape, int64_t min_dim) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    QLFT_CHECK_ARG(d >= min_dim && d <= (int64_t(1) << 40), "%s: tensor '%s' dimension %lld",
                   writer, name.c_str(), static_cast<long long>(d));
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

uint64_t shape_elements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d > 0 ? d : 0);
  return n;
}

}  // namespace qlft
