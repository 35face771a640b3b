// qlft-finetune inspect MODEL: architecture, shapes, quantization and memory of a base model.
#include <cstdio>
#include <string>

#include "cli.h"

namespace cli {

namespace {
// qlft_model_describe's text ("" if it fails: inspect still prints the rest).
std::string describe(const qlft_model* model, int32_t what) {
  size_t need = 0;
  if (qlft_model_describe(model, what, nullptr, 0, &need) != QLFT_OK) return "";
  std::string s(need, '\0');
  if (qlft_model_describe(model, what, s.data(), s.size(), &need) != QLFT_OK) return "";
  s.resize(need - 1);
  return s;
}
}  // namespace

int cmd_inspect(int argc, char** argv) {
  Args a;
  std::string err;
  if (!parse_args(argc, argv, 2, {}, {"help"}, &a, &err, 1) || a.flags.count("help") ||
      a.positional.size() != 1) {
    std::fprintf(stderr, "%s%susage: qlft-finetune inspect MODEL [--quant.type nf4|int8|keep]\n",
                 err.c_str(), err.empty() ? "" : "\n");
    return a.flags.count("help") && err.empty() ? kOk : kUsage;
  }
  int code = kOk;
  ConfigPtr cfg = make_config(a, &code);
  if (!cfg) return code;
  TrainSession s;
  if (int rc = open_model(a.positional[0], cfg.get(), &s)) return rc;
  qlft_model* model = s.model.get();
  qlft_runtime* rt = s.runtime.get();
  qlft_model_details d{};
  d.struct_size = sizeof d;
  int32_t st = qlft_model_info(model, &d);
  if (st != QLFT_OK) return fail("model info", st);

  std::printf("model           %s\n", a.positional[0].c_str());
  std::printf("format          %s\n", d.source_format);
  std::printf("architecture    %s (%s)\n", d.architecture,
              describe(model, QLFT_DESCRIBE_HF_CLASS).c_str());
  std::printf("deltas          %s\n", describe(model, QLFT_DESCRIBE_DELTAS).c_str());
  std::printf("layers          %u\n", d.n_layers);
  std::printf("dim             %u\n", d.dim);
  std::printf("heads           %u (kv %u, head dim %u)\n", d.n_heads, d.n_kv_heads, d.head_dim);
  std::printf("ffn             %u\n", d.ffn_dim);
  std::printf("vocab           %u\n", d.vocab_size);
  std::printf("context         %u\n", d.context_length);
  std::printf("rope theta      %g (%s)\n", d.rope_theta,
              d.rope_adjacent_pairs ? "adjacent pairs, GGUF order" : "rotate-half, HF order");
  std::printf("rms eps         %g\n", d.rms_norm_eps);
  std::printf("tied embedding  %s\n", d.tied_embeddings ? "yes" : "no");
  std::printf("linear weights  %s\n", d.quant_type);
  std::printf("parameters      %llu\n", static_cast<unsigned long long>(d.n_params));
  std::printf("weight bytes    %s\n", human_bytes(d.weight_bytes).c_str());

  qlft_memory_report r{};
  r.struct_size = sizeof r;
  if (qlft_runtime_memory_report(rt, &r) == QLFT_OK) {
    std::printf("memory          %-14s %12s %12s\n", "category", "reserved", "peak");
    for (int i = 0; i < QLFT_MEM_CATEGORY_COUNT; ++i)
      std::printf("                %-14s %12s %12s\n", qlft_memory_category_name(i),
                  human_bytes(r.reserved[i]).c_str(), human_bytes(r.peak[i]).c_str());
    std::printf("peak RSS        %s\n", human_bytes(r.process_peak_rss).c_str());
  }
  return kOk;
}

}  // namespace cli
