// Package qlft binds the qlft C ABI (include/qlft.h), an embedded QLoRA fine-tuning runtime.
//
// Every handle (Config, Runtime, Model, Dataset, Trainer) is released by Close, which is the
// primary release; a finalizer calls Close as a safety net for handles that are dropped. A
// child keeps its parent reachable (Trainer -> Model, Dataset -> Model, Model -> Runtime), so
// finalizers run children first; Close on a parent with open children is ErrInvalidArgument.
//
// Goroutines: distinct handles may be used from different goroutines at once. Model's methods
// are read-only and may be called concurrently (the ABI lets several trainers share a model);
// Trainer serializes its own methods with a mutex, and Trainer.Cancel may be called from any
// goroutine at any time. Config, Runtime and Dataset must be used by one goroutine at a time.
//
// Cancellation has one meaning in C, Rust and Go: a cancel stops the operation in progress. A
// Trainer is in progress only inside Train / Step (stopped after the current step, or at the
// step's next micro-batch, rolled back); a Trainer.Cancel while neither runs is discarded when
// the next one starts. A Generation is in progress from NewGeneration to its last token, so its
// Cancel is never discarded. Calls that may take long (Train, Step, Generate, Generation.Next
// and Tokens) take a context.Context whose end cancels them that way. Loading (LoadModel,
// LoadDataset) cannot be interrupted: the C ABI has no cancel for it.
//
// Errors are *Error values; the library's message is read with runtime.LockOSThread held
// around the failing call, because qlft_last_error is thread-local and goroutines migrate.
//
// Build: cgo finds the header and libqlft.so through pkg-config (qlft.pc): an install prefix P
// with PKG_CONFIG_PATH=P/lib/pkgconfig, a CMake build tree B with PKG_CONFIG_PATH=B/pkgconfig.
// No path is written into products: a program finds libqlft.so at run time through the
// dynamic loader's default directories, or a RUNPATH its build adds
// (CGO_LDFLAGS="-Wl,-rpath,$(pkg-config --variable=libdir qlft)"), or LD_LIBRARY_PATH.
// See README.md.
package qlft

/*
#cgo pkg-config: qlft
#include <stdint.h>
#include <stdlib.h>
#include "qlft.h"

extern int32_t qlftGoProgress(qlft_step_stats* stats, uintptr_t handle);
extern int32_t qlftGoText(char* text, uintptr_t handle);
extern void qlftGoLog(int32_t level, char* message);

static int32_t progress_tramp(const qlft_step_stats* s, void* user) {
	return qlftGoProgress((qlft_step_stats*)s, (uintptr_t)user);
}
static int32_t text_tramp(const char* text, void* user) {
	return qlftGoText((char*)text, (uintptr_t)user);
}
static void log_tramp(int32_t level, const char* message, void* user) {
	(void)user;
	qlftGoLog(level, (char*)message);
}
static int32_t train_with(qlft_trainer* t, uintptr_t h) {
	return qlft_trainer_train(t, progress_tramp, (void*)h);
}
static int32_t generate_with(const qlft_model* m, const qlft_trainer* t, const char* prompt,
                             const qlft_config* c, uintptr_t h) {
	return qlft_generate(m, t, prompt, c, text_tramp, (void*)h);
}
static void set_log(int on, int32_t max_level) {
	qlft_set_log_callback(on ? log_tramp : NULL, NULL, max_level);
}
*/
import "C"

import (
	"context"
	"fmt"
	"runtime"
	"runtime/cgo"
	"sync"
	"sync/atomic"
	"unsafe"
)

// VersionNumber is the linked library's major*10000 + minor*100 + patch.
func VersionNumber() uint32 { return uint32(C.qlft_version_number()) }

// VersionString is e.g. "0.1.0".
func VersionString() string { return C.GoString(C.qlft_version_string()) }

// BuildInfo describes the library build (backends, SIMD, BLAS, threads).
func BuildInfo() string { return C.GoString(C.qlft_build_info()) }

// StatusString is the name of a status code, e.g. "QLFT_ERR_IO".
func StatusString(code int) string { return C.GoString(C.qlft_status_string(C.int32_t(code))) }

// call runs f on a locked OS thread and maps a failed status to *Error with that thread's
// qlft_last_error.
func call(f func() C.int32_t) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	st := f()
	if st == C.QLFT_OK {
		return nil
	}
	return &Error{Code: int(st), Message: C.GoString(C.qlft_last_error())}
}

func goError(code int, format string, args ...interface{}) error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ---- logging ----

var (
	logMu sync.RWMutex
	logFn func(level int, message string)
)

//export qlftGoLog
func qlftGoLog(level C.int32_t, message *C.char) {
	logMu.RLock()
	f := logFn
	logMu.RUnlock()
	if f != nil {
		defer func() { _ = recover() }()
		f(int(level), C.GoString(message))
	}
}

// Log levels for SetLogCallback.
const (
	LogError = 0
	LogWarn  = 1
	LogInfo  = 2
	LogDebug = 3
)

// SetLogCallback installs a process-wide log function (called from any thread; panics are
// swallowed); nil restores the default stderr logger.
func SetLogCallback(f func(level int, message string), maxLevel int) {
	logMu.Lock()
	logFn = f
	logMu.Unlock()
	on := C.int(0)
	if f != nil {
		on = 1
	}
	C.set_log(on, C.int32_t(maxLevel))
}

// ---- config ----

// Config holds validated settings (keys in docs/CONFIG.md).
type Config struct {
	raw *C.qlft_config
}

// NewConfig creates an empty config (all defaults).
func NewConfig() (*Config, error) {
	c := &Config{}
	if err := call(func() C.int32_t { return C.qlft_config_create(&c.raw) }); err != nil {
		return nil, err
	}
	runtime.SetFinalizer(c, (*Config).Close)
	return c, nil
}

// NewConfigFrom creates a config and sets the pairs in order ("key", "value", ...).
func NewConfigFrom(pairs map[string]string) (*Config, error) {
	c, err := NewConfig()
	if err != nil {
		return nil, err
	}
	for k, v := range pairs {
		if err := c.Set(k, v); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Set validates and sets one key; an invalid value leaves the config unchanged.
func (c *Config) Set(key, value string) error {
	ck, cv := C.CString(key), C.CString(value)
	defer C.free(unsafe.Pointer(ck))
	defer C.free(unsafe.Pointer(cv))
	err := call(func() C.int32_t { return C.qlft_config_set(c.raw, ck, cv) })
	runtime.KeepAlive(c)
	return err
}

// Get returns the value of key, or its default when unset.
func (c *Config) Get(key string) (string, error) {
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	var needed C.size_t
	err := call(func() C.int32_t { return C.qlft_config_get(c.raw, ck, nil, 0, &needed) })
	if err != nil && needed == 0 {
		return "", err
	}
	buf := (*C.char)(C.malloc(needed))
	defer C.free(unsafe.Pointer(buf))
	if err := call(func() C.int32_t { return C.qlft_config_get(c.raw, ck, buf, needed, &needed) }); err != nil {
		return "", err
	}
	runtime.KeepAlive(c)
	return C.GoString(buf), nil
}

// LoadFile applies a YAML run file (all or nothing).
func (c *Config) LoadFile(path string) error {
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	err := call(func() C.int32_t { return C.qlft_config_load_file(c.raw, cp) })
	runtime.KeepAlive(c)
	return err
}

// Close frees the config; later calls are no-ops.
func (c *Config) Close() error {
	if c != nil && c.raw != nil {
		C.qlft_config_free(c.raw)
		c.raw = nil
		runtime.SetFinalizer(c, nil)
	}
	return nil
}

// cfgPtr is c's C config (nil: the defaults). A closed *Config is an error, never the defaults.
func cfgPtr(c *Config) (*C.qlft_config, error) {
	if c == nil {
		return nil, nil
	}
	if c.raw == nil {
		return nil, goError(1, "the *Config was closed (pass nil for the defaults)")
	}
	return c.raw, nil
}

// ConfigKey is one entry of the settings table.
type ConfigKey struct {
	Name, Type, Default, Allowed, Doc string
}

// ConfigKeys lists every known setting.
func ConfigKeys() ([]ConfigKey, error) {
	n := int(C.qlft_config_key_count())
	out := make([]ConfigKey, 0, n)
	for i := 0; i < n; i++ {
		var k C.qlft_config_key
		k.struct_size = C.uint32_t(unsafe.Sizeof(k))
		if err := call(func() C.int32_t { return C.qlft_config_key_at(C.size_t(i), &k) }); err != nil {
			return nil, err
		}
		out = append(out, ConfigKey{C.GoString(k.name), C.GoString(k._type), C.GoString(k.default_value),
			C.GoString(k.allowed), C.GoString(k.doc)})
	}
	return out, nil
}

// ---- runtime ----

// MemoryReport is qlft_memory_report: bytes per category (QLFT_MEM_* order).
type MemoryReport struct {
	Limit          uint64
	Allocated      [7]uint64
	Reserved       [7]uint64
	Peak           [7]uint64
	TotalReserved  uint64
	TotalPeak      uint64
	ProcessPeakRSS uint64
}

func memoryReport(r *C.qlft_memory_report) MemoryReport {
	m := MemoryReport{Limit: uint64(r.limit), TotalReserved: uint64(r.total_reserved),
		TotalPeak: uint64(r.total_peak), ProcessPeakRSS: uint64(r.process_peak_rss)}
	for i := 0; i < 7; i++ {
		m.Allocated[i], m.Reserved[i], m.Peak[i] = uint64(r.allocated[i]), uint64(r.reserved[i]), uint64(r.peak[i])
	}
	return m
}

// Runtime holds the backend, threads and memory budget.
type Runtime struct {
	raw      *C.qlft_runtime
	children int32
}

// NewRuntime reads backend, threads and memory.limit from config (nil: defaults).
func NewRuntime(config *Config) (*Runtime, error) {
	r := &Runtime{}
	cfgRaw, err := cfgPtr(config)
	if err != nil {
		return nil, err
	}
	err = call(func() C.int32_t { return C.qlft_runtime_create(cfgRaw, &r.raw) })
	runtime.KeepAlive(config)
	if err != nil {
		return nil, err
	}
	runtime.SetFinalizer(r, (*Runtime).Close)
	return r, nil
}

// MemoryReport is the runtime's current memory use.
func (r *Runtime) MemoryReport() (MemoryReport, error) {
	var m C.qlft_memory_report
	m.struct_size = C.uint32_t(unsafe.Sizeof(m))
	err := call(func() C.int32_t { return C.qlft_runtime_memory_report(r.raw, &m) })
	runtime.KeepAlive(r)
	return memoryReport(&m), err
}

// Close frees the runtime; its models must be closed first.
func (r *Runtime) Close() error {
	if r == nil || r.raw == nil {
		return nil
	}
	if n := atomic.LoadInt32(&r.children); n > 0 {
		return goError(1, "runtime still has %d open model(s)", n)
	}
	C.qlft_runtime_free(r.raw)
	r.raw = nil
	runtime.SetFinalizer(r, nil)
	return nil
}

// ---- model ----

// Model is a loaded base model, read-only after loading.
type Model struct {
	raw      *C.qlft_model
	rt       *Runtime
	children int32
}

// ModelDetails is qlft_model_details.
type ModelDetails struct {
	Architecture, QuantType, SourceFormat                                     string
	NLayers, Dim, NHeads, NKVHeads, HeadDim, FFNDim, VocabSize, ContextLength uint32
	RopeTheta, RMSNormEps                                                     float32
	TiedEmbeddings, RopeAdjacentPairs                                         bool
	NParams, WeightBytes                                                      uint64
}

// LoadModel loads a .gguf, .safetensors or Hugging Face model directory (quant.* settings).
func (r *Runtime) LoadModel(path string, config *Config) (*Model, error) {
	if r == nil || r.raw == nil {
		return nil, goError(1, "LoadModel on a closed runtime")
	}
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	m := &Model{rt: r}
	cfgRaw, err := cfgPtr(config)
	if err != nil {
		return nil, err
	}
	err = call(func() C.int32_t { return C.qlft_model_load(r.raw, cp, cfgRaw, &m.raw) })
	runtime.KeepAlive(config)
	if err != nil {
		return nil, err
	}
	atomic.AddInt32(&r.children, 1)
	runtime.SetFinalizer(m, (*Model).Close)
	return m, nil
}

// Info describes the model.
func (m *Model) Info() (ModelDetails, error) {
	var d C.qlft_model_details
	d.struct_size = C.uint32_t(unsafe.Sizeof(d))
	if err := call(func() C.int32_t { return C.qlft_model_info(m.raw, &d) }); err != nil {
		return ModelDetails{}, err
	}
	runtime.KeepAlive(m)
	return ModelDetails{
		Architecture: C.GoString(&d.architecture[0]), QuantType: C.GoString(&d.quant_type[0]),
		SourceFormat: C.GoString(&d.source_format[0]), NLayers: uint32(d.n_layers), Dim: uint32(d.dim),
		NHeads: uint32(d.n_heads), NKVHeads: uint32(d.n_kv_heads), HeadDim: uint32(d.head_dim),
		FFNDim: uint32(d.ffn_dim), VocabSize: uint32(d.vocab_size), ContextLength: uint32(d.context_length),
		RopeTheta: float32(d.rope_theta), RMSNormEps: float32(d.rms_norm_eps),
		TiedEmbeddings: d.tied_embeddings != 0, RopeAdjacentPairs: d.rope_adjacent_pairs != 0,
		NParams: uint64(d.n_params), WeightBytes: uint64(d.weight_bytes),
	}, nil
}

// Tokenize encodes text with the model's tokenizer.
func (m *Model) Tokenize(text string, addBOS, parseSpecial bool) ([]int32, error) {
	ct := C.CString(text)
	defer C.free(unsafe.Pointer(ct))
	b2i := func(b bool) C.int32_t {
		if b {
			return 1
		}
		return 0
	}
	var n C.size_t
	err := call(func() C.int32_t {
		return C.qlft_tokenize(m.raw, ct, C.size_t(len(text)), b2i(addBOS), b2i(parseSpecial), nil, 0, &n)
	})
	if err != nil && n == 0 {
		return nil, err
	}
	ids := make([]int32, int(n)+1)
	err = call(func() C.int32_t {
		return C.qlft_tokenize(m.raw, ct, C.size_t(len(text)), b2i(addBOS), b2i(parseSpecial),
			(*C.int32_t)(unsafe.Pointer(&ids[0])), C.size_t(len(ids)), &n)
	})
	runtime.KeepAlive(m)
	if err != nil {
		return nil, err
	}
	return ids[:n], nil
}

// Detokenize decodes ids to text (special tokens skipped).
func (m *Model) Detokenize(ids []int32) (string, error) {
	var p *C.int32_t
	if len(ids) > 0 {
		p = (*C.int32_t)(unsafe.Pointer(&ids[0]))
	}
	var needed C.size_t
	err := call(func() C.int32_t { return C.qlft_detokenize(m.raw, p, C.size_t(len(ids)), nil, 0, &needed) })
	if err != nil && needed == 0 {
		return "", err
	}
	buf := (*C.char)(C.malloc(needed))
	defer C.free(unsafe.Pointer(buf))
	if err := call(func() C.int32_t {
		return C.qlft_detokenize(m.raw, p, C.size_t(len(ids)), buf, needed, &needed)
	}); err != nil {
		return "", err
	}
	runtime.KeepAlive(m)
	return C.GoString(buf), nil
}

// Close frees the model; its datasets and trainers must be closed first.
func (m *Model) Close() error {
	if m == nil || m.raw == nil {
		return nil
	}
	if n := atomic.LoadInt32(&m.children); n > 0 {
		return goError(1, "model still has %d open dataset(s)/trainer(s)", n)
	}
	C.qlft_model_free(m.raw)
	m.raw = nil
	atomic.AddInt32(&m.rt.children, -1)
	runtime.SetFinalizer(m, nil)
	return nil
}

// ---- dataset ----

// Dataset is a tokenized data file.
type Dataset struct {
	raw      *C.qlft_dataset
	model    *Model
	children int32
}

// DatasetStats is qlft_dataset_stats.
type DatasetStats struct {
	Records, DroppedRecords, Tokens, TrainedTokens, TrainSequences, EvalSequences uint64
	FillRatio                                                                     float64
	HistogramBucketWidth                                                          uint32
	LengthHistogram                                                               [16]uint64
}

// LoadDataset reads and tokenizes a .txt/.json/.jsonl file with the data.* settings.
func (m *Model) LoadDataset(path string, config *Config) (*Dataset, error) {
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	d := &Dataset{model: m}
	cfgRaw, err := cfgPtr(config)
	if err != nil {
		return nil, err
	}
	err = call(func() C.int32_t { return C.qlft_dataset_load(m.raw, cp, cfgRaw, &d.raw) })
	runtime.KeepAlive(config)
	if err != nil {
		return nil, err
	}
	atomic.AddInt32(&m.children, 1)
	runtime.SetFinalizer(d, (*Dataset).Close)
	return d, nil
}

// Stats describes the dataset.
func (d *Dataset) Stats() (DatasetStats, error) {
	var s C.qlft_dataset_stats
	s.struct_size = C.uint32_t(unsafe.Sizeof(s))
	if err := call(func() C.int32_t { return C.qlft_dataset_get_stats(d.raw, &s) }); err != nil {
		return DatasetStats{}, err
	}
	runtime.KeepAlive(d)
	out := DatasetStats{Records: uint64(s.records), DroppedRecords: uint64(s.dropped_records),
		Tokens: uint64(s.tokens), TrainedTokens: uint64(s.trained_tokens),
		TrainSequences: uint64(s.train_sequences), EvalSequences: uint64(s.eval_sequences),
		FillRatio: float64(s.fill_ratio), HistogramBucketWidth: uint32(s.histogram_bucket_width)}
	for i := range out.LengthHistogram {
		out.LengthHistogram[i] = uint64(s.length_histogram[i])
	}
	return out, nil
}

// Close frees the dataset; trainers using it must be closed first.
func (d *Dataset) Close() error {
	if d == nil || d.raw == nil {
		return nil
	}
	if n := atomic.LoadInt32(&d.children); n > 0 {
		return goError(1, "dataset is still used by %d trainer(s)", n)
	}
	C.qlft_dataset_free(d.raw)
	d.raw = nil
	atomic.AddInt32(&d.model.children, -1)
	runtime.SetFinalizer(d, nil)
	return nil
}

// ---- trainer ----

// StepStats is qlft_step_stats.
type StepStats struct {
	Step, TotalSteps                            uint64
	Loss, LearningRate, GradNorm, LossScale     float32
	Skipped                                     bool
	Tokens                                      uint64
	TokensPerSecond, ElapsedSeconds, EtaSeconds float64
	MemoryReserved, MemoryPeak                  uint64
	EvalLoss                                    float32
	// Host<->device traffic of the step and its device launches (0 on backend=cpu).
	HostToDeviceBytes, DeviceToHostBytes, DeviceSyncs, DeviceLaunches uint64
	// Preference objectives: TRL's logged values (NaN on sft steps and where not logged).
	RewardsChosen, RewardsRejected, RewardsMargins, RewardsAccuracies float64
	LogpsChosen, LogpsRejected, NllLoss, Kl                           float64
}

func stepStats(s *C.qlft_step_stats) StepStats {
	return StepStats{Step: uint64(s.step), TotalSteps: uint64(s.total_steps), Loss: float32(s.loss),
		LearningRate: float32(s.learning_rate), GradNorm: float32(s.grad_norm),
		LossScale: float32(s.loss_scale), Skipped: s.skipped != 0, Tokens: uint64(s.tokens),
		TokensPerSecond: float64(s.tokens_per_second), ElapsedSeconds: float64(s.elapsed_seconds),
		EtaSeconds: float64(s.eta_seconds), MemoryReserved: uint64(s.memory_reserved),
		MemoryPeak: uint64(s.memory_peak), EvalLoss: float32(s.eval_loss),
		HostToDeviceBytes: uint64(s.host_to_device_bytes),
		DeviceToHostBytes: uint64(s.device_to_host_bytes), DeviceSyncs: uint64(s.device_syncs),
		DeviceLaunches: uint64(s.device_launches),
		RewardsChosen:  float64(s.rewards_chosen), RewardsRejected: float64(s.rewards_rejected),
		RewardsMargins: float64(s.rewards_margins), RewardsAccuracies: float64(s.rewards_accuracies),
		LogpsChosen: float64(s.logps_chosen), LogpsRejected: float64(s.logps_rejected),
		NllLoss: float64(s.nll_loss), Kl: float64(s.kl)}
}

// EvalResult is qlft_eval_result.
type EvalResult struct {
	Loss, Perplexity float64
	Tokens           uint64
}

// Trainer holds LoRA adapters and an optimizer on a model.
type Trainer struct {
	mu       sync.Mutex // serializes the trainer's calls (the ABI: one thread at a time)
	cancelMu sync.Mutex // orders Cancel against Close
	raw      *C.qlft_trainer
	model    *Model
	data     *Dataset
	// 1 while Train's progress callback runs: the trainer's own calls from it are refused
	// (they would wait for the Train that waits for them).
	inProgress  int32
	generations int32 // open Generations using the adapter
}

// lock takes the trainer for op, or refuses op from the trainer's own progress callback.
func (t *Trainer) lock(op string) error {
	if atomic.LoadInt32(&t.inProgress) != 0 {
		return goError(1, "Trainer.%s called while the trainer's progress callback runs (from "+
			"inside Train); only Cancel may be called there", op)
	}
	t.mu.Lock()
	return nil
}

// NewTrainer creates adapters (lora.*) and an optimizer (optim.*); data may be nil for a
// trainer that only evaluates, loads adapters or generates.
func (m *Model) NewTrainer(data *Dataset, config *Config) (*Trainer, error) {
	t := &Trainer{model: m, data: data}
	var draw *C.qlft_dataset
	if data != nil {
		draw = data.raw
	}
	cfgRaw, err := cfgPtr(config)
	if err != nil {
		return nil, err
	}
	err = call(func() C.int32_t { return C.qlft_trainer_create(m.raw, draw, cfgRaw, &t.raw) })
	runtime.KeepAlive(config)
	if err != nil {
		return nil, err
	}
	atomic.AddInt32(&m.children, 1)
	if data != nil {
		atomic.AddInt32(&data.children, 1)
	}
	runtime.SetFinalizer(t, (*Trainer).Close)
	return t, nil
}

// Step runs one optimizer step. When ctx is done the step stops at its next micro-batch, rolled
// back, and the error is ErrCancelled unwrapping to ctx.Err().
func (t *Trainer) Step(ctx context.Context) (StepStats, error) {
	if err := t.lock("Step"); err != nil {
		return StepStats{}, err
	}
	defer t.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return StepStats{}, &Error{Code: 7, Message: "step not started: " + err.Error(), cause: err}
	}
	var s C.qlft_step_stats
	s.struct_size = C.uint32_t(unsafe.Sizeof(s))
	stop := watch(ctx, t.Cancel)
	err := call(func() C.int32_t { return C.qlft_trainer_step(t.raw, &s) })
	return stepStats(&s), withCause(err, stop(), ctx)
}

// watch calls cancel when ctx is done before the returned stop function is called; stop
// reports whether it did.
func watch(ctx context.Context, cancel func()) (stop func() bool) {
	if ctx.Done() == nil {
		return func() bool { return false }
	}
	done := make(chan struct{})
	fired := make(chan bool, 1)
	go func() {
		select {
		case <-ctx.Done():
			cancel()
			fired <- true
		case <-done:
			fired <- false
		}
	}()
	return func() bool {
		close(done)
		return <-fired
	}
}

// withCause makes a cancellation error that the context caused unwrap to ctx.Err().
func withCause(err error, byCtx bool, ctx context.Context) error {
	if e, ok := err.(*Error); ok && e.Code == 7 && byCtx {
		e.cause = ctx.Err()
	}
	return err
}

type progressCtx struct {
	fn     func(StepStats) bool
	panicV interface{}
}

//export qlftGoProgress
func qlftGoProgress(stats *C.qlft_step_stats, handle C.uintptr_t) (ret C.int32_t) {
	p := cgo.Handle(handle).Value().(*progressCtx)
	if p.fn == nil {
		return 0
	}
	defer func() {
		if r := recover(); r != nil {
			p.panicV = r
			ret = 1 // cancel; the panic is re-raised after qlft_trainer_train returns
		}
	}()
	if p.fn(stepStats(stats)) {
		return 0
	}
	return 1
}

// runProgress runs the user's progress callback with the trainer marked as inside it.
func (t *Trainer) runProgress(fn func(StepStats) bool) func(StepStats) bool {
	if fn == nil {
		return nil
	}
	return func(s StepStats) bool {
		atomic.StoreInt32(&t.inProgress, 1)
		defer atomic.StoreInt32(&t.inProgress, 0)
		return fn(s)
	}
}

// Train steps until train.max_steps / train.epochs. progress (may be nil) runs after each step
// and returns false to stop. When ctx is done, training stops after the current step. A stop
// is an *Error with code ErrCancelled (unwrapping to ctx.Err() when the context caused it). A
// panic in progress cancels training and is re-raised here.
//
// Calling the trainer's other methods (except Cancel) from progress returns an
// ErrInvalidArgument error instead of deadlocking; so do calls from other goroutines while
// progress runs.
func (t *Trainer) Train(ctx context.Context, progress func(StepStats) bool) error {
	if err := t.lock("Train"); err != nil {
		return err
	}
	defer t.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return &Error{Code: 7, Message: "training not started: " + err.Error(), cause: err}
	}
	pc := &progressCtx{fn: t.runProgress(progress)}
	h := cgo.NewHandle(pc)
	defer h.Delete()
	stop := watch(ctx, t.Cancel)
	err := call(func() C.int32_t { return C.train_with(t.raw, C.uintptr_t(h)) })
	byCtx := stop()
	if pc.panicV != nil {
		panic(pc.panicV)
	}
	return withCause(err, byCtx, ctx)
}

// Cancel asks a running Train to stop after the current step (a running Step at its next
// micro-batch); safe from any goroutine, also from the progress callback. A Cancel while
// neither runs is discarded when the next one starts (the C ABI's rule; see the package doc).
func (t *Trainer) Cancel() {
	t.cancelMu.Lock()
	defer t.cancelMu.Unlock()
	if t.raw != nil {
		C.qlft_trainer_cancel(t.raw)
	}
}

// Evaluate runs the model with the adapter on data (nil: the training data's held-out split).
func (t *Trainer) Evaluate(data *Dataset) (EvalResult, error) {
	if err := t.lock("Evaluate"); err != nil {
		return EvalResult{}, err
	}
	defer t.mu.Unlock()
	var r C.qlft_eval_result
	r.struct_size = C.uint32_t(unsafe.Sizeof(r))
	var draw *C.qlft_dataset
	if data != nil {
		draw = data.raw
	}
	err := call(func() C.int32_t { return C.qlft_trainer_evaluate(t.raw, draw, &r) })
	runtime.KeepAlive(data)
	return EvalResult{float64(r.loss), float64(r.perplexity), uint64(r.tokens)}, err
}

func (t *Trainer) pathCall(op, path string, f func(*C.char) C.int32_t) error {
	if err := t.lock(op); err != nil {
		return err
	}
	defer t.mu.Unlock()
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	return call(func() C.int32_t { return f(cp) })
}

// SaveAdapter writes the adapter: format "peft" (directory) or "gguf" (file).
func (t *Trainer) SaveAdapter(path, format string) error {
	cf := C.CString(format)
	defer C.free(unsafe.Pointer(cf))
	return t.pathCall("SaveAdapter", path, func(p *C.char) C.int32_t { return C.qlft_trainer_save_adapter(t.raw, p, cf) })
}

// LoadAdapter loads a PEFT adapter directory.
func (t *Trainer) LoadAdapter(path string) error {
	return t.pathCall("LoadAdapter", path, func(p *C.char) C.int32_t { return C.qlft_trainer_load_adapter(t.raw, p) })
}

// SaveCheckpoint writes a resumable checkpoint.
func (t *Trainer) SaveCheckpoint(path string) error {
	return t.pathCall("SaveCheckpoint", path, func(p *C.char) C.int32_t { return C.qlft_trainer_save_checkpoint(t.raw, p) })
}

// Resume continues from a checkpoint.
func (t *Trainer) Resume(path string) error {
	return t.pathCall("Resume", path, func(p *C.char) C.int32_t { return C.qlft_trainer_resume(t.raw, p) })
}

// ExportMerged writes base + adapter: "safetensors", "gguf-f16" or "gguf-bf16".
func (t *Trainer) ExportMerged(path, format string) error {
	cf := C.CString(format)
	defer C.free(unsafe.Pointer(cf))
	return t.pathCall("ExportMerged", path, func(p *C.char) C.int32_t { return C.qlft_trainer_export_merged(t.raw, p, cf) })
}

// MemoryReport is the trainer's memory use.
func (t *Trainer) MemoryReport() (MemoryReport, error) {
	if err := t.lock("MemoryReport"); err != nil {
		return MemoryReport{}, err
	}
	defer t.mu.Unlock()
	var m C.qlft_memory_report
	m.struct_size = C.uint32_t(unsafe.Sizeof(m))
	err := call(func() C.int32_t { return C.qlft_trainer_memory_report(t.raw, &m) })
	return memoryReport(&m), err
}

// Close frees the trainer (waiting for a running Train); its Generations must be closed first.
// Later calls are no-ops.
func (t *Trainer) Close() error {
	if t == nil {
		return nil
	}
	if err := t.lock("Close"); err != nil {
		return err
	}
	defer t.mu.Unlock()
	t.cancelMu.Lock()
	defer t.cancelMu.Unlock()
	if t.raw == nil {
		return nil
	}
	if n := atomic.LoadInt32(&t.generations); n > 0 {
		return goError(1, "trainer is still used by %d generation(s)", n)
	}
	C.qlft_trainer_free(t.raw)
	t.raw = nil
	atomic.AddInt32(&t.model.children, -1)
	if t.data != nil {
		atomic.AddInt32(&t.data.children, -1)
	}
	runtime.SetFinalizer(t, nil)
	return nil
}

// ---- generation ----

type textCtx struct {
	fn     func(string) bool
	panicV interface{}
}

//export qlftGoText
func qlftGoText(text *C.char, handle C.uintptr_t) (ret C.int32_t) {
	p := cgo.Handle(handle).Value().(*textCtx)
	defer func() {
		if r := recover(); r != nil {
			p.panicV = r
			ret = 1
		}
	}()
	if p.fn(C.GoString(text)) {
		return 0
	}
	return 1
}

// Generate samples from prompt (generate.* settings), with trainer's adapter when not nil.
// onText receives complete UTF-8 pieces and returns false to stop. When ctx is done, it stops
// at the next piece with ErrCancelled unwrapping to ctx.Err(). NewGeneration streams token
// ids and the finish reason instead.
func (m *Model) Generate(ctx context.Context, trainer *Trainer, prompt string, config *Config,
	onText func(string) bool) error {
	var traw *C.qlft_trainer
	if trainer != nil {
		if err := trainer.lock("Generate"); err != nil {
			return err
		}
		defer trainer.mu.Unlock()
		traw = trainer.raw
	}
	if err := ctx.Err(); err != nil {
		return &Error{Code: 7, Message: "generation not started: " + err.Error(), cause: err}
	}
	byCtx := false
	userFn := onText
	onText = func(piece string) bool {
		if ctx.Err() != nil {
			byCtx = true
			return false
		}
		return userFn(piece)
	}
	cp := C.CString(prompt)
	defer C.free(unsafe.Pointer(cp))
	tc := &textCtx{fn: onText}
	h := cgo.NewHandle(tc)
	defer h.Delete()
	cfgRaw, err := cfgPtr(config)
	if err != nil {
		return err
	}
	err = call(func() C.int32_t { return C.generate_with(m.raw, traw, cp, cfgRaw, C.uintptr_t(h)) })
	runtime.KeepAlive(config)
	if tc.panicV != nil {
		panic(tc.panicV)
	}
	if err == nil && byCtx { // qlft_generate ends normally when the callback stops it
		err = &Error{Code: 7, Message: "generation cancelled: " + ctx.Err().Error(), cause: ctx.Err()}
	}
	return err
}
