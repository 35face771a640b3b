package qlft

// #include "qlft.h"
import "C"

import (
	"fmt"
	"unsafe"
)

// LayoutLines lists the size and field offsets of every result struct as cgo lays them out,
// in the canonical form of tests/bindings/layout.c, so a test can compare them with the C
// compiler's view.
func LayoutLines() []string {
	var v []string
	f := func(name string, off uintptr) { v = append(v, fmt.Sprintf("%s %d", name, off)) }
	var v_qlft_config_key C.qlft_config_key
	v = append(v, fmt.Sprintf("qlft_config_key size %d", unsafe.Sizeof(v_qlft_config_key)))
	f("qlft_config_key.struct_size", unsafe.Offsetof(v_qlft_config_key.struct_size))
	f("qlft_config_key.name", unsafe.Offsetof(v_qlft_config_key.name))
	f("qlft_config_key.type", unsafe.Offsetof(v_qlft_config_key._type))
	f("qlft_config_key.default_value", unsafe.Offsetof(v_qlft_config_key.default_value))
	f("qlft_config_key.allowed", unsafe.Offsetof(v_qlft_config_key.allowed))
	f("qlft_config_key.doc", unsafe.Offsetof(v_qlft_config_key.doc))
	var v_qlft_memory_report C.qlft_memory_report
	v = append(v, fmt.Sprintf("qlft_memory_report size %d", unsafe.Sizeof(v_qlft_memory_report)))
	f("qlft_memory_report.struct_size", unsafe.Offsetof(v_qlft_memory_report.struct_size))
	f("qlft_memory_report.limit", unsafe.Offsetof(v_qlft_memory_report.limit))
	f("qlft_memory_report.allocated", unsafe.Offsetof(v_qlft_memory_report.allocated))
	f("qlft_memory_report.reserved", unsafe.Offsetof(v_qlft_memory_report.reserved))
	f("qlft_memory_report.peak", unsafe.Offsetof(v_qlft_memory_report.peak))
	f("qlft_memory_report.total_reserved", unsafe.Offsetof(v_qlft_memory_report.total_reserved))
	f("qlft_memory_report.total_peak", unsafe.Offsetof(v_qlft_memory_report.total_peak))
	f("qlft_memory_report.process_peak_rss", unsafe.Offsetof(v_qlft_memory_report.process_peak_rss))
	var v_qlft_model_details C.qlft_model_details
	v = append(v, fmt.Sprintf("qlft_model_details size %d", unsafe.Sizeof(v_qlft_model_details)))
	f("qlft_model_details.struct_size", unsafe.Offsetof(v_qlft_model_details.struct_size))
	f("qlft_model_details.architecture", unsafe.Offsetof(v_qlft_model_details.architecture))
	f("qlft_model_details.quant_type", unsafe.Offsetof(v_qlft_model_details.quant_type))
	f("qlft_model_details.source_format", unsafe.Offsetof(v_qlft_model_details.source_format))
	f("qlft_model_details.n_layers", unsafe.Offsetof(v_qlft_model_details.n_layers))
	f("qlft_model_details.dim", unsafe.Offsetof(v_qlft_model_details.dim))
	f("qlft_model_details.n_heads", unsafe.Offsetof(v_qlft_model_details.n_heads))
	f("qlft_model_details.n_kv_heads", unsafe.Offsetof(v_qlft_model_details.n_kv_heads))
	f("qlft_model_details.head_dim", unsafe.Offsetof(v_qlft_model_details.head_dim))
	f("qlft_model_details.ffn_dim", unsafe.Offsetof(v_qlft_model_details.ffn_dim))
	f("qlft_model_details.vocab_size", unsafe.Offsetof(v_qlft_model_details.vocab_size))
	f("qlft_model_details.context_length", unsafe.Offsetof(v_qlft_model_details.context_length))
	f("qlft_model_details.rope_theta", unsafe.Offsetof(v_qlft_model_details.rope_theta))
	f("qlft_model_details.rms_norm_eps", unsafe.Offsetof(v_qlft_model_details.rms_norm_eps))
	f("qlft_model_details.tied_embeddings", unsafe.Offsetof(v_qlft_model_details.tied_embeddings))
	f("qlft_model_details.rope_adjacent_pairs", unsafe.Offsetof(v_qlft_model_details.rope_adjacent_pairs))
	f("qlft_model_details.n_params", unsafe.Offsetof(v_qlft_model_details.n_params))
	f("qlft_model_details.weight_bytes", unsafe.Offsetof(v_qlft_model_details.weight_bytes))
	var v_qlft_dataset_stats C.qlft_dataset_stats
	v = append(v, fmt.Sprintf("qlft_dataset_stats size %d", unsafe.Sizeof(v_qlft_dataset_stats)))
	f("qlft_dataset_stats.struct_size", unsafe.Offsetof(v_qlft_dataset_stats.struct_size))
	f("qlft_dataset_stats.records", unsafe.Offsetof(v_qlft_dataset_stats.records))
	f("qlft_dataset_stats.dropped_records", unsafe.Offsetof(v_qlft_dataset_stats.dropped_records))
	f("qlft_dataset_stats.tokens", unsafe.Offsetof(v_qlft_dataset_stats.tokens))
	f("qlft_dataset_stats.trained_tokens", unsafe.Offsetof(v_qlft_dataset_stats.trained_tokens))
	f("qlft_dataset_stats.train_sequences", unsafe.Offsetof(v_qlft_dataset_stats.train_sequences))
	f("qlft_dataset_stats.eval_sequences", unsafe.Offsetof(v_qlft_dataset_stats.eval_sequences))
	f("qlft_dataset_stats.fill_ratio", unsafe.Offsetof(v_qlft_dataset_stats.fill_ratio))
	f("qlft_dataset_stats.histogram_bucket_width", unsafe.Offsetof(v_qlft_dataset_stats.histogram_bucket_width))
	f("qlft_dataset_stats.length_histogram", unsafe.Offsetof(v_qlft_dataset_stats.length_histogram))
	var v_qlft_step_stats C.qlft_step_stats
	v = append(v, fmt.Sprintf("qlft_step_stats size %d", unsafe.Sizeof(v_qlft_step_stats)))
	f("qlft_step_stats.struct_size", unsafe.Offsetof(v_qlft_step_stats.struct_size))
	f("qlft_step_stats.step", unsafe.Offsetof(v_qlft_step_stats.step))
	f("qlft_step_stats.total_steps", unsafe.Offsetof(v_qlft_step_stats.total_steps))
	f("qlft_step_stats.loss", unsafe.Offsetof(v_qlft_step_stats.loss))
	f("qlft_step_stats.learning_rate", unsafe.Offsetof(v_qlft_step_stats.learning_rate))
	f("qlft_step_stats.grad_norm", unsafe.Offsetof(v_qlft_step_stats.grad_norm))
	f("qlft_step_stats.loss_scale", unsafe.Offsetof(v_qlft_step_stats.loss_scale))
	f("qlft_step_stats.skipped", unsafe.Offsetof(v_qlft_step_stats.skipped))
	f("qlft_step_stats.tokens", unsafe.Offsetof(v_qlft_step_stats.tokens))
	f("qlft_step_stats.tokens_per_second", unsafe.Offsetof(v_qlft_step_stats.tokens_per_second))
	f("qlft_step_stats.elapsed_seconds", unsafe.Offsetof(v_qlft_step_stats.elapsed_seconds))
	f("qlft_step_stats.eta_seconds", unsafe.Offsetof(v_qlft_step_stats.eta_seconds))
	f("qlft_step_stats.memory_reserved", unsafe.Offsetof(v_qlft_step_stats.memory_reserved))
	f("qlft_step_stats.memory_peak", unsafe.Offsetof(v_qlft_step_stats.memory_peak))
	f("qlft_step_stats.eval_loss", unsafe.Offsetof(v_qlft_step_stats.eval_loss))
	f("qlft_step_stats.host_to_device_bytes", unsafe.Offsetof(v_qlft_step_stats.host_to_device_bytes))
	f("qlft_step_stats.device_to_host_bytes", unsafe.Offsetof(v_qlft_step_stats.device_to_host_bytes))
	f("qlft_step_stats.device_syncs", unsafe.Offsetof(v_qlft_step_stats.device_syncs))
	f("qlft_step_stats.device_launches", unsafe.Offsetof(v_qlft_step_stats.device_launches))
	var v_qlft_eval_result C.qlft_eval_result
	v = append(v, fmt.Sprintf("qlft_eval_result size %d", unsafe.Sizeof(v_qlft_eval_result)))
	f("qlft_eval_result.struct_size", unsafe.Offsetof(v_qlft_eval_result.struct_size))
	f("qlft_eval_result.loss", unsafe.Offsetof(v_qlft_eval_result.loss))
	f("qlft_eval_result.perplexity", unsafe.Offsetof(v_qlft_eval_result.perplexity))
	f("qlft_eval_result.tokens", unsafe.Offsetof(v_qlft_eval_result.tokens))
	var v_qlft_generated_token C.qlft_generated_token
	v = append(v, fmt.Sprintf("qlft_generated_token size %d", unsafe.Sizeof(v_qlft_generated_token)))
	f("qlft_generated_token.struct_size", unsafe.Offsetof(v_qlft_generated_token.struct_size))
	f("qlft_generated_token.id", unsafe.Offsetof(v_qlft_generated_token.id))
	f("qlft_generated_token.index", unsafe.Offsetof(v_qlft_generated_token.index))
	f("qlft_generated_token.finish_reason", unsafe.Offsetof(v_qlft_generated_token.finish_reason))
	f("qlft_generated_token.text", unsafe.Offsetof(v_qlft_generated_token.text))
	f("qlft_generated_token.text_len", unsafe.Offsetof(v_qlft_generated_token.text_len))
	var v_qlft_metrics_record C.qlft_metrics_record
	v = append(v, fmt.Sprintf("qlft_metrics_record size %d", unsafe.Sizeof(v_qlft_metrics_record)))
	f("qlft_metrics_record.struct_size", unsafe.Offsetof(v_qlft_metrics_record.struct_size))
	f("qlft_metrics_record.step", unsafe.Offsetof(v_qlft_metrics_record.step))
	f("qlft_metrics_record.loss", unsafe.Offsetof(v_qlft_metrics_record.loss))
	f("qlft_metrics_record.learning_rate", unsafe.Offsetof(v_qlft_metrics_record.learning_rate))
	f("qlft_metrics_record.grad_norm", unsafe.Offsetof(v_qlft_metrics_record.grad_norm))
	f("qlft_metrics_record.loss_scale", unsafe.Offsetof(v_qlft_metrics_record.loss_scale))
	f("qlft_metrics_record.skipped", unsafe.Offsetof(v_qlft_metrics_record.skipped))
	f("qlft_metrics_record.tokens", unsafe.Offsetof(v_qlft_metrics_record.tokens))
	f("qlft_metrics_record.tokens_per_second", unsafe.Offsetof(v_qlft_metrics_record.tokens_per_second))
	f("qlft_metrics_record.elapsed_seconds", unsafe.Offsetof(v_qlft_metrics_record.elapsed_seconds))
	f("qlft_metrics_record.eval_loss", unsafe.Offsetof(v_qlft_metrics_record.eval_loss))
	f("qlft_metrics_record.margin", unsafe.Offsetof(v_qlft_metrics_record.margin))
	f("qlft_metrics_record.memory_reserved", unsafe.Offsetof(v_qlft_metrics_record.memory_reserved))
	f("qlft_metrics_record.memory_peak", unsafe.Offsetof(v_qlft_metrics_record.memory_peak))
	f("qlft_metrics_record.memory", unsafe.Offsetof(v_qlft_metrics_record.memory))
	f("qlft_metrics_record.memory_category_peak", unsafe.Offsetof(v_qlft_metrics_record.memory_category_peak))
	f("qlft_metrics_record.predicted", unsafe.Offsetof(v_qlft_metrics_record.predicted))
	f("qlft_metrics_record.predicted_total", unsafe.Offsetof(v_qlft_metrics_record.predicted_total))
	return v
}
