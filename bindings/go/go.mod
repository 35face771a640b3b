module qlft

go 1.19
