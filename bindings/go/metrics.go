package qlft

// #include <stdlib.h>
// #include "qlft.h"
import "C"

import "unsafe"

// Memory categories (QLFT_MEM_*): the indexes of MemoryReport's and MetricsRecord's arrays.
const (
	MemWeights       = C.QLFT_MEM_WEIGHTS
	MemAdapter       = C.QLFT_MEM_ADAPTER
	MemGradients     = C.QLFT_MEM_GRADIENTS
	MemOptimizer     = C.QLFT_MEM_OPTIMIZER
	MemActivations   = C.QLFT_MEM_ACTIVATIONS
	MemWorkspace     = C.QLFT_MEM_WORKSPACE
	MemCommunication = C.QLFT_MEM_COMMUNICATION
	MemCategoryCount = C.QLFT_MEM_CATEGORY_COUNT
)

// MemoryCategoryName is "weights", "adapter", ... for a Mem* category.
func MemoryCategoryName(category int) string {
	return C.GoString(C.qlft_memory_category_name(C.int32_t(category)))
}

// MetricsRecord is one step of a run as qlft-finetune train logs it in <run dir>/metrics.jsonl
// (qlft_metrics_record): loss, learning rate, speed and the memory timeline. A float the record
// lacks, or logged as null (not finite), is NaN (math.IsNaN); memory per category is 0 in
// records written before it was logged. The arrays are indexed by the Mem* categories. An
// evaluation made outside a step (before training, after the last step) is a record of its own
// with only Step and EvalLoss set (Loss and LearningRate NaN, Tokens 0).
type MetricsRecord struct {
	Step            uint64
	Loss            float64
	LearningRate    float64
	GradNorm        float64
	LossScale       float64
	Skipped         bool // the step was skipped (non-finite gradients)
	Tokens          uint64
	TokensPerSecond float64
	ElapsedSeconds  float64 // since this process's run started (a resumed run restarts it)
	EvalLoss        float64 // NaN unless an evaluation ran after this step
	Margin          float64 // preference runs: chosen-minus-rejected margin; NaN otherwise
	MemoryReserved  uint64  // runtime-owned bytes after the step
	MemoryPeak      uint64  // the highest runtime-owned bytes so far
	// Reserved bytes per category after the step.
	Memory [MemCategoryCount]uint64
	// The highest reserved bytes per category so far (what Predicted predicts).
	MemoryCategoryPeak [MemCategoryCount]uint64
	// The planner's step-peak bytes per category for the run (the same in every record).
	Predicted [MemCategoryCount]uint64
	// The planner's step-peak total for the run; 0: unknown.
	PredictedTotal uint64
}

// ReadMetrics reads a run's metrics.jsonl (qlft_metrics_read): one record per logged step, in
// file order. A last line still being written is left out, so it may be called while the run
// trains; a malformed line is ErrFormat naming the file and line, an unreadable file ErrIO.
func ReadMetrics(path string) ([]MetricsRecord, error) {
	cp := C.CString(path)
	defer C.free(unsafe.Pointer(cp))
	var n C.size_t
	if err := call(func() C.int32_t { return C.qlft_metrics_read(cp, nil, 0, &n) }); err != nil {
		return nil, err
	}
	for {
		// A live run appends records between the calls: leave room for some, and when more
		// came than fit (the C call then reports the new count), read again. The records hold
		// no pointers, so C may fill a Go slice.
		capacity := n + 64
		recs := make([]C.qlft_metrics_record, int(capacity))
		recs[0].struct_size = C.uint32_t(unsafe.Sizeof(recs[0]))
		err := call(func() C.int32_t { return C.qlft_metrics_read(cp, &recs[0], capacity, &n) })
		if e, ok := err.(*Error); ok && e.Code == C.QLFT_ERR_INVALID_ARGUMENT && n > capacity {
			continue
		}
		if err != nil {
			return nil, err
		}
		out := make([]MetricsRecord, int(n))
		for i := range out {
			out[i] = metricsRecord(&recs[i])
		}
		return out, nil
	}
}

func metricsRecord(r *C.qlft_metrics_record) MetricsRecord {
	m := MetricsRecord{
		Step: uint64(r.step), Loss: float64(r.loss), LearningRate: float64(r.learning_rate),
		GradNorm: float64(r.grad_norm), LossScale: float64(r.loss_scale), Skipped: r.skipped != 0,
		Tokens: uint64(r.tokens), TokensPerSecond: float64(r.tokens_per_second),
		ElapsedSeconds: float64(r.elapsed_seconds), EvalLoss: float64(r.eval_loss),
		Margin: float64(r.margin), MemoryReserved: uint64(r.memory_reserved),
		MemoryPeak: uint64(r.memory_peak), PredictedTotal: uint64(r.predicted_total),
	}
	for c := 0; c < MemCategoryCount; c++ {
		m.Memory[c] = uint64(r.memory[c])
		m.MemoryCategoryPeak[c] = uint64(r.memory_category_peak[c])
		m.Predicted[c] = uint64(r.predicted[c])
	}
	return m
}
