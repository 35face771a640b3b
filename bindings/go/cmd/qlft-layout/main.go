// Command qlft-layout prints the result structs' layout as seen from Go (cgo), for
// comparison with the C compiler's (tests/bindings/layout.c).
package main

import (
	"fmt"

	"qlft.dev/qlft"
)

func main() {
	for _, l := range qlft.LayoutLines() {
		fmt.Println(l)
	}
}
