// Command qlft-finetune is the Go twin of examples/c/finetune.c:
//
//	qlft-finetune MODEL DATA OUT_DIR [STEPS] [THREADS]
package main

import (
	"context"
	"fmt"
	"os"

	"qlft.dev/qlft"
)

func run() error {
	a := os.Args
	if len(a) < 4 {
		return fmt.Errorf("usage: qlft-finetune MODEL DATA OUT_DIR [STEPS] [THREADS]")
	}
	steps, threads := "4", "1"
	if len(a) > 4 {
		steps = a[4]
	}
	if len(a) > 5 {
		threads = a[5]
	}
	cfg, err := qlft.NewConfigFrom(map[string]string{
		"quant.type": "keep", "train.precision": "fp32", "lora.r": "8", "lora.alpha": "16",
		"optim.lr": "1e-3", "seed": "42", "data.seq_len": "32", "train.micro_batch": "2",
		"train.max_steps": steps, "threads": threads,
	})
	if err != nil {
		return err
	}
	defer cfg.Close()
	rt, err := qlft.NewRuntime(cfg)
	if err != nil {
		return err
	}
	defer rt.Close()
	model, err := rt.LoadModel(a[1], cfg)
	if err != nil {
		return err
	}
	defer model.Close()
	data, err := model.LoadDataset(a[2], cfg)
	if err != nil {
		return err
	}
	defer data.Close()
	tr, err := model.NewTrainer(data, cfg)
	if err != nil {
		return err
	}
	defer tr.Close()
	if err := tr.Train(context.Background(), func(s qlft.StepStats) bool {
		fmt.Printf("step %d/%d  loss %.4f\n", s.Step, s.TotalSteps, s.Loss)
		return true
	}); err != nil {
		return err
	}
	if err := tr.SaveAdapter(a[3], "peft"); err != nil {
		return err
	}
	fmt.Println("adapter written to", a[3])
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "qlft-finetune:", err)
		os.Exit(1)
	}
}
