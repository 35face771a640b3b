module example.com/qlft-consumer

go 1.19

require qlft.dev/qlft v0.1.0

// A local copy of the qlft Go package (the test writes its path here); without it the module
// is fetched from its module path.
replace qlft.dev/qlft => QLFT_GO_PATH
