//! The process-wide log callback as a closure: loading a model logs an info line naming the
//! file; a panicking logger is contained; None restores the default. Its own process, since
//! the logger is global.
use qlft::{Config, Runtime};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

#[test]
fn log_closure_receives_messages() {
    let base = std::env::var_os("QLFT_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    let model_path = base.join("models/stories260K.gguf");
    if !model_path.exists() {
        eprintln!("SKIP: {} is absent", model_path.display());
        return;
    }
    let got: Arc<Mutex<Vec<(i32, String)>>> = Arc::default();
    let sink = got.clone();
    qlft::set_log_callback(
        Some(Box::new(move |level, msg| {
            sink.lock().unwrap().push((level, msg.to_string()))
        })),
        qlft::ffi::QLFT_LOG_INFO,
    );
    let cfg = Config::from_pairs(&[("quant.type", "keep")]).unwrap();
    let rt = Runtime::new(Some(&cfg)).unwrap();
    drop(rt.load_model(&model_path, Some(&cfg)).unwrap());
    let name = model_path.to_string_lossy().into_owned();
    {
        let g = got.lock().unwrap();
        assert!(g.iter().all(|(l, _)| *l <= qlft::ffi::QLFT_LOG_INFO));
        assert!(
            g.iter()
                .any(|(l, m)| *l == qlft::ffi::QLFT_LOG_INFO && m.contains(&name)),
            "{g:?}"
        );
    }
    qlft::set_log_callback(
        Some(Box::new(|_, _| panic!("logger panics"))),
        qlft::ffi::QLFT_LOG_INFO,
    );
    drop(rt.load_model(&model_path, Some(&cfg)).unwrap());
    qlft::set_log_callback(None, qlft::ffi::QLFT_LOG_WARN);
    let n = got.lock().unwrap().len();
    drop(rt.load_model(&model_path, Some(&cfg)).unwrap());
    assert_eq!(got.lock().unwrap().len(), n);
}
