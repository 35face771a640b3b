//! 1000 create/free cycles of config, runtime, model, dataset, trainer and an error keep RSS
//! flat. Its own test binary (= process), so other tests' allocations don't blur the figure.
use qlft::{Config, Runtime};
use std::path::PathBuf;

fn shared(rel: &str) -> Option<PathBuf> {
    let base = std::env::var_os("QLFT_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    let p = base.join(rel);
    if p.exists() {
        Some(p)
    } else {
        eprintln!("SKIP: {} is absent (set QLFT_SHARED_DIR)", p.display());
        None
    }
}

fn settings(steps: &str) -> Config {
    Config::from_pairs(&[
        ("quant.type", "keep"),
        ("data.seq_len", "32"),
        ("train.max_steps", steps),
        ("threads", "1"),
    ])
    .expect("valid settings")
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qlft-rs-{}-{}", name, std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn create_free_loop_keeps_rss_flat() {
    let model_path = match shared("models/stories260K.gguf") {
        Some(m) => m,
        None => return,
    };
    let dir = tmpdir("loop");
    let small = dir.join("small.txt");
    std::fs::write(
        &small,
        "Once upon a time there was a little dog.\n".repeat(20),
    )
    .unwrap();
    let cfg = settings("1");
    let cycle = || {
        let cfg2 = Config::from_pairs(&[("lora.r", "4"), ("threads", "1")]).unwrap();
        let rt = Runtime::new(Some(&cfg)).unwrap();
        let model = rt.load_model(&model_path, Some(&cfg)).unwrap();
        let mut data = model.load_dataset(&small, Some(&cfg)).unwrap();
        let t = model.trainer(Some(&mut data), Some(&cfg2)).unwrap();
        let _ = rt_err();
        drop(t);
    };
    fn rt_err() -> qlft::Error {
        Config::from_pairs(&[("lora.r", "x")]).err().unwrap()
    }
    for _ in 0..100 {
        cycle();
    }
    let before = rss_bytes();
    for _ in 0..1000 {
        cycle();
    }
    let after = rss_bytes();
    let growth = after.saturating_sub(before);
    eprintln!("rss before {before} after {after} growth {growth}");
    assert!(
        growth < 4 << 20,
        "RSS grew by {growth} bytes over 1000 cycles"
    );
    let _ = std::fs::remove_dir_all(dir);
}
