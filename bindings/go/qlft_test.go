package qlft_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"qlft.dev/qlft"
)

func shared(t *testing.T, rel string) string {
	t.Helper()
	base := os.Getenv("QLFT_SHARED_DIR")
	if base == "" {
		base = "../../../shared"
	}
	p := filepath.Join(base, rel)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("%s is absent (set QLFT_SHARED_DIR)", p)
	}
	return p
}

func settings(t *testing.T, steps string) *qlft.Config {
	t.Helper()
	cfg, err := qlft.NewConfigFrom(map[string]string{
		"quant.type": "keep", "train.precision": "fp32", "lora.r": "8", "lora.alpha": "16",
		"optim.lr": "1e-3", "seed": "42", "data.seq_len": "32", "train.micro_batch": "2",
		"train.max_steps": steps, "threads": "1",
	})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

type session struct {
	cfg   *qlft.Config
	rt    *qlft.Runtime
	model *qlft.Model
	data  *qlft.Dataset
	tr    *qlft.Trainer
}

func open(t *testing.T, steps string) *session {
	t.Helper()
	modelPath, text := shared(t, "models/stories260K.gguf"), shared(t, "data/tinyshakespeare.txt")
	s := &session{cfg: settings(t, steps)}
	var err error
	if s.rt, err = qlft.NewRuntime(s.cfg); err != nil {
		t.Fatal(err)
	}
	if s.model, err = s.rt.LoadModel(modelPath, s.cfg); err != nil {
		t.Fatal(err)
	}
	if s.data, err = s.model.LoadDataset(text, s.cfg); err != nil {
		t.Fatal(err)
	}
	if s.tr, err = s.model.NewTrainer(s.data, s.cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range []interface{ Close() error }{s.tr, s.data, s.model, s.rt, s.cfg} {
			if err := c.Close(); err != nil {
				t.Error(err)
			}
		}
	})
	return s
}

func TestTrainsAFewStepsAndSavesAnAdapter(t *testing.T) {
	s := open(t, "3")
	info, err := s.model.Info()
	if err != nil || info.Architecture != "llama" || info.VocabSize != 512 {
		t.Fatalf("info %+v, %v", info, err)
	}
	ids, err := s.model.Tokenize("Once upon a time", true, false)
	if err != nil || len(ids) < 3 {
		t.Fatalf("tokenize %v, %v", ids, err)
	}
	if txt, err := s.model.Detokenize(ids); err != nil || !strings.Contains(txt, "upon a time") {
		t.Fatalf("detokenize %q, %v", txt, err)
	}
	if st, err := s.data.Stats(); err != nil || st.TrainSequences == 0 {
		t.Fatalf("stats %+v, %v", st, err)
	}
	// Closing a model with open children is refused, not a use-after-free.
	if err := s.model.Close(); !errors.Is(err, qlft.ErrInvalidArgument) {
		t.Fatalf("model.Close with children: %v", err)
	}
	var losses []float32
	if err := s.tr.Train(context.Background(), func(st qlft.StepStats) bool {
		losses = append(losses, st.Loss)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(losses) != 3 {
		t.Fatalf("progress ran %d times", len(losses))
	}
	dir := t.TempDir()
	if err := s.tr.SaveAdapter(filepath.Join(dir, "a"), "peft"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "a", "adapter_model.safetensors")); err != nil || fi.Size() == 0 {
		t.Fatalf("adapter: %v", err)
	}
	gen, _ := qlft.NewConfigFrom(map[string]string{"generate.max_tokens": "8", "threads": "1"})
	defer gen.Close()
	var out strings.Builder
	if err := s.model.Generate(context.Background(), s.tr, "Once", gen, func(p string) bool { out.WriteString(p); return true }); err != nil {
		t.Fatal(err)
	}
}

func TestErrorsCarryCodeAndMessage(t *testing.T) {
	cfg, err := qlft.NewConfig()
	if err != nil {
		t.Fatal(err)
	}
	defer cfg.Close()
	err = cfg.Set("lora.r", "abc")
	var qe *qlft.Error
	if !errors.Is(err, qlft.ErrInvalidArgument) || !errors.As(err, &qe) || qe.Code != 1 ||
		!strings.Contains(qe.Message, "lora.r") || !strings.HasPrefix(err.Error(), "QLFT_ERR_INVALID_ARGUMENT: ") {
		t.Fatalf("bad setting: %#v", err)
	}
	if errors.Is(err, qlft.ErrIO) {
		t.Fatal("matched the wrong sentinel")
	}
	rt, err := qlft.NewRuntime(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	_, err = rt.LoadModel("/nonexistent/model.gguf", nil)
	if !errors.Is(err, qlft.ErrIO) || !errors.As(err, &qe) || !strings.Contains(qe.Message, "/nonexistent/model.gguf") {
		t.Fatalf("missing model: %#v", err)
	}
}

// The last error is thread-local: many goroutines failing at once must each see their own.
func TestLastErrorIsReadOnTheFailingThread(t *testing.T) {
	errs := make(chan error, 16)
	for i := 0; i < 16; i++ {
		go func(i int) {
			cfg, err := qlft.NewConfig()
			if err != nil {
				errs <- err
				return
			}
			defer cfg.Close()
			key := "lora.r"
			if i%2 == 1 {
				key = "lora.alpha"
			}
			for j := 0; j < 200; j++ {
				err := cfg.Set(key, "x"+strconv.Itoa(i))
				var qe *qlft.Error
				if !errors.As(err, &qe) || !strings.Contains(qe.Message, key) {
					errs <- err
					return
				}
				runtime.Gosched()
			}
			errs <- nil
		}(i)
	}
	for i := 0; i < 16; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("wrong message: %v", err)
		}
	}
}

func TestCancellation(t *testing.T) {
	s := open(t, "30")
	err := s.tr.Train(context.Background(), func(st qlft.StepStats) bool { return st.Step < 2 })
	if !errors.Is(err, qlft.ErrCancelled) {
		t.Fatalf("callback cancel: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	steps := 0
	err = s.tr.Train(ctx, func(st qlft.StepStats) bool {
		steps++
		if steps == 1 {
			cancel()
			time.Sleep(50 * time.Millisecond) // let the watcher call qlft_trainer_cancel
		}
		return true
	})
	if !errors.Is(err, qlft.ErrCancelled) || !errors.Is(err, context.Canceled) || steps > 2 {
		t.Fatalf("context cancel after %d steps: %v", steps, err)
	}
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(r.(string), "boom") {
				t.Fatalf("panic not re-raised: %v", r)
			}
		}()
		_ = s.tr.Train(context.Background(), func(qlft.StepStats) bool { panic("boom") })
	}()
	// Training goes on afterwards.
	if st, err := s.tr.Step(context.Background()); err != nil || st.Step < 4 {
		t.Fatalf("step after cancels: %+v, %v", st, err)
	}
}

func rss(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Skip("no /proc")
	}
	pages, _ := strconv.ParseInt(strings.Fields(string(b))[1], 10, 64)
	return pages * 4096
}

func TestCreateFreeLoopKeepsRSSFlat(t *testing.T) {
	modelPath := shared(t, "models/stories260K.gguf")
	small := filepath.Join(t.TempDir(), "small.txt")
	if err := os.WriteFile(small, []byte(strings.Repeat("Once upon a time there was a little dog.\n", 20)), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := settings(t, "1")
	defer cfg.Close()
	cycle := func() {
		rt, err := qlft.NewRuntime(cfg)
		if err != nil {
			t.Fatal(err)
		}
		m, err := rt.LoadModel(modelPath, cfg)
		if err != nil {
			t.Fatal(err)
		}
		d, err := m.LoadDataset(small, cfg)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := m.NewTrainer(d, cfg)
		if err != nil {
			t.Fatal(err)
		}
		_ = cfg.Set("lora.r", "bad")
		for _, c := range []interface{ Close() error }{tr, d, m, rt} {
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := 0; i < 100; i++ {
		cycle()
	}
	runtime.GC()
	before := rss(t)
	for i := 0; i < 1000; i++ {
		cycle()
	}
	runtime.GC()
	after := rss(t)
	t.Logf("rss before %d after %d", before, after)
	if after-before > 4<<20 {
		t.Fatalf("RSS grew by %d bytes over 1000 cycles", after-before)
	}
}

func TestFinalizersReleaseDroppedHandles(t *testing.T) {
	for i := 0; i < 200; i++ {
		cfg, err := qlft.NewConfig()
		if err != nil {
			t.Fatal(err)
		}
		_ = cfg.Set("lora.r", "4")
		rt, err := qlft.NewRuntime(cfg)
		if err != nil {
			t.Fatal(err)
		}
		_ = rt // dropped without Close: the finalizer frees it
	}
	runtime.GC()
	runtime.GC()
}

func TestLayoutMatchesC(t *testing.T) {
	p := os.Getenv("QLFT_LAYOUT_C_OUT")
	lines := qlft.LayoutLines()
	for _, l := range lines {
		if strings.Contains(l, ".struct_size ") && !strings.HasSuffix(l, " 0") {
			t.Fatalf("struct_size not first: %s", l)
		}
	}
	if p == "" {
		t.Skip("QLFT_LAYOUT_C_OUT not set (tests/bindings sets it)")
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(lines, "\n")+"\n", string(b); got != want {
		t.Fatalf("layout differs:\nGo:\n%s\nC:\n%s", got, want)
	}
}

func TestLogCallback(t *testing.T) {
	modelPath := shared(t, "models/stories260K.gguf")
	var mu sync.Mutex
	var msgs []string
	qlft.SetLogCallback(func(level int, m string) {
		mu.Lock()
		defer mu.Unlock()
		if level <= qlft.LogInfo {
			msgs = append(msgs, m)
		}
	}, qlft.LogInfo)
	defer qlft.SetLogCallback(nil, qlft.LogWarn)
	cfg, _ := qlft.NewConfigFrom(map[string]string{"quant.type": "keep"})
	defer cfg.Close()
	rt, err := qlft.NewRuntime(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	m, err := rt.LoadModel(modelPath, cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	mu.Lock()
	defer mu.Unlock()
	for _, s := range msgs {
		if strings.Contains(s, modelPath) {
			return
		}
	}
	t.Fatalf("no log line names %s: %q", modelPath, msgs)
}
