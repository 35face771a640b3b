//! Finds libqlft.so: `QLFT_LIB_DIR` if set, else the CMake build directory `../../build`
//! (relative to this crate). The directory is also baked in as an rpath so tests and examples
//! run without LD_LIBRARY_PATH.
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=QLFT_LIB_DIR");
    let dir = match env::var_os("QLFT_LIB_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../build"),
    };
    let dir = dir.canonicalize().unwrap_or(dir);
    if !dir.join("libqlft.so").exists() {
        println!(
            "cargo:warning=libqlft.so not found in {} (set QLFT_LIB_DIR to the CMake build dir)",
            dir.display()
        );
    }
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=qlft");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
}
