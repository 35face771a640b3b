/* libqlft.so is linked from the qlft_core archive; CMake needs one source of its own. */
typedef int qlft_export_anchor_unused;
