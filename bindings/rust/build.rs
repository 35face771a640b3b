//! Finds libqlft.so, in this order:
//! 1. `QLFT_LIB_DIR`: the directory holding libqlft.so (an install's lib/, or a CMake build
//!    directory);
//! 2. `pkg-config qlft` (the binary named by `PKG_CONFIG`, default `pkg-config`; an install
//!    prefix P is found with `PKG_CONFIG_PATH=P/lib/pkgconfig`, a build tree with
//!    `PKG_CONFIG_PATH=<build>/pkgconfig`).
//!
//! Nothing is found relative to this crate's sources. The crate declares `links = "qlft"`, so a
//! dependent package's build script receives `DEP_QLFT_ROOT` (the prefix), `DEP_QLFT_LIBDIR`
//! and `DEP_QLFT_INCLUDE`. Cargo passes `-Wl,-rpath` only to this crate's own tests and
//! examples; a product binary finds the library at run time through its own build script
//! (`cargo:rustc-link-arg=-Wl,-rpath,<DEP_QLFT_LIBDIR>`), or `LD_LIBRARY_PATH`, or an install
//! in a directory the dynamic loader searches (see README.md).
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Found {
    libdir: PathBuf,
    root: Option<PathBuf>,
    include: Option<PathBuf>,
    how: String,
}

fn pkg_config_var(pc: &str, var: &str) -> Result<String, String> {
    let out = Command::new(pc)
        .args(["--variable", var, "qlft"])
        .output()
        .map_err(|e| format!("cannot run `{pc}`: {e}"))?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let why = if why.is_empty() {
            format!(
                "qlft.pc is not on its search path (PKG_CONFIG_PATH={})",
                env::var("PKG_CONFIG_PATH").unwrap_or_default()
            )
        } else {
            why
        };
        return Err(format!("`{pc} --variable {var} qlft` failed: {why}"));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn normalize(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
}

fn from_pkg_config() -> Result<Found, String> {
    let pc = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let libdir = pkg_config_var(&pc, "libdir")?;
    if libdir.is_empty() {
        return Err(format!("`{pc}` gives qlft no libdir"));
    }
    let opt = |v: &str| {
        pkg_config_var(&pc, v)
            .ok()
            .filter(|s| !s.is_empty())
            .map(|s| normalize(Path::new(&s)))
    };
    Ok(Found {
        libdir: normalize(Path::new(&libdir)),
        root: opt("prefix"),
        include: opt("includedir"),
        how: format!("{pc} (qlft.pc)"),
    })
}

fn main() {
    for v in [
        "QLFT_LIB_DIR",
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    let found = match env::var_os("QLFT_LIB_DIR") {
        Some(d) => {
            let libdir = normalize(Path::new(&d));
            Found {
                root: libdir.parent().map(Path::to_path_buf),
                include: None,
                libdir,
                how: "QLFT_LIB_DIR".to_string(),
            }
        }
        None => from_pkg_config().unwrap_or_else(|e| {
            panic!(
                "libqlft not found: QLFT_LIB_DIR is not set and {e}.\n\
                 Install qlft (cmake --install <build> --prefix P) and set \
                 PKG_CONFIG_PATH=P/lib/pkgconfig, or set QLFT_LIB_DIR to the directory holding \
                 libqlft.so."
            )
        }),
    };
    if !found.libdir.join("libqlft.so").exists() {
        println!(
            "cargo:warning=libqlft.so is not in {} (from {})",
            found.libdir.display(),
            found.how
        );
    }
    println!("cargo:rustc-link-search=native={}", found.libdir.display());
    println!("cargo:rustc-link-lib=dylib=qlft");
    // This crate's own tests and examples run from the target directory (cargo rejects the
    // instruction for a target kind the package does not have).
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    for kind in ["tests", "examples"] {
        if manifest.join(kind).is_dir() {
            println!(
                "cargo:rustc-link-arg-{kind}=-Wl,-rpath,{}",
                found.libdir.display()
            );
        }
    }
    // Metadata for dependents' build scripts: DEP_QLFT_LIBDIR, DEP_QLFT_ROOT, DEP_QLFT_INCLUDE.
    println!("cargo:libdir={}", found.libdir.display());
    if let Some(r) = found.root {
        println!("cargo:root={}", r.display());
    }
    if let Some(i) = found.include {
        println!("cargo:include={}", i.display());
    }
}
