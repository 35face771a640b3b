package qlft_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"qlft.dev/qlft"
)

const prompt = "Once upon a time"

func genModel(t *testing.T) (*qlft.Model, func()) {
	t.Helper()
	path := shared(t, "models/stories260K.gguf")
	rt, err := qlft.NewRuntime(nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := rt.LoadModel(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m, func() { m.Close(); rt.Close() }
}

func genConfig(t *testing.T, kv map[string]string) *qlft.Config {
	t.Helper()
	all := map[string]string{"threads": "1", "generate.max_tokens": "40"}
	for k, v := range kv {
		all[k] = v
	}
	c, err := qlft.NewConfigFrom(all)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type streamed struct {
	ids    []int32
	text   string
	finish qlft.FinishReason
}

func stream(t *testing.T, m *qlft.Model, c *qlft.Config, stop []string) streamed {
	t.Helper()
	g, err := m.NewGeneration(nil, prompt, c, stop)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var r streamed
	for r.finish == qlft.FinishNone {
		tok, err := g.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if tok.ID >= 0 {
			if int(tok.Index) != len(r.ids) {
				t.Fatalf("index %d after %d tokens", tok.Index, len(r.ids))
			}
			r.ids = append(r.ids, tok.ID)
		}
		r.text += tok.Text
		r.finish = tok.Finish
	}
	return r
}

// Streaming gives qlft_generate's text, its ids detokenize to that text, and a stop string ends
// it just before the string.
func TestGenerationSameIdsAsGenerate(t *testing.T) {
	m, done := genModel(t)
	defer done()
	for _, kv := range []map[string]string{nil,
		{"generate.temperature": "0.9", "generate.top_k": "20", "generate.seed": "7"}} {
		c := genConfig(t, kv)
		var want strings.Builder
		if err := m.Generate(context.Background(), nil, prompt, c, func(p string) bool {
			want.WriteString(p)
			return true
		}); err != nil {
			t.Fatal(err)
		}
		r := stream(t, m, c, nil)
		if r.text != want.String() || want.Len() < 26 {
			t.Fatalf("streamed %q, generated %q", r.text, want.String())
		}
		if d, err := m.Detokenize(r.ids); err != nil || d != r.text {
			t.Fatalf("ids detokenize to %q (%v), want %q", d, err, r.text)
		}
		if r.finish != qlft.FinishLength && r.finish != qlft.FinishEOS {
			t.Fatalf("finish %v", r.finish)
		}
		stop := r.text[20:26]
		s := stream(t, m, c, []string{"\x01never", stop})
		if s.finish != qlft.FinishStop || s.text != r.text[:strings.Index(r.text, stop)] {
			t.Fatalf("stop %q: %v %q", stop, s.finish, s.text)
		}
		// The channel form gives the same tokens.
		g, err := m.NewGeneration(nil, prompt, c, nil)
		if err != nil {
			t.Fatal(err)
		}
		var ids []int32
		for tok := range g.Tokens(context.Background()) {
			if tok.ID >= 0 {
				ids = append(ids, tok.ID)
			}
		}
		if g.Err() != nil || len(ids) != len(r.ids) || g.Finish() != r.finish {
			t.Fatalf("channel: %d ids, %v, %v", len(ids), g.Err(), g.Finish())
		}
		for i := range ids {
			if ids[i] != r.ids[i] {
				t.Fatalf("channel id %d: %d != %d", i, ids[i], r.ids[i])
			}
		}
		g.Close()
	}
}

// A context cancelled from another goroutine, and Cancel from another goroutine, stop the
// stream within one token.
func TestGenerationCancelWithinOneToken(t *testing.T) {
	m, done := genModel(t)
	defer done()
	c := genConfig(t, map[string]string{"generate.max_tokens": "200", "generate.stop_at_eos": "false"})
	for _, useCtx := range []bool{true, false} {
		g, err := m.NewGeneration(nil, prompt, c, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var delivered, atCancel int64 = 0, -1
		finished := make(chan struct{})
		go func() {
			defer close(finished)
			for atomic.LoadInt64(&delivered) < 3 {
				runtime.Gosched()
			}
			if useCtx {
				cancel()
			} else {
				g.Cancel()
			}
			atomic.StoreInt64(&atCancel, atomic.LoadInt64(&delivered))
		}()
		after := 0
		var tok qlft.Token
		for tok.Finish == qlft.FinishNone {
			tok, err = g.Next(ctx)
			if tok.ID >= 0 {
				if atomic.LoadInt64(&atCancel) >= 0 {
					after++
				}
				atomic.AddInt64(&delivered, 1)
			}
		}
		<-finished
		cancel()
		if tok.Finish != qlft.FinishCancelled || tok.ID != -1 || after > 1 {
			t.Fatalf("ctx=%v: finish %v id %d, %d tokens after the cancel", useCtx, tok.Finish, tok.ID, after)
		}
		if useCtx && (!errors.Is(err, qlft.ErrCancelled) || !errors.Is(err, context.Canceled)) {
			t.Fatalf("context cancel error: %v", err)
		}
		if !useCtx && err != nil {
			t.Fatalf("Cancel: %v", err)
		}
		g.Close()
	}
}

// The trainer's own calls from its progress callback are refused with a clear error (they
// used to deadlock); Cancel is allowed there.
func TestTrainerCallsFromProgressCallbackAreRefused(t *testing.T) {
	s := open(t, "3")
	var stepErr, saveErr error
	err := s.tr.Train(context.Background(), func(st qlft.StepStats) bool {
		_, stepErr = s.tr.Step(context.Background())
		saveErr = s.tr.SaveAdapter(t.TempDir(), "peft")
		s.tr.Cancel()
		return true
	})
	if !errors.Is(err, qlft.ErrCancelled) {
		t.Fatalf("Cancel from the callback: %v", err)
	}
	for _, e := range []error{stepErr, saveErr} {
		if !errors.Is(e, qlft.ErrInvalidArgument) || !strings.Contains(e.Error(), "progress callback") {
			t.Fatalf("re-entrant call: %v", e)
		}
	}
}

func TestClosedConfigIsAnError(t *testing.T) {
	c, err := qlft.NewConfig()
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if rt, err := qlft.NewRuntime(c); err == nil || !strings.Contains(err.Error(), "closed") {
		rt.Close()
		t.Fatalf("a closed config gave %v", err)
	}
}
