//! Prints the result structs' layout as seen from Rust (compared with C by tests/bindings).
fn main() {
    for l in qlft::layout_lines() {
        println!("{l}");
    }
}
