package qlft

/*
#include <stdlib.h>
#include "qlft.h"
*/
import "C"

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// FinishReason says why a generation ended (FinishNone while it goes on).
type FinishReason int

// The finish reasons (QLFT_FINISH_*).
const (
	FinishNone      FinishReason = 0
	FinishEOS       FinishReason = 1 // the end-of-sequence token (generate.stop_at_eos)
	FinishLength    FinishReason = 2 // generate.max_tokens, or the model's context is full
	FinishStop      FinishReason = 3 // a stop string (not delivered)
	FinishCancelled FinishReason = 4 // Cancel, or the context of Next / Tokens
)

func (f FinishReason) String() string {
	switch f {
	case FinishNone:
		return "none"
	case FinishEOS:
		return "eos"
	case FinishLength:
		return "length"
	case FinishStop:
		return "stop"
	case FinishCancelled:
		return "cancelled"
	}
	return "unknown"
}

// Token is one event of a Generation.
type Token struct {
	ID     int32  // the sampled id; -1 on the event that ends a cancelled generation
	Index  uint32 // 0 for the first generated token
	Text   string // the text that became final with this token (often "": held back)
	Finish FinishReason
}

// Generation is a streaming generation: Next returns one token at a time, Tokens sends them on
// a channel. The same ids as Generate for the same settings. A Generation is in progress from
// NewGeneration to its last token, so a cancel (Cancel, or a done context) is never discarded:
// it ends the generation with FinishCancelled, at most one token after the cancel. Next and
// Close are serialized; Cancel may be called from any goroutine.
type Generation struct {
	mu       sync.Mutex
	cancelMu sync.Mutex // orders Cancel against Close
	raw      *C.qlft_generation
	model    *Model
	trainer  *Trainer
	finish   FinishReason
	err      error // why Tokens' channel closed early
}

// NewGeneration starts a generation from prompt (generate.* settings), with trainer's adapter
// when not nil; it ends at the first of the stop strings. Nothing is computed before the first
// Next. The model and trainer cannot be closed while it is open.
func (m *Model) NewGeneration(trainer *Trainer, prompt string, config *Config,
	stop []string) (*Generation, error) {
	cfgRaw, err := cfgPtr(config)
	if err != nil {
		return nil, err
	}
	var traw *C.qlft_trainer
	if trainer != nil {
		if err := trainer.lock("NewGeneration"); err != nil {
			return nil, err
		}
		defer trainer.mu.Unlock()
		traw = trainer.raw
	}
	cp := C.CString(prompt)
	defer C.free(unsafe.Pointer(cp))
	var stops **C.char
	if len(stop) > 0 {
		arr := (*[1 << 20]*C.char)(C.malloc(C.size_t(len(stop)) * C.size_t(unsafe.Sizeof(cp))))
		for i, s := range stop {
			arr[i] = C.CString(s)
			defer C.free(unsafe.Pointer(arr[i]))
		}
		defer C.free(unsafe.Pointer(arr))
		stops = &arr[0]
	}
	g := &Generation{model: m, trainer: trainer}
	err = call(func() C.int32_t {
		return C.qlft_generation_create(m.raw, traw, cp, cfgRaw, stops, C.size_t(len(stop)), &g.raw)
	})
	runtime.KeepAlive(config)
	if err != nil {
		return nil, err
	}
	atomic.AddInt32(&m.children, 1)
	if trainer != nil {
		atomic.AddInt32(&trainer.generations, 1)
	}
	runtime.SetFinalizer(g, (*Generation).Close)
	return g, nil
}

// Next computes the next token. The token whose Finish is set is the last (later calls return
// it again with ID -1 and no text). When ctx is done the generation is cancelled: the token
// comes back with FinishCancelled and an ErrCancelled error that unwraps to ctx.Err().
func (g *Generation) Next(ctx context.Context) (Token, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.raw == nil {
		return Token{ID: -1}, goError(1, "Next on a closed Generation")
	}
	if g.trainer != nil { // the adapter must not change under a token
		if err := g.trainer.lock("Generation.Next"); err != nil {
			return Token{ID: -1}, err
		}
		defer g.trainer.mu.Unlock()
	}
	if ctx.Err() != nil {
		g.Cancel()
	}
	var t C.qlft_generated_token
	t.struct_size = C.uint32_t(unsafe.Sizeof(t))
	stop := watch(ctx, g.Cancel)
	err := call(func() C.int32_t { return C.qlft_generation_next(g.raw, &t) })
	byCtx := stop() || ctx.Err() != nil
	if err != nil {
		return Token{ID: -1}, err
	}
	tok := Token{ID: int32(t.id), Index: uint32(t.index), Finish: FinishReason(t.finish_reason),
		Text: C.GoStringN(t.text, C.int(t.text_len))}
	g.finish = tok.Finish
	if tok.Finish == FinishCancelled && byCtx {
		return tok, &Error{Code: 7, Message: "generation cancelled: " + ctx.Err().Error(),
			cause: ctx.Err()}
	}
	return tok, nil
}

// Tokens sends the remaining tokens on a channel that is closed after the last one (or after
// an error, which Err then returns). Cancel ctx (or call Cancel) to stop early; a reader that
// stops reading must do one of them so the sending goroutine ends.
func (g *Generation) Tokens(ctx context.Context) <-chan Token {
	ch := make(chan Token)
	go func() {
		defer close(ch)
		for {
			tok, err := g.Next(ctx)
			if err != nil && tok.Finish == FinishNone {
				g.setErr(err)
				return
			}
			select {
			case ch <- tok:
			case <-ctx.Done():
				g.Cancel()
				g.setErr(&Error{Code: 7, Message: "generation cancelled: " + ctx.Err().Error(),
					cause: ctx.Err()})
				return
			}
			if err != nil || tok.Finish != FinishNone {
				g.setErr(err)
				return
			}
		}
	}()
	return ch
}

func (g *Generation) setErr(err error) {
	g.cancelMu.Lock()
	g.err = err
	g.cancelMu.Unlock()
}

// Err is why the channel of Tokens closed: nil after the last token, else the error.
func (g *Generation) Err() error {
	g.cancelMu.Lock()
	defer g.cancelMu.Unlock()
	return g.err
}

// Finish is the finish reason of the last token returned (FinishNone while it goes on).
func (g *Generation) Finish() FinishReason {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.finish
}

// Cancel ends the generation (see the type's doc); safe from any goroutine.
func (g *Generation) Cancel() {
	g.cancelMu.Lock()
	defer g.cancelMu.Unlock()
	if g.raw != nil {
		C.qlft_generation_cancel(g.raw)
	}
}

// Close frees the generation (waiting for a running Next); later calls are no-ops.
func (g *Generation) Close() error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cancelMu.Lock()
	defer g.cancelMu.Unlock()
	if g.raw == nil {
		return nil
	}
	C.qlft_generation_free(g.raw)
	g.raw = nil
	atomic.AddInt32(&g.model.children, -1)
	if g.trainer != nil {
		atomic.AddInt32(&g.trainer.generations, -1)
	}
	runtime.SetFinalizer(g, nil)
	return nil
}
