/* Prints the size and field offsets of every result struct of qlft.h as canonical lines
 * ("struct.field offset" and "struct size N"); the Rust and Go bindings print the same list
 * from their own declarations, and tests/bindings/compare_layout.sh diffs them. */
#include <stddef.h>
#include <stdio.h>

#include "qlft.h"

#define S(t) printf(#t " size %zu\n", sizeof(t))
#define F(t, f) printf(#t "." #f " %zu\n", offsetof(t, f))

int main(void) {
  S(qlft_config_key);
  F(qlft_config_key, struct_size);
  F(qlft_config_key, name);
  F(qlft_config_key, type);
  F(qlft_config_key, default_value);
  F(qlft_config_key, allowed);
  F(qlft_config_key, doc);

  S(qlft_memory_report);
  F(qlft_memory_report, struct_size);
  F(qlft_memory_report, limit);
  F(qlft_memory_report, allocated);
  F(qlft_memory_report, reserved);
  F(qlft_memory_report, peak);
  F(qlft_memory_report, total_reserved);
  F(qlft_memory_report, total_peak);
  F(qlft_memory_report, process_peak_rss);

  S(qlft_model_details);
  F(qlft_model_details, struct_size);
  F(qlft_model_details, architecture);
  F(qlft_model_details, quant_type);
  F(qlft_model_details, source_format);
  F(qlft_model_details, n_layers);
  F(qlft_model_details, dim);
  F(qlft_model_details, n_heads);
  F(qlft_model_details, n_kv_heads);
  F(qlft_model_details, head_dim);
  F(qlft_model_details, ffn_dim);
  F(qlft_model_details, vocab_size);
  F(qlft_model_details, context_length);
  F(qlft_model_details, rope_theta);
  F(qlft_model_details, rms_norm_eps);
  F(qlft_model_details, tied_embeddings);
  F(qlft_model_details, rope_adjacent_pairs);
  F(qlft_model_details, n_params);
  F(qlft_model_details, weight_bytes);

  S(qlft_dataset_stats);
  F(qlft_dataset_stats, struct_size);
  F(qlft_dataset_stats, records);
  F(qlft_dataset_stats, dropped_records);
  F(qlft_dataset_stats, tokens);
  F(qlft_dataset_stats, trained_tokens);
  F(qlft_dataset_stats, train_sequences);
  F(qlft_dataset_stats, eval_sequences);
  F(qlft_dataset_stats, fill_ratio);
  F(qlft_dataset_stats, histogram_bucket_width);
  F(qlft_dataset_stats, length_histogram);

  S(qlft_step_stats);
  F(qlft_step_stats, struct_size);
  F(qlft_step_stats, step);
  F(qlft_step_stats, total_steps);
  F(qlft_step_stats, loss);
  F(qlft_step_stats, learning_rate);
  F(qlft_step_stats, grad_norm);
  F(qlft_step_stats, loss_scale);
  F(qlft_step_stats, skipped);
  F(qlft_step_stats, tokens);
  F(qlft_step_stats, tokens_per_second);
  F(qlft_step_stats, elapsed_seconds);
  F(qlft_step_stats, eta_seconds);
  F(qlft_step_stats, memory_reserved);
  F(qlft_step_stats, memory_peak);
  F(qlft_step_stats, eval_loss);
  F(qlft_step_stats, host_to_device_bytes);
  F(qlft_step_stats, device_to_host_bytes);
  F(qlft_step_stats, device_syncs);
  F(qlft_step_stats, device_launches);
  F(qlft_step_stats, rewards_chosen);
  F(qlft_step_stats, rewards_rejected);
  F(qlft_step_stats, rewards_margins);
  F(qlft_step_stats, rewards_accuracies);
  F(qlft_step_stats, logps_chosen);
  F(qlft_step_stats, logps_rejected);
  F(qlft_step_stats, nll_loss);
  F(qlft_step_stats, kl);

  S(qlft_eval_result);
  F(qlft_eval_result, struct_size);
  F(qlft_eval_result, loss);
  F(qlft_eval_result, perplexity);
  F(qlft_eval_result, tokens);

  S(qlft_generated_token);
  F(qlft_generated_token, struct_size);
  F(qlft_generated_token, id);
  F(qlft_generated_token, index);
  F(qlft_generated_token, finish_reason);
  F(qlft_generated_token, text);
  F(qlft_generated_token, text_len);

  S(qlft_metrics_record);
  F(qlft_metrics_record, struct_size);
  F(qlft_metrics_record, step);
  F(qlft_metrics_record, loss);
  F(qlft_metrics_record, learning_rate);
  F(qlft_metrics_record, grad_norm);
  F(qlft_metrics_record, loss_scale);
  F(qlft_metrics_record, skipped);
  F(qlft_metrics_record, tokens);
  F(qlft_metrics_record, tokens_per_second);
  F(qlft_metrics_record, elapsed_seconds);
  F(qlft_metrics_record, eval_loss);
  F(qlft_metrics_record, margin);
  F(qlft_metrics_record, memory_reserved);
  F(qlft_metrics_record, memory_peak);
  F(qlft_metrics_record, memory);
  F(qlft_metrics_record, memory_category_peak);
  F(qlft_metrics_record, predicted);
  F(qlft_metrics_record, predicted_total);
  return 0;
}
