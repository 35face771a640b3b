//! Streaming generation: the same text as `Model::generate`, its ids detokenized to that text,
//! a stop string, and a cancel from another thread stopping it within one token. Skips when the
//! shared model is absent (fails under QLFT_REQUIRE_SHARED=1).
use qlft::{Config, FinishReason, Model, Runtime};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

fn model_path() -> Option<PathBuf> {
    let base = std::env::var_os("QLFT_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    let p = base.join("models/stories260K.gguf");
    if p.exists() {
        return Some(p);
    }
    if std::env::var("QLFT_REQUIRE_SHARED").as_deref() == Ok("1") {
        panic!("{} is absent", p.display());
    }
    eprintln!("SKIP: {} is absent (set QLFT_SHARED_DIR)", p.display());
    None
}

fn cfg(pairs: &[(&str, &str)]) -> Config {
    let mut c = Config::from_pairs(&[("threads", "1"), ("generate.max_tokens", "40")]).unwrap();
    for (k, v) in pairs {
        c.set(k, v).unwrap();
    }
    c
}

fn generated(m: &Model<'_>, c: &Config) -> String {
    let mut t = String::new();
    m.generate(None, "Once upon a time", Some(c), |p| {
        t.push_str(p);
        true
    })
    .unwrap();
    t
}

fn streamed(m: &Model<'_>, c: &Config, stop: &[&str]) -> (Vec<i32>, String, FinishReason) {
    let (mut ids, mut text) = (Vec::new(), String::new());
    let mut g = m
        .generation(None, "Once upon a time", Some(c), stop)
        .unwrap();
    for t in &mut g {
        let t = t.unwrap();
        if let Some(id) = t.id {
            assert_eq!(t.index as usize, ids.len());
            ids.push(id);
        }
        text.push_str(&t.text);
    }
    (ids, text, g.finish_reason().unwrap())
}

#[test]
fn same_ids_as_generate_and_stop_string() {
    let path = match model_path() {
        Some(p) => p,
        None => return,
    };
    let rt = Runtime::new(None).unwrap();
    let m = rt.load_model(&path, None).unwrap();
    for c in [
        cfg(&[]),
        cfg(&[
            ("generate.temperature", "0.9"),
            ("generate.top_k", "20"),
            ("generate.seed", "7"),
        ]),
    ] {
        let want = generated(&m, &c);
        let (ids, text, finish) = streamed(&m, &c, &[]);
        assert!(!want.is_empty());
        assert_eq!(text, want);
        assert_eq!(m.detokenize(&ids).unwrap(), want);
        assert!(matches!(finish, FinishReason::Length | FinishReason::Eos));
        if finish == FinishReason::Length {
            assert_eq!(ids.len(), 40);
        }
        // Stop at a piece of the middle of the text: everything before it, nothing after.
        let stop = want.get(20..26).expect("ASCII text of 26+ bytes");
        let (sids, stext, sfinish) = streamed(&m, &c, &["\u{1}never", stop]);
        assert_eq!(sfinish, FinishReason::Stop);
        assert_eq!(stext, want[..want.find(stop).unwrap()]);
        assert_eq!(sids[..], ids[..sids.len()]);
    }
}

#[test]
fn cancel_from_another_thread_within_one_token() {
    let path = match model_path() {
        Some(p) => p,
        None => return,
    };
    let rt = Runtime::new(None).unwrap();
    let m = rt.load_model(&path, None).unwrap();
    let c = cfg(&[
        ("generate.max_tokens", "200"),
        ("generate.stop_at_eos", "false"),
    ]);
    let mut g = m
        .generation(None, "Once upon a time", Some(&c), &[])
        .unwrap();
    let canceller = g.canceller();
    let delivered = Arc::new(AtomicI64::new(0));
    let at_cancel = Arc::new(AtomicI64::new(-1));
    let (d, a) = (delivered.clone(), at_cancel.clone());
    let th = std::thread::spawn(move || {
        while d.load(Ordering::SeqCst) < 3 {
            std::thread::yield_now();
        }
        canceller.cancel();
        a.store(d.load(Ordering::SeqCst), Ordering::SeqCst);
    });
    let mut after = 0;
    let mut last = None;
    for t in &mut g {
        let t = t.unwrap();
        if t.id.is_some() {
            if at_cancel.load(Ordering::SeqCst) >= 0 {
                after += 1;
            }
            delivered.fetch_add(1, Ordering::SeqCst);
        }
        last = Some(t);
    }
    th.join().unwrap();
    let last = last.unwrap();
    assert_eq!(last.finish, Some(FinishReason::Cancelled));
    assert_eq!(last.id, None);
    assert!(after <= 1, "{after} tokens after the cancel");
    assert!(delivered.load(Ordering::SeqCst) < 200);
    // Cancelled before the first token: never discarded.
    let mut g = m
        .generation(None, "Once upon a time", Some(&c), &[])
        .unwrap();
    g.cancel();
    let t = g.next().unwrap().unwrap();
    assert_eq!((t.id, t.finish), (None, Some(FinishReason::Cancelled)));
    assert!(g.next().is_none());
}
