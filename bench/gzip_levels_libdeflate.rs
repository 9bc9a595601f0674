use std::time::Instant;
fn main() {
    let list = std::env::args().nth(1).unwrap();
    let names = std::fs::read_to_string(list).unwrap();
    let datas: Vec<Vec<u8>> = names.lines().filter(|l| !l.trim().is_empty()).map(|n| std::fs::read(n.trim()).unwrap()).collect();
    for (part, n) in [("1k", 1024), ("16k", 16384), ("whole", usize::MAX)] {
        let mut row = Vec::new();
        let mut times = Vec::new();
        for level in 1..=12 {
            let mut c = libdeflater::Compressor::new(libdeflater::CompressionLvl::new(level).unwrap());
            let mut total = 0;
            let t = Instant::now();
            for d in &datas {
                let d = &d[..d.len().min(n)];
                let mut out = vec![0; c.deflate_compress_bound(d.len())];
                total += c.deflate_compress(d, &mut out).unwrap() + 18;
            }
            times.push(format!("{:.1}", t.elapsed().as_secs_f64() * 1000.0));
            row.push(total.to_string());
        }
        println!("{} {}", part, row.join(" "));
        println!("{} ms {}", part, times.join(" "));
    }
}
