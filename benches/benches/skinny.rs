//! `skinny_matmul` against the memory it must read: every linear weight of SmolLM2-135M
//! (30 layers of q, k, v, o, gate, up and down, and the 49152 x 576 head: 538 MB of float32,
//! far past any cache) multiplied by 1, 2, 4, 8 and 16 rows, as one verification pass does,
//! beside one plain read of the same weights (the floor). Threads: the kernel's own helpers (inside
//! Python it runs on torch's OpenMP team instead). Run with
//! `cargo bench -p recap-benches --bench skinny`.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::hint::black_box;

fn shapes() -> Vec<(usize, usize)> {
    let layer = [
        (576, 576),
        (192, 576),
        (192, 576),
        (576, 576),
        (1536, 576),
        (1536, 576),
        (576, 1536),
    ];
    let mut all: Vec<_> = (0..30).flat_map(|_| layer).collect();
    all.push((49152, 576));
    all
}

fn bench_pass(c: &mut Criterion) {
    let shapes = shapes();
    let weights: Vec<Vec<f32>> = shapes
        .iter()
        .map(|&(r, c)| {
            (0..r * c)
                .map(|i| ((i * 7919) % 1000) as f32 * 1e-4 - 0.05)
                .collect()
        })
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut g = c.benchmark_group("one pass of SmolLM2-135M's linear weights");
    g.sample_size(20);
    // The floor: every weight's bits read once (xor-folded, which vectorises), the weights
    // dealt round-robin to the threads.
    g.bench_function("read every weight once", |b| {
        b.iter(|| {
            std::thread::scope(|s| {
                let parts: Vec<_> = (0..threads)
                    .map(|t| {
                        let weights = &weights;
                        s.spawn(move || {
                            let fold = |w: &Vec<f32>| w.iter().fold(0u32, |a, v| a ^ v.to_bits());
                            weights
                                .iter()
                                .skip(t)
                                .step_by(threads)
                                .map(fold)
                                .fold(0, |a, b| a ^ b)
                        })
                    })
                    .collect();
                black_box(
                    parts
                        .into_iter()
                        .map(|p| p.join().unwrap())
                        .fold(0, |a, b| a ^ b),
                )
            })
        })
    });
    for n in [1usize, 2, 4, 8, 16] {
        let x: Vec<f32> = (0..n * 1536).map(|i| (i % 13) as f32 * 0.1).collect();
        let mut ys: Vec<Vec<f32>> = shapes.iter().map(|&(r, _)| vec![0.0; n * r]).collect();
        g.bench_with_input(BenchmarkId::new("skinny_matmul rows", n), &n, |b, &n| {
            b.iter(|| {
                for ((w, &(r, c)), y) in weights.iter().zip(&shapes).zip(ys.iter_mut()) {
                    recap_core::skinny_matmul(w, r, c, &x[..n * c], n, y, threads).unwrap();
                }
                black_box(&ys);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_pass);
criterion_main!(benches);
