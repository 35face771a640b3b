//! Raw declarations mirroring include/qlft.h one for one (written by hand; the layout of every
//! result struct is checked against the C compiler's by tests/bindings/compare_layout.sh).
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_void};

pub const QLFT_VERSION_MAJOR: u32 = 0;
pub const QLFT_VERSION_MINOR: u32 = 1;
pub const QLFT_VERSION_PATCH: u32 = 0;
pub const QLFT_VERSION_NUMBER: u32 =
    QLFT_VERSION_MAJOR * 10000 + QLFT_VERSION_MINOR * 100 + QLFT_VERSION_PATCH;

pub const QLFT_OK: i32 = 0;
pub const QLFT_ERR_INVALID_ARGUMENT: i32 = 1;
pub const QLFT_ERR_IO: i32 = 2;
pub const QLFT_ERR_FORMAT: i32 = 3;
pub const QLFT_ERR_UNSUPPORTED: i32 = 4;
pub const QLFT_ERR_OUT_OF_MEMORY: i32 = 5;
pub const QLFT_ERR_NUMERICAL: i32 = 6;
pub const QLFT_ERR_CANCELLED: i32 = 7;
pub const QLFT_ERR_BACKEND: i32 = 8;
pub const QLFT_ERR_DISTRIBUTED: i32 = 9;
pub const QLFT_ERR_INTERNAL: i32 = 10;

pub const QLFT_LOG_ERROR: i32 = 0;
pub const QLFT_LOG_WARN: i32 = 1;
pub const QLFT_LOG_INFO: i32 = 2;
pub const QLFT_LOG_DEBUG: i32 = 3;

pub const QLFT_MEM_WEIGHTS: i32 = 0;
pub const QLFT_MEM_ADAPTER: i32 = 1;
pub const QLFT_MEM_GRADIENTS: i32 = 2;
pub const QLFT_MEM_OPTIMIZER: i32 = 3;
pub const QLFT_MEM_ACTIVATIONS: i32 = 4;
pub const QLFT_MEM_WORKSPACE: i32 = 5;
pub const QLFT_MEM_COMMUNICATION: i32 = 6;
pub const QLFT_MEM_CATEGORY_COUNT: usize = 7;
pub const QLFT_HISTOGRAM_BUCKETS: usize = 16;

#[repr(C)]
pub struct qlft_config {
    _p: [u8; 0],
}
#[repr(C)]
pub struct qlft_runtime {
    _p: [u8; 0],
}
#[repr(C)]
pub struct qlft_model {
    _p: [u8; 0],
}
#[repr(C)]
pub struct qlft_dataset {
    _p: [u8; 0],
}
#[repr(C)]
pub struct qlft_trainer {
    _p: [u8; 0],
}

pub type qlft_log_fn =
    Option<unsafe extern "C" fn(level: i32, message: *const c_char, user: *mut c_void)>;
pub type qlft_progress_fn =
    Option<unsafe extern "C" fn(stats: *const qlft_step_stats, user: *mut c_void) -> i32>;
pub type qlft_text_fn = Option<unsafe extern "C" fn(text: *const c_char, user: *mut c_void) -> i32>;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct qlft_config_key {
    pub struct_size: u32,
    pub name: *const c_char,
    pub type_: *const c_char,
    pub default_value: *const c_char,
    pub allowed: *const c_char,
    pub doc: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct qlft_memory_report {
    pub struct_size: u32,
    pub limit: u64,
    pub allocated: [u64; QLFT_MEM_CATEGORY_COUNT],
    pub reserved: [u64; QLFT_MEM_CATEGORY_COUNT],
    pub peak: [u64; QLFT_MEM_CATEGORY_COUNT],
    pub total_reserved: u64,
    pub total_peak: u64,
    pub process_peak_rss: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct qlft_model_details {
    pub struct_size: u32,
    pub architecture: [c_char; 32],
    pub quant_type: [c_char; 16],
    pub source_format: [c_char; 16],
    pub n_layers: u32,
    pub dim: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub ffn_dim: u32,
    pub vocab_size: u32,
    pub context_length: u32,
    pub rope_theta: f32,
    pub rms_norm_eps: f32,
    pub tied_embeddings: u32,
    pub rope_adjacent_pairs: u32,
    pub n_params: u64,
    pub weight_bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct qlft_dataset_stats {
    pub struct_size: u32,
    pub records: u64,
    pub dropped_records: u64,
    pub tokens: u64,
    pub trained_tokens: u64,
    pub train_sequences: u64,
    pub eval_sequences: u64,
    pub fill_ratio: f64,
    pub histogram_bucket_width: u32,
    pub length_histogram: [u64; QLFT_HISTOGRAM_BUCKETS],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct qlft_step_stats {
    pub struct_size: u32,
    pub step: u64,
    pub total_steps: u64,
    pub loss: f32,
    pub learning_rate: f32,
    pub grad_norm: f32,
    pub loss_scale: f32,
    pub skipped: u32,
    pub tokens: u64,
    pub tokens_per_second: f64,
    pub elapsed_seconds: f64,
    pub eta_seconds: f64,
    pub memory_reserved: u64,
    pub memory_peak: u64,
    pub eval_loss: f32,
    pub host_to_device_bytes: u64,
    pub device_to_host_bytes: u64,
    pub device_syncs: u64,
    pub device_launches: u64,
    pub rewards_chosen: f64,
    pub rewards_rejected: f64,
    pub rewards_margins: f64,
    pub rewards_accuracies: f64,
    pub logps_chosen: f64,
    pub logps_rejected: f64,
    pub nll_loss: f64,
    pub kl: f64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct qlft_eval_result {
    pub struct_size: u32,
    pub loss: f64,
    pub perplexity: f64,
    pub tokens: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct qlft_metrics_record {
    pub struct_size: u32,
    pub step: u64,
    pub loss: f64,
    pub learning_rate: f64,
    pub grad_norm: f64,
    pub loss_scale: f64,
    pub skipped: u32,
    pub tokens: u64,
    pub tokens_per_second: f64,
    pub elapsed_seconds: f64,
    pub eval_loss: f64,
    pub margin: f64,
    pub memory_reserved: u64,
    pub memory_peak: u64,
    pub memory: [u64; QLFT_MEM_CATEGORY_COUNT],
    pub memory_category_peak: [u64; QLFT_MEM_CATEGORY_COUNT],
    pub predicted: [u64; QLFT_MEM_CATEGORY_COUNT],
    pub predicted_total: u64,
}

extern "C" {
    pub fn qlft_version_number() -> u32;
    pub fn qlft_version_string() -> *const c_char;
    pub fn qlft_build_info() -> *const c_char;
    pub fn qlft_status_string(status: i32) -> *const c_char;
    pub fn qlft_last_error() -> *const c_char;
    pub fn qlft_set_log_callback(f: qlft_log_fn, user: *mut c_void, max_level: i32);

    pub fn qlft_config_create(out: *mut *mut qlft_config) -> i32;
    pub fn qlft_config_free(config: *mut qlft_config);
    pub fn qlft_config_set(
        config: *mut qlft_config,
        key: *const c_char,
        value: *const c_char,
    ) -> i32;
    pub fn qlft_config_get(
        config: *const qlft_config,
        key: *const c_char,
        buf: *mut c_char,
        buf_size: usize,
        needed: *mut usize,
    ) -> i32;
    pub fn qlft_config_load_file(config: *mut qlft_config, path: *const c_char) -> i32;
    pub fn qlft_config_key_count() -> usize;
    pub fn qlft_config_key_at(index: usize, out: *mut qlft_config_key) -> i32;

    pub fn qlft_runtime_create(config: *const qlft_config, out: *mut *mut qlft_runtime) -> i32;
    pub fn qlft_runtime_free(runtime: *mut qlft_runtime);
    pub fn qlft_memory_category_name(category: i32) -> *const c_char;
    pub fn qlft_runtime_memory_report(
        runtime: *const qlft_runtime,
        out: *mut qlft_memory_report,
    ) -> i32;

    pub fn qlft_model_load(
        runtime: *mut qlft_runtime,
        path: *const c_char,
        config: *const qlft_config,
        out: *mut *mut qlft_model,
    ) -> i32;
    pub fn qlft_model_free(model: *mut qlft_model);
    pub fn qlft_model_info(model: *const qlft_model, out: *mut qlft_model_details) -> i32;

    pub fn qlft_tokenize(
        model: *const qlft_model,
        text: *const c_char,
        text_len: usize,
        add_bos: i32,
        parse_special: i32,
        ids: *mut i32,
        capacity: usize,
        n_ids: *mut usize,
    ) -> i32;
    pub fn qlft_detokenize(
        model: *const qlft_model,
        ids: *const i32,
        n_ids: usize,
        buf: *mut c_char,
        buf_size: usize,
        needed: *mut usize,
    ) -> i32;

    pub fn qlft_dataset_load(
        model: *const qlft_model,
        path: *const c_char,
        config: *const qlft_config,
        out: *mut *mut qlft_dataset,
    ) -> i32;
    pub fn qlft_dataset_free(dataset: *mut qlft_dataset);
    pub fn qlft_dataset_get_stats(
        dataset: *const qlft_dataset,
        out: *mut qlft_dataset_stats,
    ) -> i32;

    pub fn qlft_trainer_create(
        model: *mut qlft_model,
        train_data: *mut qlft_dataset,
        config: *const qlft_config,
        out: *mut *mut qlft_trainer,
    ) -> i32;
    pub fn qlft_trainer_free(trainer: *mut qlft_trainer);
    pub fn qlft_trainer_step(trainer: *mut qlft_trainer, out: *mut qlft_step_stats) -> i32;
    pub fn qlft_trainer_train(
        trainer: *mut qlft_trainer,
        progress: qlft_progress_fn,
        user: *mut c_void,
    ) -> i32;
    pub fn qlft_trainer_cancel(trainer: *mut qlft_trainer);
    pub fn qlft_trainer_evaluate(
        trainer: *mut qlft_trainer,
        data: *mut qlft_dataset,
        out: *mut qlft_eval_result,
    ) -> i32;
    pub fn qlft_trainer_save_adapter(
        trainer: *mut qlft_trainer,
        path: *const c_char,
        format: *const c_char,
    ) -> i32;
    pub fn qlft_trainer_load_adapter(trainer: *mut qlft_trainer, path: *const c_char) -> i32;
    pub fn qlft_trainer_save_checkpoint(trainer: *mut qlft_trainer, path: *const c_char) -> i32;
    pub fn qlft_trainer_resume(trainer: *mut qlft_trainer, path: *const c_char) -> i32;
    pub fn qlft_trainer_memory_report(
        trainer: *const qlft_trainer,
        out: *mut qlft_memory_report,
    ) -> i32;
    pub fn qlft_trainer_export_merged(
        trainer: *mut qlft_trainer,
        path: *const c_char,
        format: *const c_char,
    ) -> i32;

    pub fn qlft_generate(
        model: *const qlft_model,
        trainer: *const qlft_trainer,
        prompt: *const c_char,
        config: *const qlft_config,
        on_text: qlft_text_fn,
        user: *mut c_void,
    ) -> i32;

    pub fn qlft_generation_create(
        model: *const qlft_model,
        trainer: *const qlft_trainer,
        prompt: *const c_char,
        config: *const qlft_config,
        stop: *const *const c_char,
        n_stop: usize,
        out: *mut *mut qlft_generation,
    ) -> i32;
    pub fn qlft_generation_next(
        generation: *mut qlft_generation,
        out: *mut qlft_generated_token,
    ) -> i32;
    pub fn qlft_generation_cancel(generation: *mut qlft_generation);
    pub fn qlft_generation_free(generation: *mut qlft_generation);

    pub fn qlft_metrics_read(
        path: *const c_char,
        records: *mut qlft_metrics_record,
        capacity: usize,
        count: *mut usize,
    ) -> i32;
}

pub const QLFT_FINISH_NONE: i32 = 0;
pub const QLFT_FINISH_EOS: i32 = 1;
pub const QLFT_FINISH_LENGTH: i32 = 2;
pub const QLFT_FINISH_STOP: i32 = 3;
pub const QLFT_FINISH_CANCELLED: i32 = 4;

#[repr(C)]
pub struct qlft_generation {
    _p: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct qlft_generated_token {
    pub struct_size: u32,
    pub id: i32,
    pub index: u32,
    pub finish_reason: i32,
    pub text: *const c_char,
    pub text_len: usize,
}
