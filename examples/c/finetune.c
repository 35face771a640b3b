/*
 * finetune.c - a minimal, complete qlft client in C99.
 *
 * Loads a model, configures a small fp32 LoRA fine-tune, tokenizes a text file, trains with a
 * progress callback, and saves a PEFT adapter directory. Every status is checked; failures
 * print qlft_status_string + qlft_last_error and exit nonzero.
 *
 *   finetune MODEL.gguf DATA.txt OUT_DIR [STEPS] [THREADS]
 *
 * The Rust and Go bindings run the same fine-tune (see FINETUNE_SETTINGS below and
 * tests/bindings/), and their adapter_model.safetensors must be byte-identical to this one's.
 */
#include <stdio.h>
#include <stdlib.h>

#include "qlft.h"

/* Prints the failure of `what` and returns 1, so `return fail(...)` exits with an error. */
static int fail(const char* what, int32_t status) {
  fprintf(stderr, "finetune: %s failed: %s: %s\n", what, qlft_status_string(status),
          qlft_last_error());
  return 1;
}

static int32_t on_progress(const qlft_step_stats* s, void* user_data) {
  unsigned* calls = (unsigned*)user_data;
  ++*calls;
  printf("step %llu/%llu  loss %.4f  lr %.2e  grad_norm %.3f  %.0f tok/s\n",
         (unsigned long long)s->step, (unsigned long long)s->total_steps, (double)s->loss,
         (double)s->learning_rate, (double)s->grad_norm, s->tokens_per_second);
  fflush(stdout);
  return 0; /* nonzero would cancel training after this step */
}

int main(int argc, char** argv) {
  qlft_config* cfg = NULL;
  qlft_runtime* rt = NULL;
  qlft_model* model = NULL;
  qlft_dataset* data = NULL;
  qlft_trainer* trainer = NULL;
  qlft_model_details info;
  qlft_dataset_stats stats;
  unsigned calls = 0;
  int32_t st;
  int rc = 1;
  size_t i;
  const char* steps = argc > 4 ? argv[4] : "4";
  const char* threads = argc > 5 ? argv[5] : "1";
  /* The shared fine-tune: fp32, unquantized base, fixed seeds, one thread. */
  const char* settings[][2] = {
      {"quant.type", "keep"}, {"train.precision", "fp32"}, {"lora.r", "8"},
      {"lora.alpha", "16"},   {"optim.lr", "1e-3"},        {"seed", "42"},
      {"data.seq_len", "32"}, {"train.micro_batch", "2"},  {"train.max_steps", steps},
      {"threads", threads},
  };

  if (argc < 4) {
    fprintf(stderr, "usage: %s MODEL DATA OUT_DIR [STEPS] [THREADS]\n", argv[0]);
    return 2;
  }
  printf("%s\n", qlft_build_info());
  if (qlft_version_number() / 100 != QLFT_VERSION_NUMBER / 100) {
    fprintf(stderr, "finetune: header %d and library %u differ\n", QLFT_VERSION_NUMBER,
            (unsigned)qlft_version_number());
    return 1;
  }

  if ((st = qlft_config_create(&cfg)) != QLFT_OK) return fail("qlft_config_create", st);
  for (i = 0; i < sizeof settings / sizeof settings[0]; ++i) {
    if ((st = qlft_config_set(cfg, settings[i][0], settings[i][1])) != QLFT_OK) {
      fail("qlft_config_set", st);
      goto done;
    }
  }
  if ((st = qlft_runtime_create(cfg, &rt)) != QLFT_OK) {
    fail("qlft_runtime_create", st);
    goto done;
  }
  if ((st = qlft_model_load(rt, argv[1], cfg, &model)) != QLFT_OK) {
    fail("qlft_model_load", st);
    goto done;
  }
  info.struct_size = sizeof info;
  if ((st = qlft_model_info(model, &info)) != QLFT_OK) {
    fail("qlft_model_info", st);
    goto done;
  }
  printf("model: %s, %u layers, dim %u, vocab %u, %llu parameters\n", info.architecture,
         (unsigned)info.n_layers, (unsigned)info.dim, (unsigned)info.vocab_size,
         (unsigned long long)info.n_params);
  if ((st = qlft_dataset_load(model, argv[2], cfg, &data)) != QLFT_OK) {
    fail("qlft_dataset_load", st);
    goto done;
  }
  stats.struct_size = sizeof stats;
  if ((st = qlft_dataset_get_stats(data, &stats)) != QLFT_OK) {
    fail("qlft_dataset_get_stats", st);
    goto done;
  }
  printf("data: %llu records, %llu tokens, %llu train sequences\n",
         (unsigned long long)stats.records, (unsigned long long)stats.tokens,
         (unsigned long long)stats.train_sequences);
  if ((st = qlft_trainer_create(model, data, cfg, &trainer)) != QLFT_OK) {
    fail("qlft_trainer_create", st);
    goto done;
  }
  if ((st = qlft_trainer_train(trainer, on_progress, &calls)) != QLFT_OK) {
    fail("qlft_trainer_train", st);
    goto done;
  }
  if (calls == 0) {
    fprintf(stderr, "finetune: the progress callback never ran\n");
    goto done;
  }
  if ((st = qlft_trainer_save_adapter(trainer, argv[3], "peft")) != QLFT_OK) {
    fail("qlft_trainer_save_adapter", st);
    goto done;
  }
  printf("adapter written to %s\n", argv[3]);
  rc = 0;

done: /* reverse order of creation; each free accepts NULL */
  qlft_trainer_free(trainer);
  qlft_dataset_free(data);
  qlft_model_free(model);
  qlft_runtime_free(rt);
  qlft_config_free(cfg);
  return rc;
}
