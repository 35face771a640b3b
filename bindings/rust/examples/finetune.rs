//! The same fine-tune as examples/c/finetune.c, from Rust:
//!   cargo run --example finetune -- MODEL DATA OUT_DIR [STEPS] [THREADS]
use qlft::{Config, Runtime};

fn main() -> Result<(), qlft::Error> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 4 {
        eprintln!("usage: finetune MODEL DATA OUT_DIR [STEPS] [THREADS]");
        std::process::exit(2);
    }
    let steps = a.get(4).map_or("4", |s| s.as_str());
    let threads = a.get(5).map_or("1", |s| s.as_str());
    let cfg = Config::from_pairs(&[
        ("quant.type", "keep"),
        ("train.precision", "fp32"),
        ("lora.r", "8"),
        ("lora.alpha", "16"),
        ("optim.lr", "1e-3"),
        ("seed", "42"),
        ("data.seq_len", "32"),
        ("train.micro_batch", "2"),
        ("train.max_steps", steps),
        ("threads", threads),
    ])?;
    let rt = Runtime::new(Some(&cfg))?;
    let model = rt.load_model(&a[1], Some(&cfg))?;
    let mut data = model.load_dataset(&a[2], Some(&cfg))?;
    let mut trainer = model.trainer(Some(&mut data), Some(&cfg))?;
    trainer.train(|s| {
        println!("step {}/{}  loss {:.4}", s.step, s.total_steps, s.loss);
        true
    })?;
    trainer.save_adapter(&a[3], "peft")?;
    println!("adapter written to {}", a[3]);
    Ok(())
}
