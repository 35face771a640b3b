/* A program outside the qlft tree, built against an installed qlft (pkg-config or
 * find_package): prints the library version, then greedy-generates N tokens from a prompt
 * (qlft_generate's text, then the streamed ids and finish reason).
 *   qlft-consumer MODEL PROMPT N */
#include <qlft.h>
#include <stdio.h>
#include <stdlib.h>

static int32_t print_text(const char* text, void* user) {
  (void)user;
  fputs(text, stdout);
  return 0;
}

static int fail(const char* what, int32_t st) {
  fprintf(stderr, "%s: %s: %s\n", what, qlft_status_string(st), qlft_last_error());
  return 1;
}

int main(int argc, char** argv) {
  qlft_config* cfg = NULL;
  qlft_runtime* rt = NULL;
  qlft_model* model = NULL;
  int32_t st;
  if (argc != 4) {
    fprintf(stderr, "usage: %s MODEL PROMPT N\n", argv[0]);
    return 2;
  }
  printf("qlft %s\n", qlft_version_string());
  if ((st = qlft_config_create(&cfg)) != QLFT_OK) return fail("config", st);
  if ((st = qlft_config_set(cfg, "threads", "1")) != QLFT_OK ||
      (st = qlft_config_set(cfg, "generate.max_tokens", argv[3])) != QLFT_OK)
    return fail("config_set", st);
  if ((st = qlft_runtime_create(cfg, &rt)) != QLFT_OK) return fail("runtime", st);
  if ((st = qlft_model_load(rt, argv[1], cfg, &model)) != QLFT_OK) return fail("model", st);
  fputs("text: ", stdout);
  if ((st = qlft_generate(model, NULL, argv[2], cfg, print_text, NULL)) != QLFT_OK)
    return fail("generate", st);
  fputs("\n", stdout);
  /* The same generation streamed: every token's id, and why it ended. */
  {
    static const char* const reasons[] = {"none", "eos", "length", "stop", "cancelled"};
    qlft_generation* gen = NULL;
    qlft_generated_token tok;
    tok.finish_reason = QLFT_FINISH_NONE;
    if ((st = qlft_generation_create(model, NULL, argv[2], cfg, NULL, 0, &gen)) != QLFT_OK)
      return fail("generation", st);
    fputs("ids:", stdout);
    while (tok.finish_reason == QLFT_FINISH_NONE) {
      tok.struct_size = sizeof tok;
      if ((st = qlft_generation_next(gen, &tok)) != QLFT_OK) return fail("next", st);
      if (tok.id >= 0) printf(" %d", (int)tok.id);
    }
    printf("\nfinish: %s\n", reasons[tok.finish_reason]);
    qlft_generation_free(gen);
  }
  qlft_model_free(model);
  qlft_runtime_free(rt);
  qlft_config_free(cfg);
  return 0;
}
