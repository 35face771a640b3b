//! Safe Rust bindings to qlft, an embedded QLoRA fine-tuning runtime.
//!
//! The C ABI (`include/qlft.h`, mirrored in [`ffi`]) is wrapped in owning types that free their
//! handle on `Drop`, borrow what they must not outlive, and turn every status into
//! `Result<T, Error>` with the C code and the thread-local `qlft_last_error()` message (read on
//! the calling thread right after the failing call, before anything else can overwrite it).
//!
//! # Threads
//! The header promises: distinct handles may be used from different threads at once; one handle
//! from one thread at a time; a model may be shared read-only by several trainers; and
//! `qlft_trainer_cancel` is safe from any thread. Hence:
//! - [`Config`], [`Runtime`], [`Dataset`], [`Trainer`] are `Send` (a handle may move to another
//!   thread) but not `Sync` (no two threads may use one handle at once).
//! - [`Model`] is `Send + Sync`: its `&self` methods are the header's read-only (`const`) uses,
//!   and several trainers on several threads may share it.
//! - [`Canceller`] is `Send + Sync + Clone` and outlives nothing: it stops a running `train` from
//!   any thread, and does nothing once its trainer is dropped.
//! - [`Generation`] (streaming generation, an [`Iterator`] over [`Token`]s) is `Send`; its
//!   [`GenerationCanceller`] is `Send + Sync + Clone` like a trainer's.
//!
//! # Cancellation (the same everywhere: C, Rust, Go)
//! A cancel stops the operation in progress. A trainer is in progress only inside `train` /
//! `step` (stopped after the current step, or at the step's next micro-batch, rolled back); a
//! cancel sent while neither runs is discarded when the next one starts. A [`Generation`] is in
//! progress from its creation to its last token, so its cancel is never discarded: the next
//! (or the running) token ends it with [`FinishReason::Cancelled`], and at most one token is
//! delivered after `cancel` returns.
//!
//! ```compile_fail
//! fn need_sync<T: Sync>() {}
//! need_sync::<qlft::Trainer<'static>>(); // one trainer, one thread at a time
//! ```
//! ```compile_fail
//! fn need_sync<T: Sync>() {}
//! need_sync::<qlft::Dataset<'static>>();
//! ```
//!
//! Calling into a trainer from its own progress callback (which the C ABI refuses for step,
//! train, load and resume) cannot be written here: `train` holds `&mut self` while the closure
//! runs. A [`Generation`] borrows its trainer, so the trainer cannot train while it is alive.
//!
//! Lifetimes encode "must not outlive": `Model<'r>` borrows its runtime, `Dataset<'m>` its model,
//! and `Trainer<'m>` its model (shared) and its training dataset (exclusively).
pub mod ffi;

use std::any::Any;
use std::ffi::{CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::os::raw::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::ptr;
use std::sync::{Arc, Mutex};

/// The kind of a failure: one per `QLFT_ERR_*` code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    InvalidArgument,
    Io,
    Format,
    Unsupported,
    OutOfMemory,
    Numerical,
    Cancelled,
    Backend,
    Distributed,
    Internal,
    Unknown,
}

/// A failed qlft call: the C status code and the library's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    code: i32,
    message: String,
}

impl Error {
    /// Builds an error from a code and message (used for failures detected on the Rust side).
    pub fn new(code: i32, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
        }
    }
    /// Reads `qlft_last_error()` on this thread for a failed status.
    fn last(code: i32) -> Error {
        // SAFETY: qlft_last_error returns a valid NUL-terminated thread-local string.
        let message = unsafe { cstr(ffi::qlft_last_error()) };
        Error { code, message }
    }
    /// The C status code (`QLFT_ERR_*`).
    pub fn code(&self) -> i32 {
        self.code
    }
    /// The library's detail message.
    pub fn message(&self) -> &str {
        &self.message
    }
    /// The status name, e.g. "QLFT_ERR_IO".
    pub fn code_name(&self) -> &'static str {
        status_string(self.code)
    }
    pub fn kind(&self) -> ErrorKind {
        match self.code {
            ffi::QLFT_ERR_INVALID_ARGUMENT => ErrorKind::InvalidArgument,
            ffi::QLFT_ERR_IO => ErrorKind::Io,
            ffi::QLFT_ERR_FORMAT => ErrorKind::Format,
            ffi::QLFT_ERR_UNSUPPORTED => ErrorKind::Unsupported,
            ffi::QLFT_ERR_OUT_OF_MEMORY => ErrorKind::OutOfMemory,
            ffi::QLFT_ERR_NUMERICAL => ErrorKind::Numerical,
            ffi::QLFT_ERR_CANCELLED => ErrorKind::Cancelled,
            ffi::QLFT_ERR_BACKEND => ErrorKind::Backend,
            ffi::QLFT_ERR_DISTRIBUTED => ErrorKind::Distributed,
            ffi::QLFT_ERR_INTERNAL => ErrorKind::Internal,
            _ => ErrorKind::Unknown,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code_name(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

fn check(status: i32) -> Result<()> {
    if status == ffi::QLFT_OK {
        Ok(())
    } else {
        Err(Error::last(status))
    }
}

unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

fn c_string(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| {
        Error::new(
            ffi::QLFT_ERR_INVALID_ARGUMENT,
            format!("string contains a NUL byte: {s:?}"),
        )
    })
}

fn c_path(p: &Path) -> Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        Error::new(
            ffi::QLFT_ERR_INVALID_ARGUMENT,
            format!("path contains a NUL byte: {p:?}"),
        )
    })
}

fn panic_text(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".to_string()
    }
}

/// The linked library's version number (major*10000 + minor*100 + patch).
pub fn version_number() -> u32 {
    unsafe { ffi::qlft_version_number() }
}
pub fn version_string() -> String {
    unsafe { cstr(ffi::qlft_version_string()) }
}
pub fn build_info() -> String {
    unsafe { cstr(ffi::qlft_build_info()) }
}
/// "QLFT_ERR_FORMAT" for a code.
pub fn status_string(code: i32) -> &'static str {
    // SAFETY: the library returns static strings.
    unsafe {
        CStr::from_ptr(ffi::qlft_status_string(code))
            .to_str()
            .unwrap_or("QLFT_ERR_UNKNOWN")
    }
}

// ---- logging ------------------------------------------------------------------------------

type LogFn = Box<dyn Fn(i32, &str) + Send + Sync>;
static LOGGER: Mutex<Option<LogFn>> = Mutex::new(None);

unsafe extern "C" fn log_trampoline(level: i32, message: *const c_char, _: *mut c_void) {
    let text = cstr(message);
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // A logger that panicked poisoned the mutex; the closure itself is still usable.
        let guard = LOGGER.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = guard.as_ref() {
            f(level, &text);
        }
    }));
}

/// Sets the process-wide log callback (`level` is `ffi::QLFT_LOG_*`); `None` restores the
/// default stderr logger. The closure may run on any thread; a panic in it is swallowed.
pub fn set_log_callback(f: Option<LogFn>, max_level: i32) {
    let install = f.is_some();
    *LOGGER.lock().unwrap_or_else(|e| e.into_inner()) = f;
    unsafe {
        if install {
            ffi::qlft_set_log_callback(Some(log_trampoline), ptr::null_mut(), max_level);
        } else {
            ffi::qlft_set_log_callback(None, ptr::null_mut(), max_level);
        }
    }
}

// ---- settings -----------------------------------------------------------------------------

/// Settings as validated string key/value pairs (keys in docs/CONFIG.md).
pub struct Config {
    raw: *mut ffi::qlft_config,
}
unsafe impl Send for Config {}

impl Config {
    pub fn new() -> Result<Config> {
        let mut raw = ptr::null_mut();
        check(unsafe { ffi::qlft_config_create(&mut raw) })?;
        Ok(Config { raw })
    }
    /// A config with each pair set in order; the first invalid pair is the error.
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Result<Config> {
        let mut c = Config::new()?;
        for (k, v) in pairs {
            c.set(k, v)?;
        }
        Ok(c)
    }
    /// Sets one key (builder style: `cfg.set("lora.r", "8")?.set(...)?`).
    pub fn set(&mut self, key: &str, value: &str) -> Result<&mut Config> {
        let (k, v) = (c_string(key)?, c_string(value)?);
        check(unsafe { ffi::qlft_config_set(self.raw, k.as_ptr(), v.as_ptr()) })?;
        Ok(self)
    }
    /// The value of a key, or its default when unset.
    pub fn get(&self, key: &str) -> Result<String> {
        let k = c_string(key)?;
        let mut needed = 0usize;
        let st =
            unsafe { ffi::qlft_config_get(self.raw, k.as_ptr(), ptr::null_mut(), 0, &mut needed) };
        if st != ffi::QLFT_OK && needed == 0 {
            return Err(Error::last(st));
        }
        let mut buf = vec![0u8; needed.max(1)];
        check(unsafe {
            ffi::qlft_config_get(
                self.raw,
                k.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut needed,
            )
        })?;
        Ok(unsafe { cstr(buf.as_ptr().cast()) })
    }
    /// Applies a YAML run file (all or nothing).
    pub fn load_file(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let p = c_path(path.as_ref())?;
        check(unsafe { ffi::qlft_config_load_file(self.raw, p.as_ptr()) })
    }
    pub(crate) fn as_ptr(&self) -> *const ffi::qlft_config {
        self.raw
    }
}

impl Drop for Config {
    fn drop(&mut self) {
        unsafe { ffi::qlft_config_free(self.raw) }
    }
}

/// One entry of the settings table.
#[derive(Clone, Debug)]
pub struct ConfigKey {
    pub name: String,
    pub type_: String,
    pub default_value: String,
    pub allowed: String,
    pub doc: String,
}

/// All known settings keys.
pub fn config_keys() -> Result<Vec<ConfigKey>> {
    let n = unsafe { ffi::qlft_config_key_count() };
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut k = ffi::qlft_config_key {
            struct_size: std::mem::size_of::<ffi::qlft_config_key>() as u32,
            name: ptr::null(),
            type_: ptr::null(),
            default_value: ptr::null(),
            allowed: ptr::null(),
            doc: ptr::null(),
        };
        check(unsafe { ffi::qlft_config_key_at(i, &mut k) })?;
        unsafe {
            out.push(ConfigKey {
                name: cstr(k.name),
                type_: cstr(k.type_),
                default_value: cstr(k.default_value),
                allowed: cstr(k.allowed),
                doc: cstr(k.doc),
            });
        }
    }
    Ok(out)
}

fn opt_cfg(c: Option<&Config>) -> *const ffi::qlft_config {
    c.map_or(ptr::null(), |c| c.as_ptr())
}

// ---- runtime ------------------------------------------------------------------------------

pub type MemoryReport = ffi::qlft_memory_report;
pub type ModelDetails = ffi::qlft_model_details;
pub type DatasetStats = ffi::qlft_dataset_stats;
pub type StepStats = ffi::qlft_step_stats;
pub type EvalResult = ffi::qlft_eval_result;

fn new_memory_report() -> MemoryReport {
    MemoryReport {
        struct_size: std::mem::size_of::<MemoryReport>() as u32,
        ..Default::default()
    }
}

/// Backend, threads and the memory budget (`backend`, `threads`, `memory.limit`).
pub struct Runtime {
    raw: *mut ffi::qlft_runtime,
}
unsafe impl Send for Runtime {}

impl Runtime {
    pub fn new(config: Option<&Config>) -> Result<Runtime> {
        let mut raw = ptr::null_mut();
        check(unsafe { ffi::qlft_runtime_create(opt_cfg(config), &mut raw) })?;
        Ok(Runtime { raw })
    }
    pub fn memory_report(&self) -> Result<MemoryReport> {
        let mut r = new_memory_report();
        check(unsafe { ffi::qlft_runtime_memory_report(self.raw, &mut r) })?;
        Ok(r)
    }
    /// Loads a model (.gguf, .safetensors or a Hugging Face directory); it borrows the runtime.
    /// `&self` suffices: `Runtime` is not `Sync`, so no other thread can use it meanwhile.
    pub fn load_model(&self, path: impl AsRef<Path>, config: Option<&Config>) -> Result<Model<'_>> {
        let p = c_path(path.as_ref())?;
        let mut raw = ptr::null_mut();
        check(unsafe { ffi::qlft_model_load(self.raw, p.as_ptr(), opt_cfg(config), &mut raw) })?;
        Ok(Model {
            raw,
            _rt: PhantomData,
        })
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        unsafe { ffi::qlft_runtime_free(self.raw) }
    }
}

/// "weights", "adapter", ... for `ffi::QLFT_MEM_*`.
pub fn memory_category_name(category: i32) -> String {
    unsafe { cstr(ffi::qlft_memory_category_name(category)) }
}

// ---- model --------------------------------------------------------------------------------

/// A loaded base model. Read-only after loading, so it is shared by reference.
pub struct Model<'r> {
    raw: *mut ffi::qlft_model,
    // Ties the model to its runtime without borrowing it for Sync purposes: the ABI lets
    // distinct handles run on different threads.
    _rt: PhantomData<&'r mut ()>,
}
unsafe impl Send for Model<'_> {}
unsafe impl Sync for Model<'_> {}

fn fixed_str(a: &[c_char]) -> String {
    let bytes: Vec<u8> = a
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl ModelDetails {
    pub fn architecture(&self) -> String {
        fixed_str(&self.architecture)
    }
    pub fn quant_type(&self) -> String {
        fixed_str(&self.quant_type)
    }
    pub fn source_format(&self) -> String {
        fixed_str(&self.source_format)
    }
}

impl<'r> Model<'r> {
    pub fn info(&self) -> Result<ModelDetails> {
        // SAFETY: all-zero is a valid qlft_model_details.
        let mut d: ModelDetails = unsafe { std::mem::zeroed() };
        d.struct_size = std::mem::size_of::<ModelDetails>() as u32;
        check(unsafe { ffi::qlft_model_info(self.raw, &mut d) })?;
        Ok(d)
    }
    pub fn tokenize(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<i32>> {
        let mut n = 0usize;
        let call = |ids: *mut i32, cap: usize, n: &mut usize| unsafe {
            ffi::qlft_tokenize(
                self.raw,
                text.as_ptr().cast(),
                text.len(),
                add_bos as i32,
                parse_special as i32,
                ids,
                cap,
                n,
            )
        };
        let st = call(ptr::null_mut(), 0, &mut n);
        if st != ffi::QLFT_OK && n == 0 {
            return Err(Error::last(st));
        }
        let mut ids = vec![0i32; n];
        check(call(ids.as_mut_ptr(), ids.len(), &mut n))?;
        ids.truncate(n);
        Ok(ids)
    }
    pub fn detokenize(&self, ids: &[i32]) -> Result<String> {
        let mut needed = 0usize;
        let st = unsafe {
            ffi::qlft_detokenize(
                self.raw,
                ids.as_ptr(),
                ids.len(),
                ptr::null_mut(),
                0,
                &mut needed,
            )
        };
        if st != ffi::QLFT_OK && needed == 0 {
            return Err(Error::last(st));
        }
        let mut buf = vec![0u8; needed.max(1)];
        check(unsafe {
            ffi::qlft_detokenize(
                self.raw,
                ids.as_ptr(),
                ids.len(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut needed,
            )
        })?;
        Ok(unsafe { cstr(buf.as_ptr().cast()) })
    }
    /// Reads and tokenizes a .txt/.json/.jsonl file with the data.* settings.
    pub fn load_dataset(
        &self,
        path: impl AsRef<Path>,
        config: Option<&Config>,
    ) -> Result<Dataset<'_>> {
        let p = c_path(path.as_ref())?;
        let mut raw = ptr::null_mut();
        check(unsafe { ffi::qlft_dataset_load(self.raw, p.as_ptr(), opt_cfg(config), &mut raw) })?;
        Ok(Dataset {
            raw,
            _m: PhantomData,
        })
    }
    /// Creates a trainer (LoRA adapters + optimizer). `train_data` may be None for a trainer
    /// that only evaluates, loads adapters or generates.
    pub fn trainer<'t>(
        &'t self,
        train_data: Option<&'t mut Dataset<'_>>,
        config: Option<&Config>,
    ) -> Result<Trainer<'t>> {
        let d = train_data.map_or(ptr::null_mut(), |d| d.raw);
        let mut raw = ptr::null_mut();
        check(unsafe { ffi::qlft_trainer_create(self.raw, d, opt_cfg(config), &mut raw) })?;
        Ok(Trainer {
            raw,
            shared: Arc::new(Mutex::new(SendPtr(raw))),
            _m: PhantomData,
        })
    }
    /// Generates from `prompt` (generate.* settings), with `trainer`'s adapter if given.
    /// `on_text` receives complete UTF-8 pieces and returns false to stop.
    pub fn generate<F: FnMut(&str) -> bool>(
        &self,
        trainer: Option<&Trainer<'_>>,
        prompt: &str,
        config: Option<&Config>,
        mut on_text: F,
    ) -> Result<()> {
        struct Ctx<'a> {
            f: &'a mut dyn FnMut(&str) -> bool,
            panic: Option<String>,
        }
        unsafe extern "C" fn tramp(text: *const c_char, user: *mut c_void) -> i32 {
            let ctx = &mut *(user as *mut Ctx<'_>);
            let s = cstr(text);
            match catch_unwind(AssertUnwindSafe(|| (ctx.f)(&s))) {
                Ok(true) => 0,
                Ok(false) => 1,
                Err(p) => {
                    ctx.panic = Some(panic_text(&*p));
                    1
                }
            }
        }
        let pr = c_string(prompt)?;
        let mut ctx = Ctx {
            f: &mut on_text,
            panic: None,
        };
        let st = unsafe {
            ffi::qlft_generate(
                self.raw,
                trainer.map_or(ptr::null(), |t| t.raw),
                pr.as_ptr(),
                opt_cfg(config),
                Some(tramp),
                (&mut ctx as *mut Ctx<'_>).cast(),
            )
        };
        let r = check(st);
        if let Some(msg) = ctx.panic {
            return Err(Error::new(
                ffi::QLFT_ERR_CANCELLED,
                format!("text callback panicked: {msg}"),
            ));
        }
        r
    }
}

// ---- streaming generation -----------------------------------------------------------------

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// The end-of-sequence token (generate.stop_at_eos).
    Eos,
    /// generate.max_tokens tokens, or the model's context is full.
    Length,
    /// The text reached a stop string (not delivered).
    Stop,
    /// [`Generation::cancel`] / [`GenerationCanceller::cancel`].
    Cancelled,
}

/// One event of a [`Generation`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    /// The sampled id; None on the event that ends a cancelled generation.
    pub id: Option<i32>,
    /// 0 for the first generated token.
    pub index: u32,
    /// The text that became final with this token (often empty: an unfinished UTF-8 character
    /// or a possible stop string is held back until it is decided).
    pub text: String,
    /// Set on the last event only.
    pub finish: Option<FinishReason>,
}

/// Streaming generation: an iterator over [`Token`]s that ends after the event whose `finish`
/// is set. The same ids as [`Model::generate`] for the same settings. Borrows the model and the
/// trainer whose adapter it uses (so the trainer cannot train meanwhile).
pub struct Generation<'a> {
    raw: *mut ffi::qlft_generation,
    shared: Arc<Mutex<SendGen>>,
    finish: Option<FinishReason>,
    _m: PhantomData<&'a ()>,
}
// SAFETY: the C generation may move between threads; it is used by one at a time (&mut self).
unsafe impl Send for Generation<'_> {}

struct SendGen(*mut ffi::qlft_generation);
// SAFETY: only used for qlft_generation_cancel (safe from any thread), ordered against the free
// by the mutex.
unsafe impl Send for SendGen {}

/// Cancels a [`Generation`] from any thread; does nothing once the generation is dropped.
#[derive(Clone)]
pub struct GenerationCanceller {
    shared: Arc<Mutex<SendGen>>,
}

impl GenerationCanceller {
    pub fn cancel(&self) {
        let g = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        if !g.0.is_null() {
            unsafe { ffi::qlft_generation_cancel(g.0) }
        }
    }
}

fn finish_reason(code: i32) -> Option<FinishReason> {
    match code {
        ffi::QLFT_FINISH_EOS => Some(FinishReason::Eos),
        ffi::QLFT_FINISH_LENGTH => Some(FinishReason::Length),
        ffi::QLFT_FINISH_STOP => Some(FinishReason::Stop),
        ffi::QLFT_FINISH_CANCELLED => Some(FinishReason::Cancelled),
        _ => None,
    }
}

impl<'r> Model<'r> {
    /// Starts a streaming generation from `prompt` (generate.* settings), with `trainer`'s
    /// adapter if given; it ends at the first of the `stop` strings. Nothing runs before the
    /// first token is asked for.
    pub fn generation<'a>(
        &'a self,
        trainer: Option<&'a Trainer<'_>>,
        prompt: &str,
        config: Option<&Config>,
        stop: &[&str],
    ) -> Result<Generation<'a>> {
        let pr = c_string(prompt)?;
        let stops = stop
            .iter()
            .map(|s| c_string(s))
            .collect::<Result<Vec<CString>>>()?;
        let ptrs: Vec<*const c_char> = stops.iter().map(|s| s.as_ptr()).collect();
        let mut raw = ptr::null_mut();
        check(unsafe {
            ffi::qlft_generation_create(
                self.raw,
                trainer.map_or(ptr::null(), |t| t.raw),
                pr.as_ptr(),
                opt_cfg(config),
                if ptrs.is_empty() {
                    ptr::null()
                } else {
                    ptrs.as_ptr()
                },
                ptrs.len(),
                &mut raw,
            )
        })?;
        Ok(Generation {
            raw,
            shared: Arc::new(Mutex::new(SendGen(raw))),
            finish: None,
            _m: PhantomData,
        })
    }
}

impl Generation<'_> {
    /// Computes the next event (after the last one: the end again, with no id and no text).
    pub fn next_token(&mut self) -> Result<Token> {
        let mut t = ffi::qlft_generated_token {
            struct_size: std::mem::size_of::<ffi::qlft_generated_token>() as u32,
            id: -1,
            index: 0,
            finish_reason: 0,
            text: ptr::null(),
            text_len: 0,
        };
        check(unsafe { ffi::qlft_generation_next(self.raw, &mut t) })?;
        let text = if t.text.is_null() {
            String::new()
        } else {
            let b = unsafe { std::slice::from_raw_parts(t.text.cast::<u8>(), t.text_len) };
            String::from_utf8_lossy(b).into_owned()
        };
        let tok = Token {
            id: (t.id >= 0).then_some(t.id),
            index: t.index,
            text,
            finish: finish_reason(t.finish_reason),
        };
        self.finish = self.finish.or(tok.finish);
        Ok(tok)
    }
    /// Why the generation ended (None while it goes on).
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finish
    }
    /// Ends the generation (see the crate docs on cancellation).
    pub fn cancel(&self) {
        unsafe { ffi::qlft_generation_cancel(self.raw) }
    }
    /// A handle that cancels this generation from another thread.
    pub fn canceller(&self) -> GenerationCanceller {
        GenerationCanceller {
            shared: self.shared.clone(),
        }
    }
}

/// Yields every event up to and including the one that ends the generation; an error ends the
/// iteration after it is yielded.
impl Iterator for Generation<'_> {
    type Item = Result<Token>;
    fn next(&mut self) -> Option<Result<Token>> {
        if self.finish.is_some() {
            return None;
        }
        let r = self.next_token();
        if r.is_err() {
            self.finish = Some(FinishReason::Cancelled);
        }
        Some(r)
    }
}

impl Drop for Generation<'_> {
    fn drop(&mut self) {
        let mut g = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        g.0 = ptr::null_mut();
        unsafe { ffi::qlft_generation_free(self.raw) }
    }
}

impl Drop for Model<'_> {
    fn drop(&mut self) {
        unsafe { ffi::qlft_model_free(self.raw) }
    }
}

// ---- dataset ------------------------------------------------------------------------------

/// A tokenized dataset (train split and optional held-out split).
pub struct Dataset<'m> {
    raw: *mut ffi::qlft_dataset,
    _m: PhantomData<&'m ()>,
}
unsafe impl Send for Dataset<'_> {}

impl Dataset<'_> {
    pub fn stats(&self) -> Result<DatasetStats> {
        let mut s = DatasetStats {
            struct_size: std::mem::size_of::<DatasetStats>() as u32,
            ..Default::default()
        };
        check(unsafe { ffi::qlft_dataset_get_stats(self.raw, &mut s) })?;
        Ok(s)
    }
}

impl Drop for Dataset<'_> {
    fn drop(&mut self) {
        unsafe { ffi::qlft_dataset_free(self.raw) }
    }
}

// ---- trainer ------------------------------------------------------------------------------

struct SendPtr(*mut ffi::qlft_trainer);
// SAFETY: only used for qlft_trainer_cancel, which the ABI makes safe from any thread; the
// mutex orders it against the trainer's free.
unsafe impl Send for SendPtr {}

/// A LoRA trainer on a borrowed model (and exclusively borrowed training data).
pub struct Trainer<'m> {
    raw: *mut ffi::qlft_trainer,
    shared: Arc<Mutex<SendPtr>>,
    // Shares the model and holds the training dataset exclusively for 'm.
    _m: PhantomData<&'m mut ()>,
}
unsafe impl Send for Trainer<'_> {}

/// Stops a running [`Trainer::train`] from any thread (after the current step). Valid after
/// the trainer is gone, where it does nothing.
#[derive(Clone)]
pub struct Canceller {
    shared: Arc<Mutex<SendPtr>>,
}

impl Canceller {
    pub fn cancel(&self) {
        let g = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        if !g.0.is_null() {
            unsafe { ffi::qlft_trainer_cancel(g.0) }
        }
    }
}

fn new_step_stats() -> StepStats {
    StepStats {
        struct_size: std::mem::size_of::<StepStats>() as u32,
        ..Default::default()
    }
}

impl<'m> Trainer<'m> {
    /// One optimizer step.
    pub fn step(&mut self) -> Result<StepStats> {
        let mut s = new_step_stats();
        check(unsafe { ffi::qlft_trainer_step(self.raw, &mut s) })?;
        Ok(s)
    }
    /// Trains to train.max_steps / train.epochs. `progress` runs after every step and returns
    /// false to stop (then the result is an `ErrorKind::Cancelled` error). A panic in `progress`
    /// is caught at the C boundary, cancels training, and comes back as a Cancelled error whose
    /// message holds the panic text.
    pub fn train<F: FnMut(&StepStats) -> bool>(&mut self, mut progress: F) -> Result<()> {
        struct Ctx<'a> {
            f: &'a mut dyn FnMut(&StepStats) -> bool,
            panic: Option<String>,
        }
        unsafe extern "C" fn tramp(stats: *const ffi::qlft_step_stats, user: *mut c_void) -> i32 {
            let ctx = &mut *(user as *mut Ctx<'_>);
            let s = &*stats;
            match catch_unwind(AssertUnwindSafe(|| (ctx.f)(s))) {
                Ok(true) => 0,
                Ok(false) => 1,
                Err(p) => {
                    ctx.panic = Some(panic_text(&*p));
                    1
                }
            }
        }
        let mut ctx = Ctx {
            f: &mut progress,
            panic: None,
        };
        let st = unsafe {
            ffi::qlft_trainer_train(self.raw, Some(tramp), (&mut ctx as *mut Ctx<'_>).cast())
        };
        let r = check(st);
        if let Some(msg) = ctx.panic {
            return Err(Error::new(
                ffi::QLFT_ERR_CANCELLED,
                format!("progress callback panicked: {msg}"),
            ));
        }
        r
    }
    /// A handle that cancels a running `train` from another thread.
    pub fn canceller(&self) -> Canceller {
        Canceller {
            shared: self.shared.clone(),
        }
    }
    /// Evaluates on `data`, or on the training data's held-out split when None.
    pub fn evaluate(&mut self, data: Option<&mut Dataset<'_>>) -> Result<EvalResult> {
        let mut r = EvalResult {
            struct_size: std::mem::size_of::<EvalResult>() as u32,
            ..Default::default()
        };
        let d = data.map_or(ptr::null_mut(), |d| d.raw);
        check(unsafe { ffi::qlft_trainer_evaluate(self.raw, d, &mut r) })?;
        Ok(r)
    }
    /// format: "peft" (directory) or "gguf" (file).
    pub fn save_adapter(&mut self, path: impl AsRef<Path>, format: &str) -> Result<()> {
        let (p, f) = (c_path(path.as_ref())?, c_string(format)?);
        check(unsafe { ffi::qlft_trainer_save_adapter(self.raw, p.as_ptr(), f.as_ptr()) })
    }
    pub fn load_adapter(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let p = c_path(path.as_ref())?;
        check(unsafe { ffi::qlft_trainer_load_adapter(self.raw, p.as_ptr()) })
    }
    pub fn save_checkpoint(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let p = c_path(path.as_ref())?;
        check(unsafe { ffi::qlft_trainer_save_checkpoint(self.raw, p.as_ptr()) })
    }
    pub fn resume(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let p = c_path(path.as_ref())?;
        check(unsafe { ffi::qlft_trainer_resume(self.raw, p.as_ptr()) })
    }
    pub fn memory_report(&self) -> Result<MemoryReport> {
        let mut r = new_memory_report();
        check(unsafe { ffi::qlft_trainer_memory_report(self.raw, &mut r) })?;
        Ok(r)
    }
    /// format: "safetensors", "gguf-f16" or "gguf-bf16".
    pub fn export_merged(&mut self, path: impl AsRef<Path>, format: &str) -> Result<()> {
        let (p, f) = (c_path(path.as_ref())?, c_string(format)?);
        check(unsafe { ffi::qlft_trainer_export_merged(self.raw, p.as_ptr(), f.as_ptr()) })
    }
}

impl Drop for Trainer<'_> {
    fn drop(&mut self) {
        // Under the lock, so no Canceller calls cancel on a freed trainer.
        let mut g = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        g.0 = ptr::null_mut();
        unsafe { ffi::qlft_trainer_free(self.raw) }
    }
}

// ---- training metrics ---------------------------------------------------------------------

/// One step of a run as `qlft-finetune train` logs it in `<run dir>/metrics.jsonl`
/// (`qlft_metrics_record`): loss, learning rate, speed and the memory timeline. A float the
/// record lacks, or logged as null (not finite), is NaN; memory per category is 0 in records
/// written before it was logged. The arrays are indexed by `ffi::QLFT_MEM_*`
/// ([`memory_category_name`] names them). An evaluation made outside a step (before training,
/// after the last step) is a record of its own with only `step` and `eval_loss` set (`loss`
/// and `learning_rate` NaN, `tokens` 0).
#[derive(Clone, Debug)]
pub struct MetricsRecord {
    pub step: u64,
    pub loss: f64,
    pub learning_rate: f64,
    pub grad_norm: f64,
    pub loss_scale: f64,
    /// The step was skipped (non-finite gradients).
    pub skipped: bool,
    pub tokens: u64,
    pub tokens_per_second: f64,
    /// Since this process's run started (a resumed run restarts it).
    pub elapsed_seconds: f64,
    /// The held-out loss when an evaluation ran after this step (None otherwise, or when it
    /// was not finite).
    pub eval_loss: Option<f64>,
    /// Preference runs: the chosen-minus-rejected margin (None in other runs).
    pub margin: Option<f64>,
    /// Runtime-owned bytes after the step.
    pub memory_reserved: u64,
    /// The highest runtime-owned bytes so far.
    pub memory_peak: u64,
    /// Reserved bytes per category after the step.
    pub memory: [u64; ffi::QLFT_MEM_CATEGORY_COUNT],
    /// The highest reserved bytes per category so far (what `predicted` predicts).
    pub memory_category_peak: [u64; ffi::QLFT_MEM_CATEGORY_COUNT],
    /// The planner's step-peak bytes per category for the run (the same in every record).
    pub predicted: [u64; ffi::QLFT_MEM_CATEGORY_COUNT],
    /// The planner's step-peak total for the run; 0: unknown.
    pub predicted_total: u64,
}

impl MetricsRecord {
    fn from_raw(r: &ffi::qlft_metrics_record) -> MetricsRecord {
        let opt = |v: f64| if v.is_nan() { None } else { Some(v) };
        MetricsRecord {
            step: r.step,
            loss: r.loss,
            learning_rate: r.learning_rate,
            grad_norm: r.grad_norm,
            loss_scale: r.loss_scale,
            skipped: r.skipped != 0,
            tokens: r.tokens,
            tokens_per_second: r.tokens_per_second,
            elapsed_seconds: r.elapsed_seconds,
            eval_loss: opt(r.eval_loss),
            margin: opt(r.margin),
            memory_reserved: r.memory_reserved,
            memory_peak: r.memory_peak,
            memory: r.memory,
            memory_category_peak: r.memory_category_peak,
            predicted: r.predicted,
            predicted_total: r.predicted_total,
        }
    }
}

/// Reads a run's metrics.jsonl (`qlft_metrics_read`): one record per logged step, in file
/// order. A last line still being written is left out, so this may be called while the run
/// trains; a malformed line is an [`ErrorKind::Format`] error naming the file and line, an
/// unreadable file an [`ErrorKind::Io`] error naming it.
pub fn metrics_read(path: impl AsRef<Path>) -> Result<Vec<MetricsRecord>> {
    let p = c_path(path.as_ref())?;
    let mut n = 0usize;
    check(unsafe { ffi::qlft_metrics_read(p.as_ptr(), ptr::null_mut(), 0, &mut n) })?;
    loop {
        // A live run appends records between the calls: leave room for some, and when more
        // came than fit (the C call then reports the new count), read again.
        let capacity = n + 64;
        let mut raw = vec![
            ffi::qlft_metrics_record {
                struct_size: std::mem::size_of::<ffi::qlft_metrics_record>() as u32,
                ..Default::default()
            };
            capacity
        ];
        let st = unsafe { ffi::qlft_metrics_read(p.as_ptr(), raw.as_mut_ptr(), capacity, &mut n) };
        if st == ffi::QLFT_ERR_INVALID_ARGUMENT && n > capacity {
            continue;
        }
        check(st)?;
        return Ok(raw[..n].iter().map(MetricsRecord::from_raw).collect());
    }
}

/// Size and field offsets of every result struct as canonical lines, for comparison with the
/// C compiler's view (tests/bindings/layout.c).
pub fn layout_lines() -> Vec<String> {
    use std::mem::{size_of, MaybeUninit};
    let mut v = Vec::new();
    // offset_of! needs Rust 1.77; Debian bookworm has 1.63, so take field addresses of an
    // uninitialized value (addr_of! never reads or creates a reference).
    macro_rules! s {
        ($t:ident) => {
            v.push(format!("{} size {}", stringify!($t), size_of::<ffi::$t>()))
        };
    }
    macro_rules! f {
        ($t:ident, $f:ident) => {
            f!($t, $f, $f)
        };
        ($t:ident, $f:ident, $name:ident) => {{
            let u = MaybeUninit::<ffi::$t>::uninit();
            let base = u.as_ptr() as usize;
            // SAFETY: addr_of! computes the field address without reading it.
            let field = unsafe { std::ptr::addr_of!((*u.as_ptr()).$f) } as usize;
            v.push(format!(
                "{}.{} {}",
                stringify!($t),
                stringify!($name),
                field - base
            ))
        }};
    }
    s!(qlft_config_key);
    f!(qlft_config_key, struct_size);
    f!(qlft_config_key, name);
    f!(qlft_config_key, type_, type);
    f!(qlft_config_key, default_value);
    f!(qlft_config_key, allowed);
    f!(qlft_config_key, doc);
    s!(qlft_memory_report);
    f!(qlft_memory_report, struct_size);
    f!(qlft_memory_report, limit);
    f!(qlft_memory_report, allocated);
    f!(qlft_memory_report, reserved);
    f!(qlft_memory_report, peak);
    f!(qlft_memory_report, total_reserved);
    f!(qlft_memory_report, total_peak);
    f!(qlft_memory_report, process_peak_rss);
    s!(qlft_model_details);
    f!(qlft_model_details, struct_size);
    f!(qlft_model_details, architecture);
    f!(qlft_model_details, quant_type);
    f!(qlft_model_details, source_format);
    f!(qlft_model_details, n_layers);
    f!(qlft_model_details, dim);
    f!(qlft_model_details, n_heads);
    f!(qlft_model_details, n_kv_heads);
    f!(qlft_model_details, head_dim);
    f!(qlft_model_details, ffn_dim);
    f!(qlft_model_details, vocab_size);
    f!(qlft_model_details, context_length);
    f!(qlft_model_details, rope_theta);
    f!(qlft_model_details, rms_norm_eps);
    f!(qlft_model_details, tied_embeddings);
    f!(qlft_model_details, rope_adjacent_pairs);
    f!(qlft_model_details, n_params);
    f!(qlft_model_details, weight_bytes);
    s!(qlft_dataset_stats);
    f!(qlft_dataset_stats, struct_size);
    f!(qlft_dataset_stats, records);
    f!(qlft_dataset_stats, dropped_records);
    f!(qlft_dataset_stats, tokens);
    f!(qlft_dataset_stats, trained_tokens);
    f!(qlft_dataset_stats, train_sequences);
    f!(qlft_dataset_stats, eval_sequences);
    f!(qlft_dataset_stats, fill_ratio);
    f!(qlft_dataset_stats, histogram_bucket_width);
    f!(qlft_dataset_stats, length_histogram);
    s!(qlft_step_stats);
    f!(qlft_step_stats, struct_size);
    f!(qlft_step_stats, step);
    f!(qlft_step_stats, total_steps);
    f!(qlft_step_stats, loss);
    f!(qlft_step_stats, learning_rate);
    f!(qlft_step_stats, grad_norm);
    f!(qlft_step_stats, loss_scale);
    f!(qlft_step_stats, skipped);
    f!(qlft_step_stats, tokens);
    f!(qlft_step_stats, tokens_per_second);
    f!(qlft_step_stats, elapsed_seconds);
    f!(qlft_step_stats, eta_seconds);
    f!(qlft_step_stats, memory_reserved);
    f!(qlft_step_stats, memory_peak);
    f!(qlft_step_stats, eval_loss);
    f!(qlft_step_stats, host_to_device_bytes);
    f!(qlft_step_stats, device_to_host_bytes);
    f!(qlft_step_stats, device_syncs);
    f!(qlft_step_stats, device_launches);
    f!(qlft_step_stats, rewards_chosen);
    f!(qlft_step_stats, rewards_rejected);
    f!(qlft_step_stats, rewards_margins);
    f!(qlft_step_stats, rewards_accuracies);
    f!(qlft_step_stats, logps_chosen);
    f!(qlft_step_stats, logps_rejected);
    f!(qlft_step_stats, nll_loss);
    f!(qlft_step_stats, kl);
    s!(qlft_eval_result);
    f!(qlft_eval_result, struct_size);
    f!(qlft_eval_result, loss);
    f!(qlft_eval_result, perplexity);
    f!(qlft_eval_result, tokens);
    s!(qlft_generated_token);
    f!(qlft_generated_token, struct_size);
    f!(qlft_generated_token, id);
    f!(qlft_generated_token, index);
    f!(qlft_generated_token, finish_reason);
    f!(qlft_generated_token, text);
    f!(qlft_generated_token, text_len);
    s!(qlft_metrics_record);
    f!(qlft_metrics_record, struct_size);
    f!(qlft_metrics_record, step);
    f!(qlft_metrics_record, loss);
    f!(qlft_metrics_record, learning_rate);
    f!(qlft_metrics_record, grad_norm);
    f!(qlft_metrics_record, loss_scale);
    f!(qlft_metrics_record, skipped);
    f!(qlft_metrics_record, tokens);
    f!(qlft_metrics_record, tokens_per_second);
    f!(qlft_metrics_record, elapsed_seconds);
    f!(qlft_metrics_record, eval_loss);
    f!(qlft_metrics_record, margin);
    f!(qlft_metrics_record, memory_reserved);
    f!(qlft_metrics_record, memory_peak);
    f!(qlft_metrics_record, memory);
    f!(qlft_metrics_record, memory_category_peak);
    f!(qlft_metrics_record, predicted);
    f!(qlft_metrics_record, predicted_total);
    v
}
