//! `metrics_read`: every field of hand-written records (values chosen here), the errors, and
//! under ctest (bindings_rust sets QLFT_METRICS_JSONL) a real run's records compared line by
//! line with what the C API reads from the same file (tests/bindings/metrics_dump.c).
use qlft::{ffi, memory_category_name, metrics_read, ErrorKind, MetricsRecord};
use std::path::PathBuf;

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qlft-rs-{}-{}", name, std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const CATEGORIES: [&str; ffi::QLFT_MEM_CATEGORY_COUNT] = [
    "weights",
    "adapter",
    "gradients",
    "optimizer",
    "activations",
    "workspace",
    "communication",
];

fn per_category(base: u64) -> String {
    let members: Vec<String> = CATEGORIES
        .iter()
        .enumerate()
        .map(|(i, c)| format!("\"{c}\": {}", base + i as u64))
        .collect();
    format!("{{{}}}", members.join(", "))
}

#[test]
fn reads_every_field_of_handwritten_records() {
    let dir = tmpdir("metrics");
    let path = dir.join("metrics.jsonl");
    // Record 1 carries the run (the planner's prediction) and the memory timeline; record 2
    // a skipped step with null loss and gradient norm, an evaluation and a margin, and no
    // memory per category; the third line is still being written (no newline).
    let text = format!(
        "{{\"step\": 1, \"loss\": 2.5, \"lr\": 0.001, \"grad_norm\": 1.25, \"loss_scale\": 1024, \
         \"skipped\": 0, \"tokens\": 64, \"tokens_per_s\": 100.5, \"elapsed_s\": 0.25, \
         \"memory_bytes\": 1000, \"memory_peak_bytes\": 2000, \"mem\": {}, \"mem_peak\": {}, \
         \"run\": {{\"model\": \"m.gguf\", \"mem_predicted\": {}, \"mem_predicted_total\": 200}}}}\n\
         \n\
         {{\"step\": 2, \"loss\": null, \"lr\": 0.0005, \"grad_norm\": null, \"loss_scale\": 512, \
         \"skipped\": 1, \"tokens\": 32, \"tokens_per_s\": 50.25, \"elapsed_s\": 0.5, \
         \"memory_bytes\": 1500, \"memory_peak_bytes\": 2500, \"eval_loss\": 3.75, \
         \"margin\": -0.5, \"nonfinite\": true}}\n\
         {{\"step\": 3, \"loss\": 1.0",
        per_category(1),
        per_category(11),
        per_category(21)
    );
    std::fs::write(&path, text).unwrap();
    let recs = metrics_read(&path).unwrap();
    assert_eq!(recs.len(), 2, "the line still being written is left out");
    let (a, b) = (&recs[0], &recs[1]);
    assert_eq!(a.step, 1);
    assert_eq!(
        (a.loss, a.learning_rate, a.grad_norm, a.loss_scale),
        (2.5, 0.001, 1.25, 1024.0)
    );
    assert!(!a.skipped);
    assert_eq!(a.tokens, 64);
    assert_eq!((a.tokens_per_second, a.elapsed_seconds), (100.5, 0.25));
    assert_eq!((a.eval_loss, a.margin), (None, None));
    assert_eq!((a.memory_reserved, a.memory_peak), (1000, 2000));
    assert_eq!(a.memory, [1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(a.memory_category_peak, [11, 12, 13, 14, 15, 16, 17]);
    assert_eq!(a.predicted, [21, 22, 23, 24, 25, 26, 27]);
    assert_eq!(a.predicted_total, 200);

    assert_eq!(b.step, 2);
    assert!(b.loss.is_nan() && b.grad_norm.is_nan(), "null is NaN");
    assert_eq!((b.learning_rate, b.loss_scale), (0.0005, 512.0));
    assert!(b.skipped);
    assert_eq!(b.tokens, 32);
    assert_eq!((b.tokens_per_second, b.elapsed_seconds), (50.25, 0.5));
    assert_eq!((b.eval_loss, b.margin), (Some(3.75), Some(-0.5)));
    assert_eq!((b.memory_reserved, b.memory_peak), (1500, 2500));
    assert_eq!(b.memory, [0; 7], "no \"mem\": 0 per category");
    assert_eq!(b.memory_category_peak, [0; 7]);
    assert_eq!(
        b.predicted, a.predicted,
        "the run's prediction is in every record"
    );
    assert_eq!(b.predicted_total, 200);

    std::fs::write(&path, "").unwrap();
    assert!(metrics_read(&path).unwrap().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn errors_name_the_file_and_line() {
    let dir = tmpdir("metrics-err");
    let missing = dir.join("absent.jsonl");
    let e = metrics_read(&missing).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    assert!(e.message().contains("absent.jsonl"), "{e}");

    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"step\": 1}\n{\"step\": 2, \"loss\": \"high\"}\n").unwrap();
    let e = metrics_read(&bad).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Format);
    assert!(
        e.message().contains("bad.jsonl line 2") && e.message().contains("loss"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The lines tests/bindings/metrics_dump.c prints: a float as its bit pattern or "nan".
fn dump(recs: &[MetricsRecord]) -> Vec<String> {
    let mut v = vec![format!("records {}", recs.len())];
    for (i, r) in recs.iter().enumerate() {
        let f = |v: &mut Vec<String>, name: &str, x: f64| {
            v.push(if x.is_nan() {
                format!("{i}.{name} nan")
            } else {
                format!("{i}.{name} {:016x}", x.to_bits())
            })
        };
        let u = |v: &mut Vec<String>, name: &str, x: u64| v.push(format!("{i}.{name} {x}"));
        let cats = |v: &mut Vec<String>, name: &str, a: &[u64; ffi::QLFT_MEM_CATEGORY_COUNT]| {
            for (c, x) in a.iter().enumerate() {
                v.push(format!("{i}.{name}.{} {x}", memory_category_name(c as i32)));
            }
        };
        u(&mut v, "step", r.step);
        f(&mut v, "loss", r.loss);
        f(&mut v, "learning_rate", r.learning_rate);
        f(&mut v, "grad_norm", r.grad_norm);
        f(&mut v, "loss_scale", r.loss_scale);
        u(&mut v, "skipped", r.skipped as u64);
        u(&mut v, "tokens", r.tokens);
        f(&mut v, "tokens_per_second", r.tokens_per_second);
        f(&mut v, "elapsed_seconds", r.elapsed_seconds);
        f(&mut v, "eval_loss", r.eval_loss.unwrap_or(f64::NAN));
        f(&mut v, "margin", r.margin.unwrap_or(f64::NAN));
        u(&mut v, "memory_reserved", r.memory_reserved);
        u(&mut v, "memory_peak", r.memory_peak);
        cats(&mut v, "memory", &r.memory);
        cats(&mut v, "memory_category_peak", &r.memory_category_peak);
        cats(&mut v, "predicted", &r.predicted);
        u(&mut v, "predicted_total", r.predicted_total);
    }
    v
}

#[test]
fn a_real_runs_records_equal_the_c_apis() {
    let jsonl = match std::env::var_os("QLFT_METRICS_JSONL") {
        Some(p) => PathBuf::from(p),
        None => {
            eprintln!("SKIP: QLFT_METRICS_JSONL is not set (ctest bindings_rust sets it)");
            return;
        }
    };
    let c_dump = std::env::var_os("QLFT_METRICS_C_DUMP").expect("QLFT_METRICS_C_DUMP");
    let want = std::fs::read_to_string(&c_dump).expect("the C API's dump");
    let recs = metrics_read(&jsonl).unwrap();
    assert!(!recs.is_empty(), "{} holds no records", jsonl.display());
    let got = dump(&recs);
    let want: Vec<&str> = want.lines().collect();
    for (k, (g, w)) in got.iter().zip(want.iter()).enumerate() {
        assert_eq!(g, w, "line {} of {:?} differs", k + 1, c_dump);
    }
    assert_eq!(got.len(), want.len(), "line count vs {c_dump:?}");
    if let Some(out) = std::env::var_os("QLFT_METRICS_RUST_DUMP") {
        std::fs::write(out, got.join("\n") + "\n").unwrap();
    }
}
