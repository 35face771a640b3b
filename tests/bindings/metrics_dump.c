/* Prints every field of every record qlft_metrics_read gives for a metrics.jsonl file, as
 * canonical lines ("records N", then "I.field value"); the Rust and Go bindings' tests print
 * the same lines from their own wrappers and compare them with these (tests/bindings,
 * run_metrics_c.sh). A float is its IEEE-754 bit pattern in hex (exact, and spelled the same
 * in every language) or "nan"; memory per category is "I.memory.CATEGORY bytes".
 * usage: qlft_metrics_dump METRICS_JSONL */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qlft.h"

static void f64(size_t i, const char* name, double v) {
  uint64_t bits;
  if (isnan(v)) {
    printf("%zu.%s nan\n", i, name);
    return;
  }
  memcpy(&bits, &v, sizeof bits);
  printf("%zu.%s %016" PRIx64 "\n", i, name, bits);
}

static void u64(size_t i, const char* name, uint64_t v) {
  printf("%zu.%s %" PRIu64 "\n", i, name, v);
}

static void per_category(size_t i, const char* name, const uint64_t* v) {
  int c;
  for (c = 0; c < QLFT_MEM_CATEGORY_COUNT; ++c)
    printf("%zu.%s.%s %" PRIu64 "\n", i, name, qlft_memory_category_name(c), v[c]);
}

int main(int argc, char** argv) {
  qlft_metrics_record* recs;
  size_t n = 0, i;
  int32_t st;
  if (argc != 2) {
    fprintf(stderr, "usage: %s METRICS_JSONL\n", argv[0]);
    return 2;
  }
  if ((st = qlft_metrics_read(argv[1], NULL, 0, &n)) != QLFT_OK) {
    fprintf(stderr, "qlft_metrics_read: %s: %s\n", qlft_status_string(st), qlft_last_error());
    return 1;
  }
  recs = calloc(n ? n : 1, sizeof *recs);
  if (!recs) return 1;
  recs[0].struct_size = sizeof *recs;
  if (n && (st = qlft_metrics_read(argv[1], recs, n, &n)) != QLFT_OK) {
    fprintf(stderr, "qlft_metrics_read: %s: %s\n", qlft_status_string(st), qlft_last_error());
    free(recs);
    return 1;
  }
  printf("records %zu\n", n);
  for (i = 0; i < n; ++i) {
    const qlft_metrics_record* r = &recs[i];
    u64(i, "step", r->step);
    f64(i, "loss", r->loss);
    f64(i, "learning_rate", r->learning_rate);
    f64(i, "grad_norm", r->grad_norm);
    f64(i, "loss_scale", r->loss_scale);
    u64(i, "skipped", r->skipped);
    u64(i, "tokens", r->tokens);
    f64(i, "tokens_per_second", r->tokens_per_second);
    f64(i, "elapsed_seconds", r->elapsed_seconds);
    f64(i, "eval_loss", r->eval_loss);
    f64(i, "margin", r->margin);
    u64(i, "memory_reserved", r->memory_reserved);
    u64(i, "memory_peak", r->memory_peak);
    per_category(i, "memory", r->memory);
    per_category(i, "memory_category_peak", r->memory_category_peak);
    per_category(i, "predicted", r->predicted);
    u64(i, "predicted_total", r->predicted_total);
  }
  free(recs);
  return 0;
}
