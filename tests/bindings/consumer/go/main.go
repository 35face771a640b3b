// Command qlft-consumer prints the library version, then greedy-generates N tokens:
//
//	qlft-consumer MODEL PROMPT N
package main

import (
	"context"
	"fmt"
	"os"

	"qlft.dev/qlft"
)

func run(model, prompt, n string) error {
	cfg, err := qlft.NewConfigFrom(map[string]string{"threads": "1", "generate.max_tokens": n})
	if err != nil {
		return err
	}
	defer cfg.Close()
	rt, err := qlft.NewRuntime(cfg)
	if err != nil {
		return err
	}
	defer rt.Close()
	m, err := rt.LoadModel(model, cfg)
	if err != nil {
		return err
	}
	defer m.Close()
	fmt.Print("text: ")
	err = m.Generate(context.Background(), nil, prompt, cfg, func(piece string) bool {
		fmt.Print(piece)
		return true
	})
	fmt.Println()
	if err != nil {
		return err
	}
	// The same generation streamed: every token's id, and why it ended.
	g, err := m.NewGeneration(nil, prompt, cfg, nil)
	if err != nil {
		return err
	}
	defer g.Close()
	fmt.Print("ids:")
	for tok := range g.Tokens(context.Background()) {
		if tok.ID >= 0 {
			fmt.Print(" ", tok.ID)
		}
	}
	fmt.Printf("\nfinish: %v\n", g.Finish())
	return g.Err()
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: qlft-consumer MODEL PROMPT N")
		os.Exit(2)
	}
	fmt.Println("qlft", qlft.VersionString())
	if err := run(os.Args[1], os.Args[2], os.Args[3]); err != nil {
		fmt.Fprintln(os.Stderr, "qlft-consumer:", err)
		os.Exit(1)
	}
}
