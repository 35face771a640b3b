package qlft_test

// ReadMetrics: every field of hand-written records (values chosen here), the errors, and under
// ctest (bindings_go sets QLFT_METRICS_JSONL) a real run's records compared line by line with
// what the C API reads from the same file (tests/bindings/metrics_dump.c).

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"qlft.dev/qlft"
)

var categories = [qlft.MemCategoryCount]string{
	"weights", "adapter", "gradients", "optimizer", "activations", "workspace", "communication"}

func perCategory(base int) string {
	m := make([]string, len(categories))
	for i, c := range categories {
		m[i] = fmt.Sprintf("%q: %d", c, base+i)
	}
	return "{" + strings.Join(m, ", ") + "}"
}

func TestReadMetricsEveryFieldOfHandwrittenRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	// Record 1 carries the run (the planner's prediction) and the memory timeline; record 2 a
	// skipped step with null loss and gradient norm, an evaluation and a margin, and no memory
	// per category; the last line is still being written (no newline).
	text := `{"step": 1, "loss": 2.5, "lr": 0.001, "grad_norm": 1.25, "loss_scale": 1024, ` +
		`"skipped": 0, "tokens": 64, "tokens_per_s": 100.5, "elapsed_s": 0.25, ` +
		`"memory_bytes": 1000, "memory_peak_bytes": 2000, "mem": ` + perCategory(1) +
		`, "mem_peak": ` + perCategory(11) + `, "run": {"model": "m.gguf", "mem_predicted": ` +
		perCategory(21) + `, "mem_predicted_total": 200}}` + "\n\n" +
		`{"step": 2, "loss": null, "lr": 0.0005, "grad_norm": null, "loss_scale": 512, ` +
		`"skipped": 1, "tokens": 32, "tokens_per_s": 50.25, "elapsed_s": 0.5, ` +
		`"memory_bytes": 1500, "memory_peak_bytes": 2500, "eval_loss": 3.75, "margin": -0.5, ` +
		`"nonfinite": true}` + "\n" + `{"step": 3, "loss": 1.0`
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	recs, err := qlft.ReadMetrics(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2 (the line still being written is left out)", len(recs))
	}
	a, b := recs[0], recs[1]
	nan := math.NaN()
	wantA := qlft.MetricsRecord{Step: 1, Loss: 2.5, LearningRate: 0.001, GradNorm: 1.25,
		LossScale: 1024, Tokens: 64, TokensPerSecond: 100.5, ElapsedSeconds: 0.25, EvalLoss: nan,
		Margin: nan, MemoryReserved: 1000, MemoryPeak: 2000,
		Memory:             [qlft.MemCategoryCount]uint64{1, 2, 3, 4, 5, 6, 7},
		MemoryCategoryPeak: [qlft.MemCategoryCount]uint64{11, 12, 13, 14, 15, 16, 17},
		Predicted:          [qlft.MemCategoryCount]uint64{21, 22, 23, 24, 25, 26, 27},
		PredictedTotal:     200}
	// Record 2 has no "mem": 0 per category; the run's prediction is in every record.
	wantB := qlft.MetricsRecord{Step: 2, Loss: nan, LearningRate: 0.0005, GradNorm: nan,
		LossScale: 512, Skipped: true, Tokens: 32, TokensPerSecond: 50.25, ElapsedSeconds: 0.5,
		EvalLoss: 3.75, Margin: -0.5, MemoryReserved: 1500, MemoryPeak: 2500,
		Predicted: wantA.Predicted, PredictedTotal: 200}
	for i, p := range [][2]qlft.MetricsRecord{{a, wantA}, {b, wantB}} {
		if g, w := strings.Join(dumpRecord(0, p[0]), "\n"), strings.Join(dumpRecord(0, p[1]), "\n"); g != w {
			t.Errorf("record %d:\n%+v\nwant\n%+v", i+1, p[0], p[1])
		}
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if recs, err := qlft.ReadMetrics(path); err != nil || len(recs) != 0 {
		t.Fatalf("empty file: %v, %v", recs, err)
	}
}

func TestReadMetricsErrorsNameTheFileAndLine(t *testing.T) {
	dir := t.TempDir()
	_, err := qlft.ReadMetrics(filepath.Join(dir, "absent.jsonl"))
	if !errors.Is(err, qlft.ErrIO) || !strings.Contains(err.Error(), "absent.jsonl") {
		t.Fatalf("missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(bad, []byte("{\"step\": 1}\n{\"step\": 2, \"loss\": \"high\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = qlft.ReadMetrics(bad)
	if !errors.Is(err, qlft.ErrFormat) || !strings.Contains(err.Error(), "bad.jsonl line 2") ||
		!strings.Contains(err.Error(), "loss") {
		t.Fatalf("malformed line: %v", err)
	}
}

// dumpRecord gives the lines tests/bindings/metrics_dump.c prints for record i: a float as its
// bit pattern or "nan".
func dumpRecord(i int, r qlft.MetricsRecord) []string {
	var v []string
	f := func(name string, x float64) {
		if math.IsNaN(x) {
			v = append(v, fmt.Sprintf("%d.%s nan", i, name))
		} else {
			v = append(v, fmt.Sprintf("%d.%s %016x", i, name, math.Float64bits(x)))
		}
	}
	u := func(name string, x uint64) { v = append(v, fmt.Sprintf("%d.%s %d", i, name, x)) }
	cats := func(name string, a [qlft.MemCategoryCount]uint64) {
		for c, x := range a {
			v = append(v, fmt.Sprintf("%d.%s.%s %d", i, name, qlft.MemoryCategoryName(c), x))
		}
	}
	skipped := uint64(0)
	if r.Skipped {
		skipped = 1
	}
	u("step", r.Step)
	f("loss", r.Loss)
	f("learning_rate", r.LearningRate)
	f("grad_norm", r.GradNorm)
	f("loss_scale", r.LossScale)
	u("skipped", skipped)
	u("tokens", r.Tokens)
	f("tokens_per_second", r.TokensPerSecond)
	f("elapsed_seconds", r.ElapsedSeconds)
	f("eval_loss", r.EvalLoss)
	f("margin", r.Margin)
	u("memory_reserved", r.MemoryReserved)
	u("memory_peak", r.MemoryPeak)
	cats("memory", r.Memory)
	cats("memory_category_peak", r.MemoryCategoryPeak)
	cats("predicted", r.Predicted)
	u("predicted_total", r.PredictedTotal)
	return v
}

func TestReadMetricsOfARealRunEqualsTheCAPIs(t *testing.T) {
	jsonl := os.Getenv("QLFT_METRICS_JSONL")
	if jsonl == "" {
		t.Skip("QLFT_METRICS_JSONL is not set (ctest bindings_go sets it)")
	}
	cDump := os.Getenv("QLFT_METRICS_C_DUMP")
	want, err := os.ReadFile(cDump)
	if err != nil {
		t.Fatalf("the C API's dump (QLFT_METRICS_C_DUMP): %v", err)
	}
	recs, err := qlft.ReadMetrics(jsonl)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) == 0 {
		t.Fatalf("%s holds no records", jsonl)
	}
	got := []string{fmt.Sprintf("records %d", len(recs))}
	for i, r := range recs {
		got = append(got, dumpRecord(i, r)...)
	}
	wantLines := strings.Split(strings.TrimSuffix(string(want), "\n"), "\n")
	for k := 0; k < len(got) && k < len(wantLines); k++ {
		if got[k] != wantLines[k] {
			t.Fatalf("line %d of %s differs: Go %q, C %q", k+1, cDump, got[k], wantLines[k])
		}
	}
	if len(got) != len(wantLines) {
		t.Fatalf("%d lines, the C API's %d (%s)", len(got), len(wantLines), cDump)
	}
	if out := os.Getenv("QLFT_METRICS_GO_DUMP"); out != "" {
		if err := os.WriteFile(out, []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
