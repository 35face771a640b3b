//! Prints the library version, then greedy-generates N tokens (the text, then the streamed ids
//! and finish reason): qlft-consumer MODEL PROMPT N
use std::io::Write;

fn main() -> Result<(), qlft::Error> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 4 {
        eprintln!("usage: qlft-consumer MODEL PROMPT N");
        std::process::exit(2);
    }
    println!("qlft {}", qlft::version_string());
    let cfg = qlft::Config::from_pairs(&[("threads", "1"), ("generate.max_tokens", &a[3])])?;
    let rt = qlft::Runtime::new(Some(&cfg))?;
    let model = rt.load_model(&a[1], Some(&cfg))?;
    let mut out = std::io::stdout();
    write!(out, "text: ").unwrap();
    model.generate(None, &a[2], Some(&cfg), |piece| {
        write!(out, "{piece}").unwrap();
        true
    })?;
    writeln!(out).unwrap();
    // The same generation streamed: every token's id, and why it ended.
    write!(out, "ids:").unwrap();
    let mut g = model.generation(None, &a[2], Some(&cfg), &[])?;
    for t in &mut g {
        if let Some(id) = t?.id {
            write!(out, " {id}").unwrap();
        }
    }
    let finish = format!("{:?}", g.finish_reason().unwrap()).to_lowercase();
    writeln!(out, "\nfinish: {finish}").unwrap();
    Ok(())
}
