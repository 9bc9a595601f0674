//! Per-request brotli cost: the pure-Rust `brotli` crate (tern until
//! session 14) against Google's C encoder through `brotlic` (tern now),
//! fed as tern's body filter feeds it (32 KiB slices, output drained after
//! each), the window shrunk to the body as ngx_brotli does. Build it as
//! its own crate (a scratch Cargo.toml with `brotli = "9.1.1"` and
//! `brotlic = "0.8.2"`, this file as src/main.rs); the pages are
//! bench/gzip_small.py's `html_text(1024 | 16384 | 262144)` written to
//! DIR/1k.html, 16k.html, 256k.html.
//!   brbench time DIR ROUNDS          -> min µs per call and sizes, both encoders interleaved
//!   brbench one IMPL FILE Q ITERS    -> one encoder in a loop, for callgrind (IMPL rust|c):
//!     valgrind --tool=callgrind brbench one c DIR/16k.html 4 40   (Ir / ITERS per call)
use std::io::Write;
use std::time::Instant;

fn window_for(n: usize, max_bits: u32) -> u32 {
    let mut w = 10;
    while w < max_bits && n > (1usize << w) {
        w += 1;
    }
    w
}

fn rust(q: u32, data: &[u8]) -> Vec<u8> {
    let mut w = brotli::CompressorWriter::new(Vec::new(), 16 * 1024, q, window_for(data.len(), 19));
    let mut out = Vec::new();
    for c in data.chunks(32 * 1024) {
        w.write_all(c).unwrap();
        out.append(w.get_mut());
    }
    out.extend_from_slice(&w.into_inner());
    out
}

fn c(q: u32, data: &[u8]) -> Vec<u8> {
    let mut e = brotlic::BrotliEncoderOptions::new()
        .quality(brotlic::Quality::new(q as u8).unwrap())
        .window_size(brotlic::WindowSize::new(window_for(data.len(), 19) as u8).unwrap())
        .build()
        .unwrap();
    let mut out = Vec::new();
    let chunks: Vec<&[u8]> = data.chunks(32 * 1024).collect();
    for (i, ch) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        let mut input: &[u8] = ch;
        loop {
            let op = if last { brotlic::encode::BrotliOperation::Finish } else { brotlic::encode::BrotliOperation::Process };
            let n = e.give_input(input, op).unwrap();
            input = &input[n..];
            while let Some(o) = unsafe { e.take_output() } {
                out.extend_from_slice(o);
            }
            if input.is_empty() && (!last || e.is_finished()) {
                break;
            }
        }
    }
    out
}

fn check(data: &[u8], enc: &[u8]) {
    let mut back = Vec::new();
    brotli::BrotliDecompress(&mut &enc[..], &mut back).unwrap();
    assert_eq!(back, data);
    let mut buf = vec![0u8; data.len() + 16];
    let n = brotlic::decompress(enc, &mut buf).unwrap();
    assert_eq!(&buf[..n], data);
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    match a[1].as_str() {
        "one" => {
            let data = std::fs::read(&a[3]).unwrap();
            let q: u32 = a[4].parse().unwrap();
            let iters: usize = a[5].parse().unwrap();
            let mut t = 0;
            for _ in 0..iters {
                t += if a[2] == "rust" { rust(q, &data).len() } else { c(q, &data).len() };
            }
            println!("{}", t / iters);
        }
        _ => {
            let rounds: usize = a[3].parse().unwrap();
            for name in ["1k", "16k", "256k"] {
                let data = std::fs::read(format!("{}/{}.html", a[2], name)).unwrap();
                let iters = (2_000_000 / data.len()).clamp(20, 2000);
                for q in [1u32, 4, 5, 6] {
                    let (r, cc) = (rust(q, &data), c(q, &data));
                    check(&data, &r);
                    check(&data, &cc);
                    let mut best = [f64::MAX; 2];
                    for _ in 0..rounds {
                        for (k, f) in [rust as fn(u32, &[u8]) -> Vec<u8>, c].iter().enumerate() {
                            let t = Instant::now();
                            for _ in 0..iters {
                                std::hint::black_box(f(q, std::hint::black_box(&data)));
                            }
                            best[k] = best[k].min(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
                        }
                    }
                    println!(
                        "{:>5} q{} rust {:8.1} us {:7} B | c {:8.1} us {:7} B | rust/c time {:.2}",
                        name, q, best[0], r.len(), best[1], cc.len(), best[0] / best[1]
                    );
                }
            }
        }
    }
}
