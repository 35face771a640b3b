// The product's own build script gives its binary a RUNPATH to the libqlft.so the qlft crate
// linked (DEP_QLFT_LIBDIR comes from the crate's `links = "qlft"` metadata), so it runs
// without LD_LIBRARY_PATH. Skip this when libqlft is installed where the loader looks anyway.
fn main() {
    if let Ok(dir) = std::env::var("DEP_QLFT_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
