module qlft.dev/qlft

go 1.19
